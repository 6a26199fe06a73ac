"""Training that is right at scale, proved on CPU (issue 23): every collective of the loop on the training
device, a process group of one that runs the real collectives, one batch vocabulary for every training
command, and losses over tokens normalised by the whole global batch however it is split."""

from __future__ import annotations

import gc
import re
import socket
import weakref

import pytest
import torch
import torch.distributed as dist
from torch import nn
from toy_training import toy_data, toy_loss, toy_model

from bertkit.errors import BertkitError
from bertkit.settings import FinetuneSettings, TrainConfig
from bertkit.train import Hooks, fit, loop, setup_distributed, teardown_distributed, wrap_model
from bertkit.train.batches import StepBatch
from bertkit.train.distributed import DistributedContext, all_reduce_sum

META = torch.device("meta")  # a device that is not the CPU, on a machine without a GPU


# --- 1. every collective on the training device -------------------------------------------------------------

def test_the_step_statistics_are_reduced_on_the_training_device(monkeypatch):
    """Under NCCL a CPU tensor fails ("No backend type associated with device type cpu"): the per-step
    vector must be built where the model trains. `meta` stands in for the GPU this machine lacks."""
    seen = []

    def record(tensor, ctx):
        seen.append(tensor.device)
        return torch.zeros(tensor.shape, dtype=tensor.dtype)  # what the host reads back

    monkeypatch.setattr(loop, "all_reduce_sum", record)
    ctx = DistributedContext(world_size=2, device=META)
    loss = torch.zeros((), dtype=torch.float64, device=META)
    loop._reduce(loss, {"mlm_accuracy": torch.zeros((), device=META), "plain": 0.5}, 7, False, 1.0, ctx)
    assert seen == [META]


def test_the_global_counts_of_an_objective_are_reduced_on_the_training_device(monkeypatch):
    seen = []
    monkeypatch.setattr(loop, "all_reduce_sum", lambda tensor, ctx: seen.append(tensor.device) or tensor)
    step = StepBatch([_token_batch([3, 1])], [2], 4)  # the host batch, as the DataLoader gives it
    totals = loop._global_counts(TokenObjective(), step, META, DistributedContext(world_size=2, device=META))
    assert seen == [META] and totals["tokens"].device == META


def test_a_collective_refuses_a_tensor_off_the_training_device():
    with pytest.raises(ValueError, match="trains on meta"):
        all_reduce_sum(torch.zeros(3), DistributedContext(world_size=2, device=META))


def _torchrun_environment_of_one(monkeypatch) -> None:
    """The variables torchrun --nproc-per-node 1 sets, on a free port."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    for name, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(name, value)


def test_a_group_of_one_runs_the_loops_real_collectives(tmp_path, monkeypatch):
    """torchrun --nproc-per-node 1 (and the GPU check's one-rank NCCL group) joins a process group, so the
    loop's reductions, gathers and barriers run for real, each tensor on the training device."""
    _torchrun_environment_of_one(monkeypatch)
    devices = []
    real_all_reduce = dist.all_reduce
    monkeypatch.setattr(dist, "all_reduce", lambda tensor, *a, **k: devices.append(tensor.device)
                        or real_all_reduce(tensor, *a, **k))
    ctx = setup_distributed("cpu")
    try:
        assert ctx.in_group and ctx.distributed and dist.get_world_size() == 1
        config = TrainConfig(max_steps=3, micro_batch_size=2, gradient_accumulation_steps=2, learning_rate=1e-2,
                             precision="fp32", save_every=2)
        result = fit(wrap_model(toy_model(dropout=0.0), ctx), toy_loss, toy_data(12), config, tmp_path, ctx=ctx,
                     hooks=Hooks(evaluate=lambda model: {"zero": 0.0}))
    finally:
        teardown_distributed()
    assert result.step == 3 and result.checkpoint is not None
    assert len(devices) >= 3 and set(devices) == {ctx.device}  # one reduction per step at least


# --- 4. one batch vocabulary ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("given", "world_size", "plan"), [
    ({}, 1, (32, 32, 1)),
    ({}, 4, (32, 8, 1)),
    ({"global_batch_size": 256, "micro_batch_size": 32}, 1, (256, 32, 8)),
    ({"global_batch_size": 256, "micro_batch_size": 32}, 8, (256, 32, 1)),
    ({"global_batch_size": 64, "gradient_accumulation_steps": 4}, 2, (64, 8, 4)),
    ({"micro_batch_size": 16, "gradient_accumulation_steps": 2}, 4, (128, 16, 2)),
    ({"micro_batch_size": 16}, 1, (16, 16, 1)),
    ({"global_batch_size": 256, "micro_batch_size": 32, "gradient_accumulation_steps": 4}, 2, (256, 32, 4)),
    ({"batch_size": 24}, 1, (24, 24, 1)),
])
def test_the_batch_plan_is_global_equals_micro_times_accumulation_times_processes(given, world_size, plan):
    for settings in (TrainConfig(max_steps=1, **given), FinetuneSettings.of(model="m", output="o", **given).train):
        assert settings.batch_plan(world_size) == plan


