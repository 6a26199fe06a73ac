"""`bertkit quickstart` end to end on the bundled corpus with a 30-step budget and a small labelled
subset: the report, its figures and the comparison exist, every stage's directory loads with the normal
tools, `--resume` reuses finished stages, a non-empty output directory is refused, and Ctrl-C stops the
whole command (exit 130) while `--resume` finishes it and reports the whole run; `--minutes` is split by
a plan from measured rates (tested with injected ones) that a resumed run keeps.

The tests that run the whole command are marked slow (`pytest -m slow tests/quickstart/test_quickstart.py`): three real
quickstart runs took 16 of the default suite's 20 minutes on a 2-core VM; the rest (flags, the plan, the
figure, the refused output) stay in the default suite."""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

import pytest

from bertkit.cli import main
from bertkit.data import PretrainingDataset
from bertkit.errors import BertkitError
from bertkit.quickstart import QuickstartSettings, Rates, plan_time, prepare_output
from bertkit.quickstart.plan import REPORT_S, FinetuneWork
from bertkit.serve.predictor import load_predictor
from bertkit.tokenizer import WordPieceTokenizer

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    output = tmp_path_factory.mktemp("quickstart") / "qs"
    code = main(["quickstart", "--output", str(output), "--max-steps", "30", "--seeds", "1,2",
                 "--finetune-epochs", "1", "--train-examples", "120", "--device", "cpu"])
    assert code == 0
    return output


@pytest.mark.slow
def test_report_figures_and_summary(run):
    report = (run / "report.md").read_text(encoding="utf-8")
    for heading in ("## Pre-training", "## Fill-mask", "## Fine-tuning: pre-trained vs random initialisation"):
        assert heading in report
    assert "| **mean ± std** |" in report and "Gain from pre-training" in report
    for figure in ("pretraining.png", "finetuning.png"):
        assert f"]({figure})" in report
        assert (run / figure).read_bytes()[:8] == PNG_MAGIC
    summary = json.loads((run / "quickstart.json").read_text(encoding="utf-8"))
    for init in ("pretrained", "random"):
        table = summary["finetuning"][init]
        assert set(table["seeds"]) == {"1", "2"}
        dev = [seed["dev"] for seed in table["seeds"].values()]
        assert table["dev"]["mean"] == pytest.approx(sum(dev) / 2)
        assert all(0.0 <= seed["test"] <= 1.0 for seed in table["seeds"].values())
    assert summary["pretraining"]["steps"] >= 1
    assert "mlm_accuracy" in summary["pretraining"]["final_eval"]
    assert next(item["text"] for item in summary["fill_mask"]).startswith("In the beginning")
    assert summary["dev_majority"] == {"label": "history", "share": pytest.approx(0.289)}  # docs/finetuning.md
    assert "Always answering the majority class (history) scores 28.9% on dev" in report


@pytest.mark.slow
def test_every_stage_loads_with_the_normal_tools(run):
    tokenizer = WordPieceTokenizer.from_pretrained(run / "vocab")
    assert tokenizer.vocab_size == 8000
    data = PretrainingDataset(run / "data")
    assert len(data) > 1000 and data.vocab_hash == tokenizer.vocab_hash
    guesses = load_predictor(run / "pretrain" / "final").fill_mask(["the [MASK] of god"], top_k=3)
    assert len(guesses[0][0]) == 3
    for init in ("pretrained", "random"):
        predictor = load_predictor(run / f"finetune-{init}" / "best")
        label = predictor.classify(["Blessed are the meek: for they shall inherit the earth."])[0]
        assert label["label"] in {"law", "history", "wisdom", "prophets", "gospels", "letters"}


@pytest.mark.slow
def test_resume_keeps_finished_stages(run):
    weights = run / "pretrain" / "final" / "model.safetensors"
    before = weights.stat().st_mtime_ns
    code = main(["quickstart", "--output", str(run), "--max-steps", "30", "--seeds", "1,2",
                 "--finetune-epochs", "1", "--train-examples", "120", "--device", "cpu", "--resume"])
    assert code == 0
    assert weights.stat().st_mtime_ns == before


