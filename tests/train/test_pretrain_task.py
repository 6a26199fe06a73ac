"""Pre-training end to end on a tiny inline corpus: the sparse MLM loss equals the dense one, `bertkit
pretrain` writes metrics.jsonl / TensorBoard / curves.png / final/, final/ loads in transformers with the
same outputs, a killed run resumes bit-exactly with the real model (dropout on), and bad flags are
reported as errors.; and issue 49's step: the StepPlan resolved
once from the flags and the device (and recorded), `--compile` training the whole compiled objective on static
batches, `--fused-kernels` the fused ops (their CPU references), resuming bit-exactly (the compilation traced by
torch.compile's "aot_eager" backend: the same graphs, no code generation; Inductor itself is
tests/train/test_compiled_objective.py's)."""

from __future__ import annotations

import functools
import json
import math
import shutil
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file

from bertkit.cli import main
from bertkit.config import preset
from bertkit.data import InstanceSettings, PretrainingDataset, build_pretraining_data, collate_pretraining
from bertkit.errors import BertkitError
from bertkit.model import BertForMaskedLM, BertForPreTraining
from bertkit.settings import PretrainingDataSettings, TrainConfig
from bertkit.tasks.pretraining import pretraining_loss
from bertkit.tokenizer import WordPieceTokenizer
from bertkit.train import checkpoint as ckpt
from bertkit.train.compiled import CompiledObjective
from bertkit.workflows import pretrain as pretrain_workflow
from bertkit.workflows.prepare import StepPlan, plan_step


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, write_toy_corpus) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("pretrain")
    corpus = write_toy_corpus(root / "corpus.txt", documents=40, sentences=(2, 8), words=(4, 14))
    tokenizer = WordPieceTokenizer.train([corpus], vocab_size=120, min_frequency=1)
    tokenizer.save_pretrained(root / "tok")
    build_pretraining_data(PretrainingDataSettings(
        (str(corpus),), "(in memory)", str(root / "data"), workers=1, quiet=True,
        instances=InstanceSettings(max_seq_length=32, dupe_factor=2, max_predictions_per_seq=5)), tokenizer)
    return {"root": root, "tok": root / "tok", "data": root / "data"}


def run_cli(prepared, output: Path, *extra: str) -> int:
    return main(["pretrain", "--data", str(prepared["data"]), "--tokenizer", str(prepared["tok"]),
                 "--model", "bert-debug", "--output", str(output), "--batch-size", "8", "--learning-rate", "1e-3",
                 "--eval-examples", "16", "--eval-every", "3", "--device", "cpu", *extra])


@pytest.mark.parametrize("model_class", [BertForPreTraining, BertForMaskedLM])
def test_sparse_and_dense_mlm_losses_agree(prepared, model_class):
    torch.manual_seed(0)
    model = model_class(preset("bert-debug", vocab_size=120)).eval()
    dataset = PretrainingDataset(prepared["data"])
    batch = collate_pretraining([dataset[i] for i in range(6)])
    nsp = model_class is BertForPreTraining
    sparse, sparse_metrics = pretraining_loss(model, batch, nsp=nsp, sparse=True)
    dense, dense_metrics = pretraining_loss(model, batch, nsp=nsp, sparse=False)
    assert abs(sparse.item() - dense.item()) < 1e-6
    assert sparse_metrics == pytest.approx(dense_metrics, abs=1e-6)


