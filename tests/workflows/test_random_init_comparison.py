"""`finetune --compare-random-init`: where a short pre-training was measured to lose to random initialisation on long
inputs, the run fine-tunes both and keeps the better on dev, so it never ends below random initialisation; the other
model is kept beside it, and every step resumes."""

from __future__ import annotations

import inspect
import json
import logging
import os
import random
import signal
from pathlib import Path

import pytest

from bertkit.cli import main
from bertkit.workflows.random_init import INITIALISATION_FILE, keep_better_initialisation, restore_pretrained
from bertkit.workflows.recipe_notes import random_init_comparison

from .conftest import TOKENS, WORDS, tiny_model


def _short_budget_model(directory: Path, steps: int = 100, trained_positions: int = 8) -> Path:
    """A tiny checkpoint whose record says bertkit pre-trained it `steps` steps at `trained_positions` tokens."""
    tiny_model(directory)
    record = {"steps": steps, "recipe": "short", "max_seq_length": trained_positions,
              "trained_positions": trained_positions}
    (directory / "bertkit_pretraining.json").write_text(json.dumps(record))
    return directory


def _task(tmp_path: Path, words: int = 12, name: str = "train.jsonl") -> Path:
    rng = random.Random(0)
    rows = []
    for i in range(16):
        label = ("good", "bad")[i % 2]
        text = " ".join([label] + [rng.choice(WORDS) for _ in range(words - 1)])
        rows.append(json.dumps({"text": text, "label": label}))
    path = tmp_path / name
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


def _finetune(model: Path | str, data: Path, output: Path, *extra: str, dev: bool = True) -> int:
    argv = ["finetune", "classification", "--model", str(model), "--train", str(data), "--output", str(output),
            "--epochs", "2", "--batch-size", "4", "--precision", "fp32", "--device", "cpu", "--max-seq-length",
            "32", *extra]
    if dev:
        argv += ["--dev", str(data)]
    if model == "bert-debug":
        argv += ["--tokenizer", str(output.parent / "vocab")]
    return main(argv)


def test_auto_compares_exactly_where_pretraining_was_measured_to_lose():
    """auto follows the long-input measurement: a short budget (<= 10,560 steps) with most inputs past its positions."""
    long, short = [40] * 6 + [10] * 4, [10] * 6 + [40] * 4
    compare, reason = random_init_comparison("auto", 24, long, 2_640)
    assert compare and "longer than the 24 tokens of a 2,640-step pre-training" in reason
    assert not random_init_comparison("auto", 24, short, 2_640)[0]  # short inputs: pre-training paid
    assert random_init_comparison("auto", 24, long, 10_560)[0]  # 40 CPU-minutes did not pay on the Treasury
    assert not random_init_comparison("auto", 24, long, 10_561)[0]  # longer was not measured to lose
    assert not random_init_comparison("auto", None, long, 2_640)[0]  # every position trained (made elsewhere)
    assert not random_init_comparison("auto", 24, long, None)[0]  # converged elsewhere, or random initialisation
    assert random_init_comparison("on", None, short, None) == (True, "--compare-random-init on")
    assert random_init_comparison("off", 24, long, 2_640) == (False, "--compare-random-init off")