@pytest.mark.parametrize(("given", "world_size", "message"), [
    ({"batch_size": 32}, 2, "--batch-size 32 is ambiguous with 2 process"),
    ({"batch_size": 32, "gradient_accumulation_steps": 2}, 1, "give --global-batch-size .* or --micro-batch-size"),
    ({"batch_size": 32, "micro_batch_size": 8}, 1, "older spelling"),
    ({"global_batch_size": 30}, 4, "does not split evenly into 4 process"),
    ({"global_batch_size": 64, "micro_batch_size": 48}, 1, "not a multiple of --micro-batch-size 48"),
    ({"global_batch_size": 8, "micro_batch_size": 8}, 2, "not a multiple"),
    ({"global_batch_size": 64, "micro_batch_size": 8, "gradient_accumulation_steps": 4}, 1, "contradicts"),
])
def test_batch_sizes_that_cannot_hold_together_name_the_flags(given, world_size, message):
    with pytest.raises(BertkitError, match=message):
        TrainConfig(max_steps=1, **given).batch_plan(world_size)


def test_pretrain_and_finetune_share_the_batch_flags_and_their_help():
    from click.testing import CliRunner

    from bertkit.cli import cli

    def batch_help(*command: str) -> list[str]:
        text = CliRunner().invoke(cli, [*command, "--help"], terminal_width=200).output
        option = re.compile(r"^(--(?:global-batch-size|micro-batch-size|gradient-accumulation-steps|batch-size)) "
                            r"INTEGER")  # an option's own line, not help text that mentions it
        return [m.group(1) for m in (option.match(line.strip()) for line in text.splitlines()) if m]

    pretrain = batch_help("pretrain")
    assert len(pretrain) == 4
    for kind in ("classification", "tagging", "squad", "multiple-choice"):
        finetune = batch_help("finetune", kind)
        assert finetune == pretrain


# --- 5. token losses normalised by the global batch -----------------------------------------------------------

class TokenObjective:
    """A per-token loss with a per-sample term, as masked LM + NSP: sums over units / global counts."""

    def counts(self, batch):
        return {"tokens": batch["mask"].sum(), "samples": torch.tensor(len(batch["mask"]))}

    def __call__(self, model, batch, totals):
        out = model(batch["x"])  # (B, T, 1)
        per_token = (out.squeeze(-1) - batch["y"]) ** 2 * batch["mask"]
        pooled = (out.squeeze(-1).mean(-1) - 1.0) ** 2
        return per_token.sum() / totals["tokens"] + pooled.sum() / totals["samples"], {}


def _token_batch(real_tokens: list[int], seed: int = 0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    size, length = len(real_tokens), 6
    mask = (torch.arange(length)[None, :] < torch.tensor(real_tokens)[:, None]).float()
    return {"x": torch.randn(size, length, 4, generator=generator), "y": torch.randn(size, length, generator=generator),
            "mask": mask}


def _gradient(objective, batch: dict[str, torch.Tensor], pieces: list[list[int]]) -> list[torch.Tensor]:
    torch.manual_seed(0)
    return _gradient_of(nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1)), objective, batch, pieces)


def _no_autocast():
    return torch.autocast("cpu", enabled=False)


def test_a_token_loss_gives_the_same_gradient_however_the_global_batch_is_split():
    # Uneven real tokens per row: the micro-batches of each split hold different numbers of tokens.
    batch = _token_batch([6, 1, 1, 5, 2, 6, 1, 3])
    whole = _gradient(TokenObjective(), batch, [list(range(8))])
    for pieces in ([[0, 1], [2, 3], [4, 5], [6, 7]], [[0, 1, 2], [3, 4, 5], [6, 7]], [[0], [1, 2, 3, 4, 5, 6], [7]]):
        for got, want in zip(_gradient(TokenObjective(), batch, pieces), whole):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)


