"""Fine-tuning runs as long as pre-training runs: step budgets, evaluation and checkpoints every N steps,
exact resume after an interrupt (bit-identical per-step losses on CPU, every seed), finished seeds kept,
a refused non-empty --output, and interrupts that stop the whole command with exit 130/143."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bertkit.cli import main
from bertkit.errors import BertkitError, Interrupted
from bertkit.tasks.classification import ClassificationSettings, ClassificationTask
from bertkit.tokenizer import WordPieceTokenizer
from bertkit.workflows.finetune import FinetuneSettings, finetune

WORDS = ["good", "bad", "film", "plot", "great", "awful", "acting", "story"]


def _tokenizer(directory: Path) -> WordPieceTokenizer:
    tokenizer = WordPieceTokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS])
    tokenizer.save_pretrained(directory)
    return tokenizer


def _examples(count: int) -> list:
    from bertkit.data.glue import TextExample

    return [TextExample(f"train:{i}", " ".join(WORDS[(i * 3 + j) % len(WORDS)] for j in range(1 + i % 5)),
                        None, "good" if i % 2 else "bad") for i in range(count)]


class _SignalAt(ClassificationTask):
    """The classification task, sending a signal to this process at the n-th training loss call."""

    def __init__(self, settings, at_call: int, signum: int = signal.SIGTERM) -> None:
        super().__init__(settings)
        self.calls, self.at_call, self.signum = 0, at_call, signum

    def loss(self, model, batch):
        self.calls += 1
        if self.calls == self.at_call:
            os.kill(os.getpid(), self.signum)
        return super().loss(model, batch)


def _run(tmp_path: Path, name: str, task: ClassificationTask, **changes) -> dict:
    tokenizer = _tokenizer(tmp_path / "vocab")
    settings = dict(model="bert-debug", tokenizer=str(tmp_path / "vocab"), output=tmp_path / name, num_epochs=3,
                    batch_size=4, learning_rate=1e-3, precision="fp32", device="cpu", seeds=(1, 2), eval_every=3)
    cfg = FinetuneSettings.of(**{**settings, **changes})
    examples = _examples(22)
    return finetune(task, cfg, tokenizer, examples, [("", examples[:8])], {})


def _losses(run: Path, seed: int) -> list[tuple[int, float]]:
    records = [json.loads(line) for line in (run / f"seed-{seed}" / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"]) for r in records if r["kind"] == "train"]


SETTINGS = ClassificationSettings(labels=["bad", "good"], max_seq_length=16)


def test_interrupted_seed_resumes_bit_exact_and_finished_seeds_are_kept(tmp_path):
    straight = _run(tmp_path, "straight", ClassificationTask(SETTINGS))
    # 6 steps per epoch, 18 per seed: the signal arrives in seed 2's step 8 (call 18 + 8), mid-epoch.
    with pytest.raises(Interrupted) as stopped:
        _run(tmp_path, "stopped", _SignalAt(SETTINGS, at_call=26))
    assert stopped.value.exit_code == 143 and stopped.value.resume_flag == "--resume auto"
    assert "seed 2 stopped by SIGTERM at step 8" in str(stopped.value)
    assert (tmp_path / "stopped" / "seed-1" / "seed_results.json").is_file()
    assert not (tmp_path / "stopped" / "eval_results.json").exists()  # the run is not finished
    resumed = _run(tmp_path, "stopped", ClassificationTask(SETTINGS), resume=True)
    assert _losses(tmp_path / "stopped", 1) == _losses(tmp_path / "straight", 1)  # seed 1 was not trained again
    seed_2 = {name: [loss for _, loss in _losses(tmp_path / name, 2)] for name in ("stopped", "straight")}
    assert seed_2["stopped"] == seed_2["straight"]
    assert resumed["seeds"] == straight["seeds"] and resumed["summary"] == straight["summary"]
    assert (tmp_path / "stopped" / "best" / "model.safetensors").is_file()
    assert not list((tmp_path / "stopped").glob("seed-*/checkpoints"))


def test_step_budget_and_evaluation_every_n_steps(tmp_path):
    results = _run(tmp_path, "steps", ClassificationTask(SETTINGS), max_steps=7, lr_schedule="cosine")
    records = [json.loads(line) for line in (tmp_path / "steps" / "seed-1" / "metrics.jsonl").read_text().splitlines()]
    assert max(r["step"] for r in records if r["kind"] == "train") == 7  # --max-steps overrides --epochs
    assert [r["step"] for r in records if r["kind"] == "eval"] == [3, 6, 7]  # every 3 steps and at the end
    assert results["seeds"]["1"]["step"] in (3, 6, 7)


def test_adam_epsilon_is_transformers_by_default_and_reaches_the_optimizer(tmp_path, monkeypatch):
    import bertkit.train.loop as loop

    seen = []
    real = loop.build_optimizer
    # build_optimizer(model, name, learning_rate, weight_decay, betas, eps, split_encoder): a[5] is eps
    monkeypatch.setattr(loop, "build_optimizer", lambda *a: seen.append(a[5]) or real(*a))
    _run(tmp_path, "default", ClassificationTask(SETTINGS), max_steps=1, seeds=(1,))
    _run(tmp_path, "original", ClassificationTask(SETTINGS), max_steps=1, seeds=(1,), adam_epsilon=1e-6)
    assert seen == [1e-8, 1e-6]
    assert json.loads((tmp_path / "original" / "finetune_run.json").read_text())["adam_epsilon"] == 1e-6


def test_a_non_empty_output_needs_resume_or_overwrite(tmp_path):
    _run(tmp_path, "run", ClassificationTask(SETTINGS), max_steps=2)
    with pytest.raises(BertkitError, match="--output .* is not empty; pass --resume auto .* --overwrite"):
        _run(tmp_path, "run", ClassificationTask(SETTINGS), max_steps=2)
    with pytest.raises(BertkitError, match=r"dropout was 0.1 and is 0.2 now; a resumed run with another dropout"):
        _run(tmp_path, "run", ClassificationTask(SETTINGS), max_steps=2, dropout=0.2, resume=True)
    _run(tmp_path, "run", ClassificationTask(SETTINGS), max_steps=3, overwrite=True)
    assert max(step for step, _ in _losses(tmp_path / "run", 1)) == 3
    (tmp_path / "run" / "notes.txt").write_text("mine")
    with pytest.raises(BertkitError, match="holds files fine-tuning does not write .*notes.txt"):
        _run(tmp_path, "run", ClassificationTask(SETTINGS), max_steps=2, overwrite=True)


def _cli_data(tmp_path: Path) -> list[str]:
    _tokenizer(tmp_path / "vocab")
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"text": e.text, "label": e.label}) + "\n" for e in _examples(40)))
    return ["finetune", "classification", "--model", "bert-debug", "--tokenizer", str(tmp_path / "vocab"),
            "--train", str(data), "--dev", str(data), "--batch-size", "4", "--precision", "fp32", "--device", "cpu"]


@pytest.mark.timeout(300)
def test_sigint_stops_finetune_with_130_and_says_how_to_continue(tmp_path):
    """A real process, a real Ctrl-C (SIGINT) while it trains: exit 130, the continue command, no traceback."""
    args = [*_cli_data(tmp_path), "--output", str(tmp_path / "out"), "--epochs", "200", "--seeds", "1,2"]
    process = subprocess.Popen([sys.executable, "-m", "bertkit", *args], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    metrics = tmp_path / "out" / "seed-1" / "metrics.jsonl"
    try:
        for _ in range(1200):  # wait until training has started
            if metrics.is_file() and metrics.stat().st_size:
                break
            if process.poll() is not None:
                break
            time.sleep(0.1)
        process.send_signal(signal.SIGINT)
        _out, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, err
    assert "Traceback" not in err and "no evaluation produced" not in err
    assert "fine-tuning seed 1 stopped by SIGINT" in err
    assert "continue with: bertkit finetune classification" in err and err.rstrip().endswith("--resume auto")
    assert list((tmp_path / "out" / "seed-1" / "checkpoints").glob("step-*"))


def test_pretrain_exits_143_after_sigterm_and_main_maps_interrupts(tmp_path, monkeypatch, capsys):
    import bertkit.workflows.pretrain as pretraining
    from bertkit.train.loop import FitResult

    monkeypatch.setattr(pretraining, "pretrain", lambda settings, config: FitResult(
        5, "signal", tmp_path / "checkpoints" / "step-00000005", 0, 0, None, signal.SIGTERM))
    code = main(["pretrain", "--data", str(tmp_path), "--output", str(tmp_path / "run"), "--max-steps", "9"])
    err = capsys.readouterr().err
    assert code == 143
    assert "pre-training stopped by SIGTERM at step 5" in err
    assert f"continue with: bertkit pretrain --data {tmp_path}" in err and err.rstrip().endswith("--resume auto")


def test_the_continue_line_runs_as_printed_after_overwrite(tmp_path, monkeypatch, capsys):
    """A run started with --overwrite (and an older --resume of its own) is interrupted; the printed command
    is pasted as it is: it used to keep --overwrite and fail with "--resume and --overwrite contradict"."""
    import shlex

    real_loss, calls = ClassificationTask.loss, []

    def loss(self, model, batch):
        calls.append(1)
        if len(calls) == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        return real_loss(self, model, batch)

    monkeypatch.setattr(ClassificationTask, "loss", loss)
    out = tmp_path / "out"
    out.mkdir()
    (out / "finetune_run.json").write_text("{}")  # an earlier run that --overwrite deletes
    argv = [*_cli_data(tmp_path), "--output", str(out), "--epochs", "1", "--overwrite", "--eval-every", "2"]
    assert main(argv) == 143
    line = next(x for x in capsys.readouterr().err.splitlines() if x.startswith("continue with: "))
    command = shlex.split(line.removeprefix("continue with: "))
    assert command[0] == "bertkit" and "--overwrite" not in command and command[-2:] == ["--resume", "auto"]
    assert main(command[1:]) == 0, capsys.readouterr().err
    assert (out / "best" / "model.safetensors").is_file() and len(calls) > 3


@pytest.mark.parametrize(("argv", "flag", "expected"), [
    (["pretrain", "--overwrite", "--data", "d"], "--resume auto", ["pretrain", "--data", "d", "--resume", "auto"]),
    (["pretrain", "--resume", "runs/x/step-00000100", "--data", "d"], "--resume auto",
     ["pretrain", "--data", "d", "--resume", "auto"]),  # an older checkpoint would start a new branch
    (["pretrain", "--resume=auto", "--data", "d"], "--resume auto", ["pretrain", "--data", "d", "--resume", "auto"]),
    (["quickstart", "--overwrite", "--minutes", "3"], "--resume", ["quickstart", "--minutes", "3", "--resume"]),
    (["quickstart", "--resume", "--minutes", "3"], "--resume", ["quickstart", "--minutes", "3", "--resume"]),
])
def test_continuing_drops_what_contradicts_resuming(argv, flag, expected):
    from bertkit.cli import continuing

    assert continuing(argv, flag) == expected


def test_other_dev_sets_are_scored_when_the_first_improves(tmp_path):
    tokenizer = _tokenizer(tmp_path / "vocab")
    examples = _examples(22)
    cfg = FinetuneSettings.of(model="bert-debug", tokenizer=str(tmp_path / "vocab"), output=tmp_path / "run",
                              num_epochs=3, batch_size=4, learning_rate=1e-12, precision="fp32",
                              device="cpu")  # dev never improves
    splits = [("", examples[:8]), ("test", examples[8:])]
    results = finetune(ClassificationTask(SETTINGS), cfg, tokenizer, examples, splits, {})
    evals = [json.loads(line) for line in (tmp_path / "run" / "seed-1" / "metrics.jsonl").read_text().splitlines()
             if json.loads(line)["kind"] == "eval"]
    assert ["test_accuracy" in e for e in evals] == [True, False, False]  # scored at the first (the best) only
    assert results["step"] == evals[0]["step"] and "test_accuracy" in results


def test_the_run_record_keeps_the_names_runs_written_before_were_recorded_under(tmp_path):
    """finetune_run.json is compared on --resume auto; its keys stay those older runs wrote (issue 36 moved
    the training settings into FinetuneSettings.train), so a run directory written before still resumes. The
    batch fields are no longer recorded: each seed's checkpoint holds the global batch it trained with."""
    from bertkit.workflows.finetune import run_settings

    written_before = {"model", "tokenizer", "epochs", "max_steps", "eval_every", "learning_rate", "warmup_ratio",
                      "lr_schedule", "weight_decay", "adam_epsilon", "dropout", "freeze_encoder", "feature_layers",
                      "feature_combine", "group_by_length", "early_stopping_patience"}
    recorded = run_settings(FinetuneSettings.of(model="m", output=tmp_path, num_epochs=2.0, adam_epsilon=1e-7))
    assert set(recorded) == written_before | {"compare_random_init"}  # added since: a free setting
    assert (recorded["epochs"], recorded["adam_epsilon"], recorded["learning_rate"]) == (2.0, 1e-7, None)


