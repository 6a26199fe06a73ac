"""The loop's guards and budgets: non-finite steps never reach the optimizer or scheduler and stop the
run after K in a row without checkpointing poisoned state; fp16 refuses CPU; epoch and time budgets;
eval records and the best-model callback; equal global batches give equal steps however they are split."""

from __future__ import annotations

import math

import pytest
import torch
from safetensors.torch import load_file
from toy_training import toy_data, toy_loss, toy_model, train_losses

from bertkit.errors import BertkitError
from bertkit.train import Hooks, TrainConfig, fit
from bertkit.train import checkpoint as ckpt
from bertkit.train.reporting import METRICS_FILE, PLOT_FILE, read_metrics


def nan_from_step(first_bad_step: int, micro_per_step: int = 1):
    calls = {"n": 0}

    def loss_fn(model, batch):
        calls["n"] += 1
        loss, metrics = toy_loss(model, batch)
        if calls["n"] > (first_bad_step - 1) * micro_per_step:
            loss = loss * float("nan")
        return loss, metrics
    return loss_fn


def test_nonfinite_steps_are_skipped_and_stop_the_run(tmp_path):
    config = TrainConfig(max_steps=20, micro_batch_size=4, learning_rate=1e-2, precision="fp32", save_every=1,
                         keep_last=10,
                         max_nonfinite_steps=3)
    with pytest.raises(BertkitError, match="3 optimizer steps in a row"):
        fit(toy_model(), nan_from_step(3), toy_data(), config, tmp_path)
    # Steps 3, 4, 5 were non-finite: no checkpoint from them; step 2's weights are the last ones.
    checkpoints = ckpt.list_checkpoints(tmp_path / "checkpoints")
    assert [p.name for p in checkpoints] == ["step-00000001", "step-00000002"]
    records = read_metrics(tmp_path / METRICS_FILE)
    assert [r.get("skipped", False) for r in records] == [False, False, True, True, True]
    # The learning rate is the schedule's at each step, skipped steps included (they use up their slot).
    assert config.warmup_ratio is None  # unset, fit alone: no warmup, a linear decay from the first step
    assert [r["lr"] for r in records] == pytest.approx([1e-2 * (20 - s) / 20 for s in range(5)], abs=1e-15)
    assert (tmp_path / PLOT_FILE).is_file()


def test_skipped_step_does_not_move_the_optimizer_but_uses_up_its_schedule_slot(tmp_path):
    calls = {"n": 0}

    def loss_fn(model, batch):
        calls["n"] += 1
        loss, metrics = toy_loss(model, batch)
        return (loss * math.inf if calls["n"] == 2 else loss), metrics

    config = TrainConfig(max_steps=4, micro_batch_size=4, learning_rate=1e-2, precision="fp32", save_every=1,
                         keep_last=5, warmup_steps=0)
    result = fit(toy_model(), loss_fn, toy_data(), config, tmp_path)
    assert result.skipped_steps == 1
    last = ckpt.list_checkpoints(tmp_path / "checkpoints")[-1]
    assert last.name == "step-00000004"
    assert load_file(str(last / "optimizer.safetensors"))["0.step"].item() == 3.0
    # The run ends where its schedule ends: the last step at 1/4 of the peak, as without the skipped step
    # (a scheduler that skips with the optimizer would end at 2/4, its decay never finished).
    lrs = [r["lr"] for r in read_metrics(tmp_path / METRICS_FILE) if r["kind"] == "train"]
    assert lrs == pytest.approx([1e-2, 0.75e-2, 0.5e-2, 0.25e-2], abs=1e-15)