def test_weighting_micro_batches_by_samples_would_not_give_it():
    """The test above is sensitive: averaging each micro-batch over its own tokens and weighting by samples
    (what the loop did for every loss) moves the gradient."""
    batch = _token_batch([6, 1, 1, 5, 2, 6, 1, 3])

    def per_micro_mean(model, micro):
        objective = TokenObjective()
        return objective(model, micro, objective.counts(micro))[0], {}

    whole = _gradient(per_micro_mean, batch, [list(range(8))])
    split = _gradient(per_micro_mean, batch, [[0, 1], [2, 3], [4, 5], [6, 7]])
    assert max(float((a - b).abs().max()) for a, b in zip(split, whole)) > 1e-3


def test_the_pretraining_objective_averages_over_the_global_batchs_masked_tokens():
    from bertkit.config import preset
    from bertkit.model import BertForPreTraining
    from bertkit.tasks.pretraining import PretrainingObjective, pretraining_loss

    torch.manual_seed(0)
    model = BertForPreTraining(preset("bert-debug", vocab_size=50, hidden_dropout_prob=0.0,
                                      attention_probs_dropout_prob=0.0))
    ids = torch.randint(5, 50, (6, 10))
    labels = torch.full_like(ids, -100)
    for row, masked in enumerate([5, 1, 0, 3, 2, 4]):  # a row with no masked token too
        labels[row, 1:1 + masked] = ids[row, 1:1 + masked]
    batch = {"input_ids": ids, "token_type_ids": torch.zeros_like(ids), "attention_mask": torch.ones_like(ids),
             "mlm_labels": labels, "nsp_labels": torch.tensor([0, 1, 0, 1, 1, 0])}
    whole_loss, _ = pretraining_loss(model, batch)  # one micro-batch: its own mean is the global mean
    whole = _gradient_of(model, PretrainingObjective(), batch, [list(range(6))])
    split = _gradient_of(model, PretrainingObjective(), batch, [[0], [1, 2, 3], [4, 5]])
    for got, want in zip(split, whole):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
    assert torch.isfinite(whole_loss)


def _gradient_of(model, objective, batch, pieces):
    model.zero_grad(set_to_none=True)
    micro = [{key: value[rows] for key, value in batch.items()} for rows in pieces]
    step = StepBatch(micro, [len(rows) for rows in pieces], len(next(iter(batch.values()))))
    loop._forward_backward(model, objective, step, _no_autocast, None, DistributedContext())
    return [p.grad.clone() for p in model.parameters() if p.grad is not None]


def test_the_squad_loss_does_not_depend_on_how_far_a_batch_is_padded():
    """Micro-batches of different sizes pad to different lengths: padding must not enter the answer softmax,
    or two processes would not train as one (found by test_multinode's SQuAD case)."""
    from bertkit.config import preset
    from bertkit.model import BertForQuestionAnswering
    from bertkit.settings import SquadSettings
    from bertkit.tasks.squad import SquadTask

    torch.manual_seed(0)
    model = BertForQuestionAnswering(preset("bert-debug", vocab_size=50, hidden_dropout_prob=0.0,
                                            attention_probs_dropout_prob=0.0)).eval()
    ids = torch.randint(5, 50, (2, 8))
    batch = {"input_ids": ids, "token_type_ids": torch.zeros_like(ids), "attention_mask": torch.ones_like(ids),
             "start_positions": torch.tensor([2, 3]), "end_positions": torch.tensor([4, 5])}
    padded = {key: torch.nn.functional.pad(value, (0, 5)) if value.dim() == 2 else value
              for key, value in batch.items()}
    task = SquadTask(SquadSettings())
    with torch.no_grad():
        torch.testing.assert_close(task.loss(model, padded)[0], task.loss(model, batch)[0])


def test_leaving_the_group_collects_a_ddp_wrapper_first(tmp_path, monkeypatch):
    """A DDP wrapper lives in a reference cycle; left for the interpreter's finalization, its reducer aborted
    the process after a finished training (SIGABRT, ~1 in 12 two-process runs; test_loop_ddp.py repeats it with
    real processes). teardown_distributed collects it while the process group still exists."""
    _torchrun_environment_of_one(monkeypatch)
    ctx = setup_distributed("cpu")
    alive_at_destroy = []
    real_destroy = dist.destroy_process_group
    gc.disable()  # as when the collector's thresholds are not reached before the process ends
    try:
        wrapper = weakref.ref(wrap_model(toy_model(dropout=0.0), ctx))  # dropped, as after fit
        monkeypatch.setattr(dist, "destroy_process_group",
                            lambda *a, **k: alive_at_destroy.append(wrapper() is not None) or real_destroy(*a, **k))
    finally:
        teardown_distributed()
        gc.enable()
    assert alive_at_destroy == [False]