def test_a_short_budget_model_on_long_inputs_is_fine_tuned_beside_random_initialisation(tmp_path, caplog, capsys):
    model = _short_budget_model(tmp_path / "model")
    data = _task(tmp_path)
    with caplog.at_level(logging.INFO):
        assert _finetune(model, data, tmp_path / "out", "--seeds", "1,2") == 0
    out = tmp_path / "out"
    results = json.loads((out / "eval_results.json").read_text())
    report = results["random_init"]
    assert report["compare"] and report["reason"].startswith("auto: most inputs are longer than the 8 tokens")
    assert report["metric"] == "accuracy" and report["kept"] in ("pre-trained", "random initialisation")
    for side in ("pre-trained", "random initialisation"):
        assert len(report[side]["seeds"]) == 2
    means = {side: report[side]["mean"] for side in ("pre-trained", "random initialisation")}
    assert report["difference"] == pytest.approx(means["random initialisation"] - means["pre-trained"])
    kept = report["kept"]
    assert (report[kept]["mean"] > report[_other(kept)]["mean"]
            or (kept == "pre-trained" and report[kept]["mean"] == report[_other(kept)]["mean"]))
    # The top-level results are the kept run's, OUTPUT/best is its best seed, and says so.
    assert results["accuracy"] == max(report[kept]["seeds"].values())
    assert set(report["pre-trained"]["seeds"]) == {"1", "2"}  # by seed
    assert json.loads((out / "best" / INITIALISATION_FILE).read_text())["kept"] == kept
    # random initialisation ran at its own rate rule, in its own ordinary run directory
    random_run = json.loads((out / "random-init" / "finetune_run.json").read_text())
    assert random_run["model"] == f"random initialisation of {model}"
    assert (out / "random-init" / "best" / "model.safetensors").is_file()
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("fine-tuning random initialisation")]
    assert len(said) == 1 and "--compare-random-init off skips it" in said[0]
    assert any(r.getMessage().startswith(f"kept {kept}: dev accuracy") for r in caplog.records)
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith(f"kept {kept}:")]
    assert len(printed) == 1 and printed[0].endswith(f"the other's best model: {report['other_model']}")
    assert Path(report["other_model"], "model.safetensors").is_file()
    # predict reads the kept model with nothing else
    assert main(["predict", "--model", str(out / "best"), "--input", str(data), "--output", str(tmp_path / "pred"),
                 "--device", "cpu"]) == 0

    # Resumed with a third seed: each side trains seed 3 only, and the choice is made again over three seeds.
    caplog.clear()
    with caplog.at_level(logging.INFO):
        assert _finetune(model, data, out, "--seeds", "1,2,3", "--resume", "auto") == 0
    again = json.loads((out / "eval_results.json").read_text())["random_init"]
    assert [len(again[side]["seeds"]) for side in ("pre-trained", "random initialisation")] == [3, 3]
    for side in ("pre-trained", "random initialisation"):  # seeds 1 and 2 read back, not trained again
        assert {seed: again[side]["seeds"][seed] for seed in ("1", "2")} == report[side]["seeds"]
    finished = [r.getMessage() for r in caplog.records if "finished earlier" in r.getMessage()]
    assert len(finished) == 4  # seeds 1 and 2 of both sides
    assert json.loads((out / "best" / INITIALISATION_FILE).read_text())["kept"] == again["kept"]

    # --overwrite removes what the comparison wrote too
    assert _finetune(model, data, out, "--overwrite", "--compare-random-init", "off") == 0
    assert not (out / "random-init").exists() and "random_init" in json.loads((out / "eval_results.json").read_text())


def _other(kept: str) -> str:
    return "pre-trained" if kept == "random initialisation" else "random initialisation"


def test_no_comparison_where_pretraining_paid_or_when_asked_not_to(tmp_path, caplog):
    data = _task(tmp_path)
    long_budget = _short_budget_model(tmp_path / "long-budget", steps=20_000)
    short_budget = _short_budget_model(tmp_path / "short-budget")
    for name, model, extra in (("paid", long_budget, ()), ("off", short_budget, ("--compare-random-init", "off"))):
        assert _finetune(model, data, tmp_path / name, *extra) == 0
        results = json.loads((tmp_path / name / "eval_results.json").read_text())
        assert not results["random_init"]["compare"] and not (tmp_path / name / "random-init").exists()
    short_inputs = _task(tmp_path, words=3, name="short.jsonl")
    assert _finetune(short_budget, short_inputs, tmp_path / "short-inputs") == 0
    decision = json.loads((tmp_path / "short-inputs" / "eval_results.json").read_text())["random_init"]
    assert decision == {"compare": False,
                        "reason": "auto: pre-training was not measured to lose on these inputs at this budget"}
    # auto without a dev set cannot compare, and says so
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert _finetune(short_budget, data, tmp_path / "no-dev", dev=False) == 0
    assert any("no --dev to compare on" in r.getMessage() for r in caplog.records)
    assert not (tmp_path / "no-dev" / "random-init").exists()


def test_on_is_refused_where_it_cannot_compare(tmp_path, capsys):
    data = _task(tmp_path)
    from bertkit.tokenizer import WordPieceTokenizer

    WordPieceTokenizer(TOKENS).save_pretrained(tmp_path / "vocab")
    assert _finetune("bert-debug", data, tmp_path / "preset", "--compare-random-init", "on") == 2
    assert "--model bert-debug is random initialisation already" in capsys.readouterr().err
    assert _finetune(_short_budget_model(tmp_path / "m"), data, tmp_path / "x", "--compare-random-init", "on",
                     dev=False) == 2
    assert "--compare-random-init on compares dev scores: give --dev" in capsys.readouterr().err
    assert not (tmp_path / "preset").exists() and not (tmp_path / "x").exists()  # refused before anything is written