def test_a_seed_resumed_where_the_probe_chose_other_kernels_lists_the_change(tmp_path, use_profile):
    """The kernels a seed's steps run are recorded with each checkpoint; resumed where the probe measured other
    ones (here a profile without dropout timings: torch's masks and SDPA instead of the counter-based and bmm), the
    seed goes on with this machine's and its resume record lists the change (its later steps are not bit-identical
    to the run's)."""
    with pytest.raises(Interrupted):
        _run(tmp_path, "run", _SignalAt(SETTINGS, at_call=8), seeds=(1,))
    checkpoint = next((tmp_path / "run" / "seed-1" / "checkpoints").glob("step-*"))
    recorded = json.loads((checkpoint / "trainer_state.json").read_text())["context"]["kernels"]
    # the suite's profile (amd-epyc), an fp32 run with attention dropout: bmm at 32 tokens, counter-based masks
    assert recorded == {"attention": {"fp32": [32]}, "dropout": ["fp32"]}
    use_profile("intel-xeon-no-amx")
    _run(tmp_path, "run", ClassificationTask(SETTINGS), seeds=(1,), resume=True)
    records = [json.loads(line) for line in (tmp_path / "run" / "seed-1" / "metrics.jsonl").read_text().splitlines()]
    changed = next(r for r in records if r["kind"] == "resume")["changed"]
    assert changed["kernels.dropout"] == [["fp32"], "torch's"] and changed["kernels.attention.fp32"] == [[32], []]