def test_pretrain_cli_writes_run_and_final_loads_in_transformers(prepared, tmp_path):
    assert run_cli(prepared, tmp_path, "--max-steps", "4", "--nsp") == 0  # (the short recipe alone has no NSP)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"]
    assert [r["step"] for r in train] == [1, 2, 3, 4]
    assert all({"loss", "mlm_loss", "nsp_loss", "lr", "mlm_accuracy", "nsp_accuracy"} <= set(r) for r in train)
    assert [r["step"] for r in records if r["kind"] == "eval"] == [3, 4]
    assert (tmp_path / "curves.png").stat().st_size > 0
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))

    final = tmp_path / "final"
    assert (final / "vocab.txt").read_text() == (prepared["tok"] / "vocab.txt").read_text()
    ours = BertForPreTraining.from_pretrained(final).eval()
    theirs = transformers.BertForPreTraining.from_pretrained(final).eval()
    batch = collate_pretraining([PretrainingDataset(prepared["data"])[i] for i in range(3)])
    inputs = {k: batch[k] for k in ("input_ids", "token_type_ids", "attention_mask")}
    with torch.no_grad():
        a, b = ours(**inputs), theirs(**inputs)
    real = inputs["attention_mask"].bool()  # transformers leaves padded positions unspecified; bertkit zeros them
    torch.testing.assert_close(a.prediction_logits[real], b.prediction_logits[real], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(a.seq_relationship_logits, b.seq_relationship_logits, atol=1e-4, rtol=1e-4)


def test_killed_bert_run_resumes_bit_exactly(prepared, tmp_path):
    straight = tmp_path / "straight"
    assert run_cli(prepared, straight, "--max-steps", "6", "--save-every", "3") == 0
    killed = tmp_path / "killed"
    shutil.copytree(straight, killed)
    # As if the process had died during step 4: only step 3's checkpoint exists.
    shutil.rmtree(killed / "checkpoints" / "step-00000006")
    shutil.rmtree(killed / "final")
    assert run_cli(prepared, killed, "--max-steps", "6", "--save-every", "3", "--resume", "auto") == 0
    losses = {run: [r["loss"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
                    if r["kind"] == "train"] for run in (straight, killed)}
    assert losses[killed] == losses[straight] and len(losses[straight]) == 6
    a, b = (load_file(str(run / "final" / "model.safetensors")) for run in (straight, killed))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert ckpt.verify_checkpoint(killed / "checkpoints" / "step-00000006") is None
    # each checkpoint records the kernels the steps ran (the last layer at the masked positions alone: a checkpoint
    # written before that lists the change on resume); the same machine's resume runs the same, so lists none
    state = json.loads((killed / "checkpoints" / "step-00000006" / "trainer_state.json").read_text())
    assert set(state["context"]["kernels"]) == {"attention", "dropout", "last_layer"}
    assert state["context"]["kernels"]["last_layer"] == "masked positions"
    resumed = [r for r in map(json.loads, (killed / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "resume"]
    assert len(resumed) == 1 and not any(name.startswith("kernels") for name in resumed[0]["changed"])


def test_a_fresh_start_over_checkpoints_is_refused_before_any_planning(prepared, tmp_path, capsys, monkeypatch):
    """The refusal comes first, in one line: no probe, plan or measurement runs (and logs) before it."""
    from bertkit.workflows import pretrain as workflow

    assert run_cli(prepared, tmp_path, "--max-steps", "2", "--save-every", "2") == 0
    capsys.readouterr()
    monkeypatch.setattr(workflow, "plan_pretraining", lambda *args: pytest.fail("planned before refusing"))
    assert run_cli(prepared, tmp_path, "--max-steps", "4") == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("bertkit: error:") and "already holds checkpoints" in error and "\n" not in error


def test_no_nsp_trains_masked_lm_only(prepared, tmp_path):
    assert run_cli(prepared, tmp_path, "--max-steps", "2", "--no-nsp") == 0
    record = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    assert "nsp_loss" not in record and record["loss"] == pytest.approx(record["mlm_loss"])
    assert json.loads((tmp_path / "final" / "config.json").read_text())["architectures"] == ["BertForMaskedLM"]


def test_init_from_continues_from_weights(prepared, tmp_path):
    assert run_cli(prepared, tmp_path / "first", "--max-steps", "2") == 0
    first = load_file(str(tmp_path / "first" / "final" / "model.safetensors"))
    assert main(["pretrain", "--data", str(prepared["data"]), "--init-from", str(tmp_path / "first" / "final"),
                 "--output", str(tmp_path / "second"), "--max-steps", "1", "--learning-rate", "1e-12",
                 "--eval-examples", "16", "--device", "cpu", "--batch-size", "8"]) == 0
    second = load_file(str(tmp_path / "second" / "final" / "model.safetensors"))
    for key, tensor in first.items():  # a 1e-12 step moves nothing measurably
        torch.testing.assert_close(second[key], tensor, atol=1e-9, rtol=0)


def test_another_held_out_split_is_refused_on_resume_unless_allowed(prepared, tmp_path, capsys):
    """Issue 51: a resume with another --eval-examples moved held-out instances into training, silently. Which
    instances are held out is part of what the run is (bertkit.settings.rules: held_out)."""
    assert run_cli(prepared, tmp_path, "--max-steps", "2", "--save-every", "2") == 0  # --eval-examples 16
    capsys.readouterr()
    common = ("--max-steps", "4", "--resume", "auto", "--eval-examples", "8")
    assert main(["pretrain", "--data", str(prepared["data"]), "--tokenizer", str(prepared["tok"]), "--model",
                 "bert-debug", "--output", str(tmp_path), "--batch-size", "8", "--learning-rate", "1e-3",
                 "--eval-every", "3", "--device", "cpu", *common]) != 0
    error = capsys.readouterr().err
    assert "held_out was '16 instances of the training data' and is '8 instances" in error
    assert "--allow-change held_out" in error and "Traceback" not in error
    assert main(["pretrain", "--data", str(prepared["data"]), "--tokenizer", str(prepared["tok"]), "--model",
                 "bert-debug", "--output", str(tmp_path), "--batch-size", "8", "--learning-rate", "1e-3",
                 "--eval-every", "3", "--device", "cpu", *common, "--allow-change", "held_out"]) == 0


@pytest.mark.parametrize("flags,message", [
    (["--max-time", "soon"], "--max-time 'soon'"),
    (["--max-steps", "2", "--precision", "fp16"], "fp16 needs a CUDA device"),
    ([], "no training budget"),
])
def test_bad_flags_are_reported(prepared, tmp_path, capsys, flags, message):
    if "fp16" in flags and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert run_cli(prepared, tmp_path, *flags) == 2
    assert message in capsys.readouterr().err


def test_wrong_tokenizer_is_reported(prepared, tmp_path, capsys):
    other = WordPieceTokenizer.train([prepared["root"] / "corpus.txt"], vocab_size=100, min_frequency=1)
    other.save_pretrained(tmp_path / "other")
    assert main(["pretrain", "--data", str(prepared["data"]), "--tokenizer", str(tmp_path / "other"),
                 "--model", "bert-debug", "--output", str(tmp_path / "run"), "--max-steps", "1"]) == 2
    assert "not the vocabulary" in capsys.readouterr().err
    from bertkit.config import preset
    from bertkit.model import BertForMaskedLM

    BertForMaskedLM(preset("bert-debug", vocab_size=other.vocab_size)).save_pretrained(tmp_path / "model",
                                                                                     tokenizer=other)
    assert main(["pretrain", "--data", str(prepared["data"]), "--init-from", str(tmp_path / "model"),
                 "--output", str(tmp_path / "run2"), "--max-steps", "1"]) == 2
    err = capsys.readouterr().err  # it named --tokenizer, which was not given
    assert f"--init-from {tmp_path / 'model'}: its vocabulary is not the one --data" in err and "--tokenizer " in err


def test_resume_refuses_a_new_dropout_unless_allowed_and_applies_a_new_learning_rate(prepared, tmp_path, capsys):
    assert run_cli(prepared, tmp_path, "--max-steps", "2", "--dropout", "0.1") == 0
    capsys.readouterr()
    assert run_cli(prepared, tmp_path, "--max-steps", "4", "--dropout", "0", "--resume", "auto") != 0
    error = capsys.readouterr().err
    assert "dropout was 0.1 and is 0.0 now" in error and "--allow-change dropout" in error
    assert "Traceback" not in error
    assert run_cli(prepared, tmp_path, "--max-steps", "4", "--dropout", "0", "--allow-change", "dropout",
                   "--learning-rate", "2e-3", "--resume", "auto") == 0
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    resumed = [r for r in records if r["kind"] == "resume"]
    assert len(resumed) == 1 and resumed[0]["step"] == 2
    assert resumed[0]["changed"]["learning_rate"] == [1e-3, 2e-3] and resumed[0]["changed"]["dropout"] == [0.1, 0.0]
    assert [r["step"] for r in records if r["kind"] == "train"] == [1, 2, 3, 4]


# --- issue 49's step: resolved once, compiled whole with static batches, fused kernels, exact resume ---------

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def test_the_step_plan_on_a_cpu_and_its_refusals(monkeypatch):
    assert plan_step(TrainConfig(max_steps=1), CPU) == StepPlan(False, False, False, False, False, False)
    compiled = plan_step(TrainConfig(max_steps=1, compile=True, fused_kernels=True), CPU)
    assert compiled == StepPlan(True, True, False, True, True, True)
    assert "whole step compiled" in compiled.describe() and "bias+GELU" in compiled.describe()
    with pytest.raises(BertkitError, match="--cuda-graphs"):
        plan_step(TrainConfig(max_steps=1, compile=True, cuda_graphs=True), CPU)
    monkeypatch.setattr("bertkit.kernels.triton_support.available", lambda device: True)
    gpu = plan_step(TrainConfig(max_steps=1, compile=True), CUDA)
    assert gpu.static_shapes and gpu.compile and not gpu.fused_norm  # compiled: Inductor fuses that work itself
    eager = plan_step(TrainConfig(max_steps=1, compile=False), CUDA)
    assert eager.fused_norm and not (eager.fused_gelu or eager.fused_loss)  # eager: the LayerNorm kernel paid
    monkeypatch.setattr("bertkit.kernels.triton_support.available", lambda device: False)
    monkeypatch.setattr("bertkit.kernels.triton_support.reason_unavailable", lambda device: "no triton here")
    assert not plan_step(TrainConfig(max_steps=1, compile=False), CUDA).fused_norm  # unset: off without Triton
    with pytest.raises(BertkitError, match="--fused-kernels: no triton here"):
        plan_step(TrainConfig(max_steps=1, fused_kernels=True), CUDA)


@pytest.fixture
def traced(monkeypatch):
    monkeypatch.setattr(pretrain_workflow, "CompiledObjective", functools.partial(CompiledObjective,
                                                                                  backend="aot_eager"))


def _losses(run) -> list[float]:
    return [r["loss"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
            if r["kind"] == "train"]


def test_compiled_static_fused_pretraining_runs_and_resumes_bit_exactly(prepared, tmp_path, traced):
    flags = ("--compile", "--fused-kernels", "--read-every", "2", "--max-steps", "6", "--save-every", "3")
    straight = tmp_path / "straight"
    assert run_cli(prepared, straight, *flags) == 0
    recorded = json.loads((straight / "pretrain_settings.json").read_text())
    assert recorded["step"] == {"static_shapes": True, "compile": True, "cuda_graphs": False, "fused_norm": True,
                                "fused_gelu": True, "fused_loss": True}
    assert recorded["train"]["read_every"] == 2
    killed = tmp_path / "killed"
    shutil.copytree(straight, killed)
    shutil.rmtree(killed / "checkpoints" / "step-00000006")
    shutil.rmtree(killed / "final")
    assert run_cli(prepared, killed, *flags, "--resume", "auto") == 0
    assert _losses(killed) == _losses(straight) and len(_losses(straight)) == 6


def test_compiled_static_steps_take_one_shape_per_length_with_full_length_steps(prepared, tmp_path, traced,
                                                                                  monkeypatch):
    """Issue 48 on the GPU path: a static-shape (compiled) run with full-length steps pads the short steps to the
    short length and the full-length ones to the data's, two shapes in all, and trains finite losses."""
    shapes = []
    original = pretrain_workflow.collate_static_buckets

    def recording(*args, **kwargs):
        batch = original(*args, **kwargs)
        shapes.append(tuple(batch["input_ids"].shape))
        return batch

    monkeypatch.setattr(pretrain_workflow, "collate_static_buckets", recording)
    assert run_cli(prepared, tmp_path / "run", "--compile", "--max-steps", "4", "--max-seq-length", "16",
                   "--full-length-share", "0.5", "--full-length-placement", "spread") == 0
    assert shapes == [(8, 16), (8, 32)] * 2
    losses = _losses(tmp_path / "run")
    assert len(losses) == 4 and all(math.isfinite(loss) for loss in losses)