def test_non_empty_output_is_refused(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine", encoding="utf-8")
    assert main(["quickstart", "--output", str(tmp_path), "--minutes", "0.1"]) == 2
    assert "is not empty" in capsys.readouterr().err
    with pytest.raises(BertkitError, match="notes.txt"):  # --overwrite never deletes what it did not write
        prepare_output(QuickstartSettings(output=tmp_path, overwrite=True))


@pytest.mark.parametrize("flags, message", [(["--minutes", "0"], "--minutes must be positive"),
                                            (["--max-steps", "0"], "--max-steps must be positive"),
                                            (["--seeds", "1,1"], "repeated"),
                                            (["--train-examples", "5000"], "only 4000")])
def test_bad_flags(tmp_path, capsys, flags, message):
    assert main(["quickstart", "--output", str(tmp_path / "out"), *flags]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.slow
def test_sigint_stops_the_whole_quickstart_and_resume_reports_the_whole_run(tmp_path, monkeypatch, capsys):
    import bertkit.tasks.pretraining as pretraining

    real_loss, calls = pretraining.PretrainingObjective.__call__, {"n": 0}

    def interrupting_loss(self, model, batch, totals):
        calls["n"] += 1
        if calls["n"] == 5:  # Ctrl-C during the fifth pre-training step
            os.kill(os.getpid(), signal.SIGINT)
        return real_loss(self, model, batch, totals)

    output = tmp_path / "qs"
    args = ["quickstart", "--output", str(output), "--max-steps", "12", "--seeds", "1", "--finetune-epochs", "1",
            "--train-examples", "60", "--device", "cpu", "--no-baseline"]
    monkeypatch.setattr(pretraining.PretrainingObjective, "__call__", interrupting_loss)
    assert main(args) == 130
    err = capsys.readouterr().err
    assert "quickstart stopped by SIGINT while pre-training, at step 5" in err
    assert err.rstrip().endswith("--no-baseline --resume") and "Traceback" not in err
    assert not (output / "finetune-pretrained").exists() and not (output / "report.md").exists()
    first = json.loads((output / "timings.json").read_text())["pretraining_s"]
    monkeypatch.setattr(pretraining.PretrainingObjective, "__call__", real_loss)
    assert main([*args, "--resume"]) == 0
    summary = json.loads((output / "quickstart.json").read_text(encoding="utf-8"))
    assert summary["pretraining"]["steps"] == 12  # the whole run: 5 steps, then 7 more
    assert summary["timings"]["pretraining_s"] > first  # both runs' time
    report = (output / "report.md").read_text(encoding="utf-8")
    batch = summary["recipe"]["batch_size"]  # the threshold is in sequences: 1,000 steps of 32, 2,000 of 16
    assert f"Pre-training ran 12 steps of {batch} sequences: below the ~{32_000 // batch:,} steps" in report
    assert "(--no-baseline)" in report and "| **mean** |" in report and "±" not in report.split("## Fine-tuning")[1]


def _finetuning_runs(output: Path, accuracies: dict[str, dict[int, list[float]]]) -> None:
    """finetune-NAME/seed-N/metrics.jsonl with one evaluation per epoch (32 steps an epoch)."""
    for name, seeds in accuracies.items():
        for seed, per_epoch in seeds.items():
            run = output / f"finetune-{name}" / f"seed-{seed}"
            run.mkdir(parents=True)
            records = [{"kind": "eval", "step": 32 * epoch, "accuracy": accuracy}
                       for epoch, accuracy in enumerate(per_epoch, start=1)]
            (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


def test_the_finetuning_figure_tells_seeds_apart_with_integer_epochs_and_the_majority_class(tmp_path):
    """Seeds stuck at the majority class used to share one colour and hide each other; epochs had ticks
    at 1.5, 2.5; nothing showed what the majority class scores."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_hex

    from bertkit.quickstart.report import finetuning_figure, majority_class, plot_finetuning

    at_majority = [0.289] * 3
    _finetuning_runs(tmp_path, {"pretrained": {1: [0.50, 0.51, 0.53], 2: [0.52, 0.52, 0.55], 10: [0.54, 0.56, 0.55]},
                                "random": {1: at_majority, 2: at_majority, 10: [0.289, 0.31, 0.43]}})
    assert majority_class(["history"] * 289 + ["law"] * 711) == {"label": "law", "share": 0.711}
    figure = finetuning_figure(tmp_path, ["pretrained", "random"], {"label": "history", "share": 0.289})
    [axis] = figure.axes
    seeds = [line for line in axis.lines if line.get_linestyle() == "-"]
    assert [line.get_label() for line in seeds] == [f"{name}, seed {n}" for name in ("pretrained", "random")
                                                    for n in (1, 2, 10)]
    assert len({to_hex(line.get_color()) for line in seeds}) == 6  # a colour per initialisation and seed
    assert len({line.get_marker() for line in seeds[:3]}) == 3
    first_points = {(line.get_xdata()[0], line.get_ydata()[0]) for line in seeds}
    assert len(first_points) == 6  # seeds at the majority class stay visible side by side
    [dashed] = [line for line in axis.lines if line.get_linestyle() == "--"]
    assert list(dashed.get_ydata()) == [28.9, 28.9] and "majority class (history): 28.9%" in dashed.get_label()
    figure.canvas.draw()
    ticks = [t for t in axis.get_xticks() if axis.get_xlim()[0] <= t <= axis.get_xlim()[1]]
    assert ticks == [1, 2, 3]
    plt.close(figure)
    _finetuning_runs(tmp_path / "one", {"pretrained": {1: [0.125]}, "random": {1: [0.125]}})
    figure = finetuning_figure(tmp_path / "one", ["pretrained", "random"])  # one epoch: still the tick 1 alone
    figure.canvas.draw()
    [axis] = figure.axes
    assert [t for t in axis.get_xticks() if axis.get_xlim()[0] <= t <= axis.get_xlim()[1]] == [1]
    plt.close(figure)
    assert plot_finetuning(tmp_path, ["pretrained"], tmp_path / "f.png").read_bytes()[:8] == PNG_MAGIC  # no majority


RATES = Rates(pretrain_steps_per_s=4.4, finetune_steps_per_s=12.0, eval_examples_per_s=900.0)  # 2 idle cores
WORK = FinetuneWork(runs_per_seed=2, train_examples=1000, batch_size=32, eval_examples=2000)


def test_the_time_plan_gives_pretraining_the_rest_and_shortens_finetuning_for_short_budgets():
    ten = plan_time(600, 5, RATES, WORK, epochs=5, seeds=(1, 2, 3))
    assert (ten.finetune_epochs, ten.seeds, ten.shortened) == (5, (1, 2, 3), "")
    assert ten.finetune_s == pytest.approx(WORK.seconds(5, 3, RATES))
    assert ten.pretrain_s == pytest.approx(600 - 5 - REPORT_S - ten.finetune_s)
    assert ten.pretrain_s * RATES.pretrain_steps_per_s > 1500  # past where the study saw a gain
    three = plan_time(180, 5, RATES, WORK, epochs=5, seeds=(1, 2, 3))  # 5 epochs x 3 seeds would take ~159 s
    assert (three.finetune_epochs, three.seeds) == (2, (1, 2)) and three.finetune_s <= 0.3 * (180 - 5 - REPORT_S)
    assert three.shortened == "fine-tuning epochs 5 -> 2, seeds 1,2,3 -> 1,2 to leave pre-training most of the time"
    assert three.pretrain_s + three.finetune_s + REPORT_S + 5 == pytest.approx(180)
    kept = plan_time(240, 5, RATES, WORK, epochs=5, seeds=(1, 2, 3), epochs_fixed=True, seeds_fixed=True)
    assert (kept.finetune_epochs, kept.seeds) == (5, (1, 2, 3))
    assert kept.pretrain_s == pytest.approx(240 - 13 - 158.7, abs=0.1)
    slow = Rates(1.0, 2.0, 150.0)  # a busy machine: shorter fine-tuning, and the plan says so
    assert plan_time(600, 5, slow, WORK, epochs=5, seeds=(1, 2, 3)).seeds == (1, 2)
    with pytest.raises(BertkitError, match=r"--minutes 0.5 is too short here: .* give --minutes \d+ or more"):
        plan_time(30, 5, RATES, WORK, epochs=5, seeds=(1, 2, 3))


@pytest.mark.slow
def test_minutes_bound_the_whole_command_with_a_plan_that_a_resume_keeps(tmp_path, monkeypatch, capsys):
    import bertkit.quickstart.stages as stages

    measured = []
    monkeypatch.setattr(stages, "measure_rates", lambda *a: measured.append(a) or Rates(20.0, 50.0, 5000.0))
    output = tmp_path / "qs"
    args = ["quickstart", "--output", str(output), "--minutes", "1", "--seeds", "1", "--train-examples", "60",
            "--device", "cpu", "--no-baseline"]
    assert main(args) == 0
    out = capsys.readouterr().out
    plan = json.loads((output / "plan.json").read_text())
    assert "time plan: 1 min: set-up, vocabulary and data" in out and plan["finetune_epochs"] == 5
    assert len(measured) == 1
    summary = json.loads((output / "quickstart.json").read_text())
    assert summary["plan"] == plan and summary["pretraining"]["elapsed_s"] <= 1.5 * plan["pretrain_s"] + 10
    report = (output / "report.md").read_text()
    assert "Time budget 1 min, planned from throughput measured on this machine" in report and "Spent: " in report
    # One total (issue 51: the plan, the report and the last line disagreed): the report's is the last line's.
    total = re.search(r"([0-9.]+) min in all", report).group(1)
    assert f"(the whole command took {total} min of the 1-minute budget)" in out
    assert "speed probe" in report.split("Spent: ")[1] and "set-up" in report.split("Spent: ")[1]
    assert main([*args, "--resume"]) == 0
    assert len(measured) == 1 and "time plan (kept from the first run)" in capsys.readouterr().out


def test_the_prediction_cap_follows_the_recipes_rate_and_length():
    """The quickstart's data is built with Google's cap for its own rate: 30% of 64 tokens by default, and a Recipe
    with another rate or length gets its own, not a cap computed for the default (which masks silently less)."""
    from bertkit.quickstart.config import Recipe

    short = Recipe().resolved()
    assert (short.masked_lm_prob, short.max_seq_length, Recipe().prediction_cap) == (0.3, 64, 19)
    assert Recipe(masked_lm_prob=0.4).prediction_cap == 26 and Recipe(max_seq_length=128).prediction_cap == 38
    assert Recipe(max_predictions_per_seq=7).prediction_cap == 7


def test_the_quickstart_pretrains_through_the_recipe_planner(tmp_path, monkeypatch):
    """The quickstart does not restate the short recipe (issue 47): it asks `pretrain` for `--recipe short` with
    every recipe field unset but the objective, so the planner fills them as for `bertkit pretrain --recipe short`;
    a field its Recipe sets is passed as the user's. The objective is decided on the plan's steps and passed, so the
    line it prints and the run agree."""
    from types import SimpleNamespace

    import bertkit.workflows.pretrain as pretraining
    from bertkit.quickstart.config import Recipe
    from bertkit.quickstart.stages import pretrain_model
    from bertkit.workflows.recipes import apply_recipe, short_recipe

    seen = {}
    monkeypatch.setattr(pretraining, "pretrain", lambda what, train: seen.update(what=what, train=train)
                        or SimpleNamespace(stop_reason="done", signal=None))
    echoed: list[str] = []
    pretrain_model(QuickstartSettings(output=tmp_path, max_steps=5), echoed.append)
    what, train = seen["what"], seen["train"]
    assert what.recipe == "short" and (what.dropout, what.max_seq_length, what.masked_lm_prob) == (None,) * 3
    assert what.nsp is False  # the short recipe's objective: masked LM only
    assert (train.learning_rate, train.warmup_ratio, train.global_batch_size, train.micro_batch_size) == (None,) * 4
    shape = SimpleNamespace(directory="data", dynamic=True, nsp=True, layout="pairs", built_seq_length=64)
    what, train, _ = apply_recipe(short_recipe(256), what, train, shape, 1)  # what the planner makes of it
    shown = Recipe().resolved()
    assert (train.learning_rate, train.global_batch_size, what.dropout) == (shown.learning_rate, shown.batch_size,
                                                                           shown.dropout)
    assert f"batch {shown.batch_size}, peak lr {shown.learning_rate:g}" in echoed[0]
    settings = QuickstartSettings(output=tmp_path, max_steps=5, recipe=Recipe(learning_rate=1e-3))
    pretrain_model(settings, echoed.append)
    assert seen["train"].learning_rate == 1e-3 and "peak lr 0.001" in echoed[-1]
    # the line says the objective the planner will choose: masked LM only
    assert "MLM only" in echoed[-1]
    pretrain_model(QuickstartSettings(output=tmp_path, max_steps=6000), echoed.append, None, 6000)
    assert "MLM only" in echoed[-1] and seen["what"].nsp is False and not short_recipe(256, 6000).nsp
    pretrain_model(QuickstartSettings(output=tmp_path, max_steps=6000, resume=True), echoed.append, None, 6000)
    assert seen["what"].nsp is None  # a resumed run keeps the objective it recorded, whatever the new estimate


def test_the_time_lines_name_the_probe_and_add_up():
    """The plan's line splits what was spent before planning into set-up/vocabulary/data and the speed probe
    (issue 51: "vocabulary + data 21 s" in the plan, 6 s in the report), and claims no more steps than the rate."""
    from bertkit.quickstart.report import _report_time

    plan = plan_time(180, 12, RATES, WORK, epochs=5, seeds=(1, 2, 3), probe_s=9)
    assert "set-up, vocabulary and data 3 s and the speed probe 9 s (done)" in plan.describe()
    assert "up to ~" in plan.describe()
    timings = {"setup_s": 1.0, "vocabulary_and_data_s": 2.0, "speed_probe_s": 9.0, "pretraining_s": 100.0,
               "finetuning_s": 60.0, "report_s": 8.0}
    line = _report_time({"timings": timings, "plan": plan.to_json()})
    assert "set-up 1 s, vocabulary + data 2 s, speed probe 9 s, pre-training 100 s" in line
    assert f"{sum(timings.values()) / 60:.1f} min in all" in line


def test_the_quickstart_says_up_front_when_its_task_is_too_long_for_its_budget(tmp_path):
    """Issue 48, item 4: before pre-training, the quickstart says when most of its task's training inputs are
    longer than the instances pre-training trains on at a budget measured too short for them; the bundled verses
    (a median of 32 tokens) are not."""
    from bertkit.quickstart.stages import say_long_inputs

    class Lengths:
        """A tokenizer giving every text `length` ids."""

        def __init__(self, length: int) -> None:
            self.length = length

        def encode_ids(self, texts):
            return [[5] * self.length for _ in texts]

    settings = QuickstartSettings(tmp_path, minutes=None, max_steps=100)
    said: list[str] = []
    say_long_inputs(settings, Lengths(200), None, said.append)
    assert len(said) == 1 and said[0].startswith("      warning: 100% of the inputs are longer than the 64 tokens")
    said.clear()
    say_long_inputs(settings, Lengths(20), None, said.append)
    bert_base = Path(__file__).resolve().parents[1] / "assets" / "vocab" / "bert-base-uncased"
    say_long_inputs(settings, WordPieceTokenizer.from_pretrained(bert_base), None, said.append)  # the verses
    say_long_inputs(QuickstartSettings(tmp_path, minutes=None, max_steps=100_000), Lengths(200), None, said.append)
    assert said == []
    timed = QuickstartSettings(tmp_path, minutes=10.0)  # a time budget: its steps are the plan's
    for rate, warned in ((5.0, True), (100.0, False)):  # ~2,900 steps planned / ~58,000
        plan = plan_time(600, 5, Rates(rate, 2.0, 150.0), WORK, epochs=5, seeds=(1, 2, 3))
        said.clear()
        say_long_inputs(timed, Lengths(200), plan, said.append)
        assert bool(said) == warned, (plan.pretrain_s * rate, said)