def test_fp16_needs_cuda(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(BertkitError, match="fp16 needs a CUDA device"):
        fit(toy_model(), toy_loss, toy_data(), TrainConfig(max_steps=1, learning_rate=1e-3, precision="fp16"), tmp_path)


def test_bf16_autocast_trains(tmp_path):
    config = TrainConfig(max_steps=3, micro_batch_size=4, learning_rate=1e-3, precision="bf16")
    fit(toy_model(), toy_loss, toy_data(), config, tmp_path)
    assert all(math.isfinite(x) for x in train_losses(tmp_path))


def test_epoch_budget_and_eval_records_and_best_callback(tmp_path):
    seen = []
    scores = iter([0.1, 0.3, 0.2])
    config = TrainConfig(num_epochs=3, micro_batch_size=5, eval_every=4, best_metric="accuracy", learning_rate=1e-3,
                         precision="fp32")
    result = fit(toy_model(), toy_loss, toy_data(), config, tmp_path,
                 hooks=Hooks(evaluate=lambda model: {"accuracy": next(scores)},
                             on_best=lambda model, step, metrics: seen.append((step, metrics["accuracy"]))))
    assert result.step == 12  # 20 samples / 5 = 4 steps per epoch
    evals = [r for r in read_metrics(tmp_path / METRICS_FILE) if r["kind"] == "eval"]
    assert [(r["step"], r["accuracy"]) for r in evals] == [(4, 0.1), (8, 0.3), (12, 0.2)]
    assert seen == [(4, 0.1), (8, 0.3)]
    assert result.best == {"step": 8, "metrics": {"accuracy": 0.3}}


def test_time_budget_stops_and_decays_lr(tmp_path):
    config = TrainConfig(max_time_s=0.5, micro_batch_size=4, learning_rate=1e-3, precision="fp32")
    result = fit(toy_model(), toy_loss, toy_data(), config, tmp_path)
    assert result.stop_reason == "budget" and result.step > 1
    lrs = [r["lr"] for r in read_metrics(tmp_path / METRICS_FILE) if r["kind"] == "train"]
    assert lrs[-1] < max(lrs)


def test_warmup_steps_need_a_step_budget():
    with pytest.raises(BertkitError, match="--warmup-ratio"):
        fit(toy_model(), toy_loss, toy_data(),
            TrainConfig(max_time_s=1, warmup_steps=5, learning_rate=1e-3, precision="fp32"), "unused")


@pytest.mark.parametrize("micro,accumulation", [(2, 4), (1, 8)])
def test_same_global_batch_same_step_however_split(tmp_path, micro, accumulation):
    """Fast stand-in for the DDP test: the global batch is the unit, micro-batches only split it."""
    def run(directory, micro_batch_size, steps):
        config = TrainConfig(max_steps=steps, micro_batch_size=micro_batch_size, learning_rate=1e-2, precision="fp32",
                             gradient_accumulation_steps=8 // micro_batch_size)
        model = toy_model(dropout=0.0)
        fit(model, toy_loss, toy_data(24), config, directory)  # 3 full global batches of 8
        return train_losses(directory), model

    reference, reference_model = run(tmp_path / "whole", 8, 3)
    losses, model = run(tmp_path / "split", micro, 3)
    assert losses == pytest.approx(reference, rel=1e-5)
    for a, b in zip(model.parameters(), reference_model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_group_by_length_batches_similar_lengths_and_keeps_every_example():
    import numpy as np

    from bertkit.train.batches import EpochBatches

    lengths = np.random.default_rng(0).integers(1, 129, size=1000)
    plain = EpochBatches(list(range(1000)), None, micro_batch_size=8, accumulation=1, rank=0, world_size=1, seed=3)
    grouped = EpochBatches(list(range(1000)), None, micro_batch_size=8, accumulation=1, rank=0, world_size=1,
                           seed=3, lengths=lengths)
    for epoch in (0, 1):
        order = grouped.permutation(epoch)
        assert sorted(order.tolist()) == list(range(1000))  # a permutation: nothing lost or repeated
        np.testing.assert_array_equal(order, grouped.permutation(epoch))  # deterministic: resume stays exact

        def padding(o):
            batches = lengths[o].reshape(-1, 8)
            return int((batches.max(1, keepdims=True) - batches).sum())

        assert padding(order) < padding(plain.permutation(epoch)) / 5
    assert not np.array_equal(grouped.permutation(0), grouped.permutation(1))  # batches reshuffled every epoch