def _run(directory: Path, scores: list[float], tag: str) -> dict:
    """A finished fine-tuning run's layout: best/ (tagged), its dev predictions, and its results."""
    (directory / "best").mkdir(parents=True, exist_ok=True)
    (directory / "best" / "tag").write_text(tag)
    (directory / "predictions.jsonl").write_text(tag)
    seeds = {str(i + 1): {"accuracy": score, "step": 4} for i, score in enumerate(scores)}
    return {"accuracy": max(scores), "step": 4, "best_seed": 1, "seeds": seeds, "learning_rate": 1e-3}


def test_keeping_the_better_moves_nothing_it_cannot_move_back(tmp_path):
    """Random initialisation kept: the pre-trained best is set aside with its predictions; a later choice of the
    pre-trained model (a resumed run with more seeds) puts it back; every step can run twice."""
    out = tmp_path / "out"
    decision = {"compare": True, "reason": "test"}
    pretrained = _run(out, [0.5, 0.6], "pretrained")
    random_init = _run(out / "random-init", [0.7, 0.8], "random")
    for _ in range(2):  # idempotent: a run killed after the choice makes it again
        results = keep_better_initialisation(out, "accuracy", pretrained, random_init, decision)
        assert results["random_init"]["kept"] == "random initialisation" and results["accuracy"] == 0.8
        assert (out / "best" / "tag").read_text() == "random" and (out / "predictions.jsonl").read_text() == "random"
        assert (out / "pretrained-best" / "tag").read_text() == "pretrained"
        assert (out / "pretrained-best" / "predictions.jsonl").read_text() == "pretrained"
        assert (out / "random-init" / "best" / "tag").read_text() == "random"  # the source stays
        assert json.loads((out / "eval_results.json").read_text())["random_init"]["kept"] == "random initialisation"
    assert results["random_init"]["p_value"] is not None and results["random_init"]["difference"] == pytest.approx(0.2)

    more = {str(seed): {"accuracy": 0.99, "step": 4} for seed in (3, 4)}  # mean 0.77 against 0.75
    better = {**pretrained, "seeds": {**pretrained["seeds"], **more}}
    results = keep_better_initialisation(out, "accuracy", better, random_init, decision)
    assert results["random_init"]["kept"] == "pre-trained"
    assert (out / "best" / "tag").read_text() == "pretrained"
    assert (out / "predictions.jsonl").read_text() == "pretrained"
    assert not (out / "pretrained-best").exists()
    assert json.loads((out / "best" / INITIALISATION_FILE).read_text())["kept"] == "pre-trained"

    tie = keep_better_initialisation(tmp_path / "tie", "accuracy", _run(tmp_path / "tie", [0.5], "pretrained"),
                                     _run(tmp_path / "tie" / "random-init", [0.5], "random"), decision)
    assert tie["random_init"]["kept"] == "pre-trained" and tie["random_init"]["p_value"] is None


def test_a_stale_aside_is_dropped_and_a_run_that_no_longer_compares_gets_its_own_model_back(tmp_path):
    """A resumed seed promoted into OUTPUT/best makes the aside stale; a run that no longer compares (off, or auto
    deciding otherwise) puts the pre-trained best back, with no choice left written in it."""
    out = tmp_path / "out"
    decision = {"compare": True, "reason": "test"}
    pretrained, random_init = _run(out, [0.5], "pretrained"), _run(out / "random-init", [0.7], "random")
    keep_better_initialisation(out, "accuracy", pretrained, random_init, decision)
    _run(out / "seed-3", [0.99], "pretrained seed 3")  # the resumed seed 3, better, promoted into OUTPUT/best
    (out / "best").rename(tmp_path / "random-copy")
    (out / "seed-3" / "best").rename(out / "best")
    better = {**pretrained, "seeds": {"1": {"accuracy": 0.5, "step": 4}, "3": {"accuracy": 0.99, "step": 4}}}
    assert keep_better_initialisation(out, "accuracy", better, random_init, decision)["random_init"]["kept"] == \
        "pre-trained"
    assert (out / "best" / "tag").read_text() == "pretrained seed 3" and not (out / "pretrained-best").exists()

    keep_better_initialisation(tmp_path / "b", "accuracy", _run(tmp_path / "b", [0.5], "pretrained"),
                               _run(tmp_path / "b" / "random-init", [0.7], "random"), decision)
    restore_pretrained(tmp_path / "b")
    assert (tmp_path / "b" / "best" / "tag").read_text() == "pretrained"
    assert (tmp_path / "b" / "predictions.jsonl").read_text() == "pretrained"
    assert not (tmp_path / "b" / "pretrained-best").exists()
    assert not (tmp_path / "b" / "best" / INITIALISATION_FILE).exists()
    restore_pretrained(tmp_path / "b")  # nothing to do twice
    assert (tmp_path / "b" / "best" / "tag").read_text() == "pretrained"


def test_a_resume_that_no_longer_compares_scores_what_its_results_say(tmp_path):
    """End to end: a run whose OUTPUT/best holds random initialisation, resumed with --compare-random-init off, ends
    with the pre-trained model's best in OUTPUT/best, as its eval_results.json says."""
    model, data, out = _short_budget_model(tmp_path / "model"), _task(tmp_path), tmp_path / "out"
    assert _finetune(model, data, out, "--compare-random-init", "on") == 0
    results = json.loads((out / "eval_results.json").read_text())
    if results["random_init"]["kept"] == "pre-trained":  # make random initialisation the kept one, as it can be
        pretrained = {**results, "seeds": {"1": {"accuracy": 0.0, "step": 1}}}
        random_init = json.loads((out / "random-init" / "eval_results.json").read_text())
        keep_better_initialisation(out, "accuracy", pretrained, random_init, results["random_init"])
    pretrained_model = (out / "pretrained-best" / "model.safetensors").read_bytes()
    assert json.loads((out / "best" / INITIALISATION_FILE).read_text())["kept"] == "random initialisation"
    assert _finetune(model, data, out, "--compare-random-init", "off", "--resume", "auto") == 0
    assert (out / "best" / "model.safetensors").read_bytes() == pretrained_model
    assert not (out / "best" / INITIALISATION_FILE).exists() and not (out / "pretrained-best").exists()
    assert json.loads((out / "eval_results.json").read_text())["random_init"]["compare"] is False


def test_glue_scores_the_model_given_and_a_damaged_pretraining_record_is_said(tmp_path, caplog):
    from bertkit.cli.glue import glue
    from bertkit.settings import FinetuneSettings
    from bertkit.workflows.finetune import model_source

    assert "--compare-random-init" not in [opt for param in glue.params for opt in param.opts]
    model = _short_budget_model(tmp_path / "model")
    (model / "bertkit_pretraining.json").write_text('{"steps": 100, "trained_')
    with caplog.at_level(logging.WARNING):
        source = model_source(FinetuneSettings.of(model=str(model), output=tmp_path / "out"))
    assert source.pretraining == {} and source.trained_positions is None
    [said] = [r.getMessage() for r in caplog.records if "bertkit_pretraining.json" in r.getMessage()]
    assert "not readable JSON, so the model is taken as pre-trained elsewhere to convergence" in said
    (model / "bertkit_pretraining.json").write_text('{"steps": "100", "trained_positions": 8}')
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        model_source(FinetuneSettings.of(model=str(model), output=tmp_path / "out"))
    assert any("its step count '100' is not a whole number" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_between_the_last_seed_and_the_choice_says_how_to_continue(tmp_path, monkeypatch, capsys, signum):
    """Ctrl-C or SIGTERM (a scheduler's stop) outside every training loop (here: as the better initialisation is being
    kept) ends in one line naming the signal, exit 128 + its number, with the command that continues the run, and
    the resumed run makes the choice."""
    import bertkit.workflows.finetune as workflow

    model = _short_budget_model(tmp_path / "model")
    data = _task(tmp_path)
    real_keep = workflow.keep_better_initialisation

    def stopped(*args, **kwargs):
        # SIGINT arrives as KeyboardInterrupt, as a terminal's Ctrl-C does; raised in this thread (os.kill may hand it
        # to one of torch's threads, and the main thread then returns from here before Python runs the handler)
        signal.raise_signal(signum)

    monkeypatch.setattr(workflow, "keep_better_initialisation", stopped)
    assert _finetune(model, data, tmp_path / "out", "--seeds", "1") == 128 + signum
    err = capsys.readouterr().err
    assert f"fine-tuning stopped by {signal.Signals(signum).name} between training loops" in err
    continue_line = next(line for line in err.splitlines() if line.startswith("continue with: bertkit finetune"))
    assert continue_line.endswith("--resume auto")
    monkeypatch.setattr(workflow, "keep_better_initialisation", real_keep)
    assert _finetune(model, data, tmp_path / "out", "--seeds", "1", "--resume", "auto") == 0
    assert json.loads((tmp_path / "out" / "eval_results.json").read_text())["random_init"]["kept"]


def test_a_signal_between_loops_is_served_once_and_continues_only_a_recorded_run(tmp_path):
    """SIGTERM twice (a scheduler, then torchrun) stops once; the continue line comes only once this run's record
    is written (a record older than the command is the run --overwrite is removing); the old handler returns."""
    import time

    from bertkit.errors import Interrupted
    from bertkit.workflows.run_output import RUN_FILE, stop_between_loops

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Interrupted) as stopped, stop_between_loops(tmp_path):
        (tmp_path / RUN_FILE).write_text("{}")
        try:
            signal.raise_signal(signal.SIGTERM)  # in this thread, so handled here (os.kill may pick another)
        finally:
            signal.raise_signal(signal.SIGTERM)  # the second of the same request: ignored
    assert stopped.value.resume_flag == "--resume auto" and stopped.value.exit_code == 143
    assert "between training loops" in str(stopped.value)
    assert signal.getsignal(signal.SIGTERM) is before
    old = time.time() - 3600
    os.utime(tmp_path / RUN_FILE, (old, old))
    with pytest.raises(Interrupted) as stopped, stop_between_loops(tmp_path):
        raise KeyboardInterrupt
    assert stopped.value.resume_flag is None and "before the run started" in str(stopped.value)
    assert stopped.value.exit_code == 130


def test_every_command_that_trains_seeds_stops_between_loops_in_one_line():
    """finetune, distill (both kinds) and embedding training run several training loops: each is wrapped."""
    from bertkit.workflows.distill import run_distillation
    from bertkit.workflows.distill_embedding import run_embedding_distillation
    from bertkit.workflows.embedding import run_embedding_training
    from bertkit.workflows.finetune import run_finetuning

    for run in (run_finetuning, run_distillation, run_embedding_distillation, run_embedding_training):
        assert run.__wrapped__ is not run and "settings" in inspect.signature(run.__wrapped__).parameters


def test_a_run_no_better_than_the_commonest_dev_label_says_so(tmp_path, caplog):
    """eval_results.json holds what always answering the first dev set's commonest label scores, and a run whose
    best seed does not beat it says so in one line (a model that learned nothing otherwise reports 90% here)."""
    from bertkit.workflows.finetune import warn_at_majority  # noqa: PLC0415

    data = _task(tmp_path, words=3)
    rows = [json.dumps({"text": "good film" if i else "bad plot", "label": "good" if i else "bad"}) for i in range(10)]
    dev = tmp_path / "dev.jsonl"
    dev.write_text("\n".join(rows) + "\n", encoding="utf-8")
    argv = ["finetune", "classification", "--model", "bert-debug", "--tokenizer", str(_vocab(tmp_path)), "--train",
            str(data), "--dev", str(dev), "--output", str(tmp_path / "out"), "--epochs", "1",
            "--learning-rate", "1e-12", "--precision", "fp32", "--device", "cpu", "--max-seq-length", "16"]
    with caplog.at_level(logging.WARNING):
        assert main(argv) == 0
    results = json.loads((tmp_path / "out" / "eval_results.json").read_text())
    assert results["dev_majority"] == {"label": "good", "accuracy": 0.9}
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("no seed scores more on dev")]
    assert len(said) == 1 and "always answering its commonest label 'good' (0.9000)" in said[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        warn_at_majority({"dev_majority": {"label": "good", "accuracy": 0.9}, "summary": {"accuracy": {"max": 0.95}}})
        warn_at_majority({"summary": {"accuracy": {"max": 0.5}}})  # no majority: a regression, another metric
    assert not caplog.records


def _vocab(tmp_path: Path) -> Path:
    from .conftest import TOKENS as tokens  # noqa: PLC0415

    directory = tmp_path / "vocab"
    directory.mkdir(exist_ok=True)
    (directory / "vocab.txt").write_text("\n".join(tokens) + "\n", encoding="utf-8")
    return directory
