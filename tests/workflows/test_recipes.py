"""Recipes that follow the budget: the pre-training recipe as a pure function of the budget and the
measured throughput (injected here), the fine-tuning learning rate as one of the model's width and
pre-training, truncation of longer instances at load, and a tiny `bertkit pretrain` end to end whose
recipe is chosen, printed, overridable by flag and kept on resume."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import re
from pathlib import Path

import numpy as np
import pytest

from bertkit.cli import main
from bertkit.data import InstanceSettings, PretrainingDataset, build_pretraining_data
from bertkit.errors import BertkitError
from bertkit.settings import PretrainingDataSettings
from bertkit.tokenizer import WordPieceTokenizer
from bertkit.workflows import pretrain_plan
from bertkit.workflows.recipe_notes import long_input_budget, long_input_note, long_input_task_note, vocabulary_note
from bertkit.workflows.recipes import (
    PAPER_MIN_STEPS,
    budget_steps,
    choose_recipe,
    finetune_learning_rate,
    full_length_step,
    short_recipe,
)


@pytest.mark.parametrize(("max_steps", "max_time_s", "rate", "expected"), [
    (None, 600, 4.4, 2640.0),  # ten minutes of bert-mini on 2 CPU cores
    (5000, 600, 4.4, 2640.0),  # the smaller of the two budgets
    (5000, None, None, 5000.0),
    (None, 600, None, None),  # a time budget without a measurement: unknown
    (None, None, None, None),
])
def test_budget_in_steps(max_steps, max_time_s, rate, expected):
    assert budget_steps(max_steps, max_time_s, rate) == expected


def test_auto_picks_the_short_recipe_below_the_papers_budget_and_the_paper_above():
    ten_cpu_minutes = choose_recipe("auto", 256, budget_steps(None, 600, 4.4))
    assert (ten_cpu_minutes.name, ten_cpu_minutes.max_seq_length, ten_cpu_minutes.dropout) == ("short", 64, 0.0)
    # issue 37's measured levers, together: batch 16, 30% masking, the one-cycle schedule (peak at half the budget)
    assert (ten_cpu_minutes.batch_size, ten_cpu_minutes.masked_lm_prob, ten_cpu_minutes.nsp) == (16, 0.3, False)
    assert ten_cpu_minutes.learning_rate == pytest.approx(5e-4) and ten_cpu_minutes.warmup_ratio == 0.5
    assert "~2,640 steps: too few for the paper's schedule" in ten_cpu_minutes.reason
    a_gpu_day = choose_recipe("auto", 768, budget_steps(None, 86_400, 12.0))  # ~1M steps
    assert (a_gpu_day.name, a_gpu_day.learning_rate, a_gpu_day.max_seq_length) == ("paper", 1e-4, None)
    assert choose_recipe("auto", 256, PAPER_MIN_STEPS - 1).name == "short"
    assert choose_recipe("auto", 256, PAPER_MIN_STEPS).name == "paper"
    assert choose_recipe("auto", 256, None).name == "paper"  # an epoch budget: nothing to shorten
    assert choose_recipe("paper", 256, 100).name == "paper" and choose_recipe("short", 256, 10**7).name == "short"
    # a bertkit short-budget run given to --init-from goes on with the budget's recipe, and the line says why
    goes_on = choose_recipe("auto", 256, 10_000, init="short")
    assert goes_on.name == "short" and goes_on.reason.startswith("--init-from a bertkit short-budget run, so the "
                                                                 "budget's recipe: ~10,000 steps: too few")
    assert "--init-from" not in ten_cpu_minutes.reason
    with pytest.raises(BertkitError, match="--recipe 'fast'"):
        choose_recipe("fast", 256, 100)


def test_learning_rates_scale_with_width():
    assert short_recipe(256).learning_rate == pytest.approx(5e-4)
    assert short_recipe(768).learning_rate == pytest.approx(5e-4 / math.sqrt(3))
    assert finetune_learning_rate(768, {})[0] == pytest.approx(5e-5)  # BERT-Base from elsewhere: the paper's
    assert finetune_learning_rate(256, {})[0] == pytest.approx(5e-5 * math.sqrt(3))  # 12 layers: width alone
    assert finetune_learning_rate(256, None)[0] == pytest.approx(3e-4)  # random initialisation
    rate, reason = finetune_learning_rate(256, {"steps": 2600})
    assert rate == pytest.approx(3e-4) and "pre-trained only 2,600 steps" in reason
    assert finetune_learning_rate(256, {"steps": 10**6})[0] == pytest.approx(5e-5 * math.sqrt(3))


def test_a_shallower_converged_checkpoint_takes_larger_steps():
    """Depth as well as width (measured on all-MiniLM-L6-v2, docs/pretraining.md): 6 layers of 384 get 1.4e-4
    where the width rule alone gave 7.1e-5 (5.8 points below the swept best); capped at 3e-4."""
    rate, reason = finetune_learning_rate(384, {}, num_layers=6)
    assert rate == pytest.approx(5e-5 * math.sqrt(2) * 2) and "6 layers" in reason
    assert finetune_learning_rate(1024, {}, num_layers=24)[0] == pytest.approx(5e-5 * math.sqrt(0.75) / 2)  # Large
    assert finetune_learning_rate(128, {}, num_layers=2)[0] == pytest.approx(3e-4)  # bert-tiny: the cap
    assert finetune_learning_rate(128, None, num_layers=2)[0] == pytest.approx(3e-4 * math.sqrt(2))  # untouched


@pytest.fixture(scope="module")
def data(tmp_path_factory, write_toy_corpus) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("recipe")
    corpus = write_toy_corpus(root / "corpus.txt", documents=30, sentences=(3, 8), words=(6, 20))
    tokenizer = WordPieceTokenizer.train([corpus], vocab_size=120, min_frequency=1)
    tokenizer.save_pretrained(root / "tok")
    for masking in ("static", "dynamic"):
        build_pretraining_data(PretrainingDataSettings(
            (str(corpus),), "(in memory)", str(root / masking), workers=1, quiet=True,
            instances=InstanceSettings(max_seq_length=96, dupe_factor=1, masking=masking)), tokenizer)
    return {"root": root, "tok": root / "tok", "static": root / "static", "dynamic": root / "dynamic"}


@pytest.mark.parametrize("masking", ["static", "dynamic"])
def test_instances_are_cut_at_load_by_the_pair_rule(data, masking):
    full, cut = PretrainingDataset(data[masking]), PretrainingDataset(data[masking], max_seq_length=40)
    longer = [i for i in range(len(full)) if len(full[i]["input_ids"]) > 40]
    assert longer, "the corpus must have instances over 40 tokens"
    for index in longer[:20]:
        whole, short = full[index], cut[index]
        ids, types = short["input_ids"].numpy(), short["token_type_ids"].numpy()
        assert len(ids) == 40 and short["nsp_labels"] == whole["nsp_labels"]
        a_length = int(np.argmax(types))  # [CLS] A [SEP] then B
        cls, sep = int(whole["input_ids"][0]), int(whole["input_ids"][-1])
        assert ids[0] == cls and ids[a_length - 1] == ids[-1] == sep  # [CLS] A [SEP] B [SEP] again
        if masking == "static":  # static masks are kept where their tokens are kept
            kept_labels = short["mlm_labels"].numpy()
            assert set(kept_labels[kept_labels != -100]) <= set(whole["mlm_labels"].numpy())
    with pytest.raises(BertkitError, match="statically masked"):
        PretrainingDataset(data["static"], masked_lm_prob=0.3)
    assert PretrainingDataset(data["dynamic"], masked_lm_prob=0.3).options["masked_lm_prob"] == 0.3


def test_a_higher_masking_rate_at_load_raises_the_datas_prediction_cap(data, caplog, monkeypatch):
    """--masked-lm-prob 0.3 on data built with Google's cap for 15% (20 predictions at 96 tokens) masks 30% of
    every instance, not at most 20 tokens of it, and says so once; a rate the cap already allows leaves it alone."""
    from bertkit.data import dataset

    monkeypatch.setattr(dataset, "_RAISED_CAPS_LOGGED", set())  # earlier tests raised this cap too
    assert PretrainingDataset(data["dynamic"]).options["max_predictions_per_seq"] == 20
    with caplog.at_level(logging.INFO, logger="bertkit.data.dataset"):
        raised = PretrainingDataset(data["dynamic"], masked_lm_prob=0.3)
        PretrainingDataset(data["dynamic"], masked_lm_prob=0.3)  # the held-out split: not said twice
    assert raised.options["max_predictions_per_seq"] == 29  # round(0.3 x 96)
    assert caplog.text.count("20 predictions per instance raised to 29") == 1
    long = [i for i in range(len(raised)) if len(raised[i]["input_ids"]) >= 90]
    assert long, "the corpus must have instances near 96 tokens"
    for index in long[:10]:
        item = raised[index]
        masked = int((item["mlm_labels"] != -100).sum())
        assert masked == round(0.3 * len(item["input_ids"])) > 20
    cut = PretrainingDataset(data["dynamic"], max_seq_length=64, masked_lm_prob=0.3)  # 19 fits under 20
    assert cut.options["max_predictions_per_seq"] == 20


def _pretrain(data: dict[str, Path], output: Path, *extra: str) -> int:
    return main(["pretrain", "--data", str(data["dynamic"]), "--tokenizer", str(data["tok"]), "--model", "bert-debug",
                 "--output", str(output), "--eval-examples", "8", "--eval-every", "50", "--device", "cpu",
                 "--precision", "fp32", *extra])


def test_pretrain_chooses_prints_and_records_the_recipe_and_flags_override_it(data, tmp_path, monkeypatch, caplog):
    measured = []
    monkeypatch.setattr(pretrain_plan, "measure_steps_per_second", lambda *a, **k: measured.append((*a, k)) or 0.05)
    with caplog.at_level(logging.INFO):
        assert _pretrain(data, tmp_path / "auto", "--max-time", "60", "--max-steps", "3") == 0
    record = next(r for r in caplog.records if r.getMessage().startswith("recipe "))
    assert record.levelno == logging.INFO  # information, not a warning
    line = record.getMessage()
    assert line.startswith("recipe short (~3 steps: too few for the paper's schedule")
    assert "0.05 steps/s measured on the data's instances at 64 tokens x 16 on this machine" in line
    assert "instances of 96 tokens are cut to 64 at load, so positions 64-95 stay untrained (--full-length-share" \
        in line
    assert measured and measured[0][1:3] == (64, 16)  # measured at the short recipe's shape
    too_short = [r for r in caplog.records if r.getMessage().startswith("if the inputs you will fine-tune on")]
    assert len(too_short) == 1 and too_short[0].levelno == logging.WARNING  # said up front: a 3-step budget
    assert measured[0][-1]["masked_lm_prob"] == 0.3  # and its predictions: the MLM head's cost grows with them
    assert measured[0][-1]["data"].directory == str(data["dynamic"])  # on the run's own instances
    saved = json.loads((tmp_path / "auto" / "pretrain_settings.json").read_text())
    assert saved["recipe"]["name"] == "short" and saved["train"]["learning_rate"] == pytest.approx(5e-4 * math.sqrt(8))
    settings, train = saved["settings"], saved["train"]
    assert (settings["max_seq_length"], settings["dropout"], train["warmup_ratio"]) == (64, 0.0, 0.5)
    assert (settings["masked_lm_prob"], saved["batch"]["global"]) == (0.3, 16)
    assert saved["train"]["adam_epsilon"] == 1e-6  # the original BERT optimizer's (--adam-epsilon)
    final = json.loads((tmp_path / "auto" / "final" / "bertkit_pretraining.json").read_text())
    assert final["steps"] == 3 and final["recipe"] == "short" and "mlm_accuracy" in final["last_eval"]  # applied
    caplog.clear()
    with caplog.at_level(logging.INFO):
        assert _pretrain(data, tmp_path / "mine", "--max-steps", "2", "--learning-rate", "1e-3", "--batch-size", "4",
                     "--adam-epsilon", "1e-8") == 0
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("recipe "))
    assert "your flags kept: learning_rate, batch_size" in line
    saved = json.loads((tmp_path / "mine" / "pretrain_settings.json").read_text())
    assert saved["train"]["learning_rate"] == 1e-3
    assert saved["batch"] == {"global": 4, "micro": 4, "accumulation": 1}  # --batch-size: one process, no accumulation
    assert saved["settings"]["max_seq_length"] == 64  # the rest from the recipe
    assert saved["train"]["adam_epsilon"] == 1e-8
    assert _pretrain(data, tmp_path / "paper", "--max-steps", "2", "--recipe", "paper") == 0
    saved = json.loads((tmp_path / "paper" / "pretrain_settings.json").read_text())
    assert (saved["train"]["learning_rate"], saved["settings"]["max_seq_length"]) == (1e-4, None)


def test_statically_masked_data_keeps_the_warmup_the_one_cycle_schedule_needs_30_percent_for(data, tmp_path,
                                                                                               caplog, monkeypatch):
    """The short recipe's parts paid together (issue 37): on static data, whose own masks replace the recipe's 30%,
    the recipe keeps batch 16 but not the one-cycle schedule (alone it measured worse), and says so."""
    probed = []  # the throughput probe predicts the data's own share of positions, not the recipe's 30%
    monkeypatch.setattr(pretrain_plan, "measure_steps_per_second", lambda *a, **k: probed.append(k) or 0.05)
    with caplog.at_level(logging.INFO):
        assert main(["pretrain", "--data", str(data["static"]), "--tokenizer", str(data["tok"]), "--model",
                     "bert-debug", "--output", str(tmp_path / "static"), "--eval-examples", "8", "--device", "cpu",
                     "--precision", "fp32", "--max-steps", "2", "--max-time", "60"]) == 0
    assert probed and probed[0]["masked_lm_prob"] == 0.15
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("recipe "))
    assert "statically masked, so its own masks are used and the warmup is 5%" in line and "--masking dynamic" in line
    saved = json.loads((tmp_path / "static" / "pretrain_settings.json").read_text())
    assert (saved["train"]["warmup_ratio"], saved["batch"]["global"], saved["settings"]["masked_lm_prob"]) == (
        0.05, 16, None)
    assert main(["pretrain", "--data", str(data["static"]), "--tokenizer", str(data["tok"]), "--model", "bert-debug",
                 "--output", str(tmp_path / "mine"), "--eval-examples", "8", "--device", "cpu", "--precision", "fp32",
                 "--max-steps", "2", "--warmup-ratio", "0.5"]) == 0  # a warmup the user gives is kept
    assert json.loads((tmp_path / "mine" / "pretrain_settings.json").read_text())["train"]["warmup_ratio"] == 0.5


def test_a_resumed_run_keeps_its_recipe_and_recalls_its_warning_in_one_line(data, tmp_path, monkeypatch, caplog):
    """A resume applies the recipe its run chose, and the long-input warning its start gave in full (a paragraph)
    is recalled in one line rather than printed again on every resume."""
    rates = iter([0.05, 1000.0])  # a second measurement would pick the paper's recipe
    monkeypatch.setattr(pretrain_plan, "measure_steps_per_second", lambda *a, **k: next(rates))

    def warned() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.getMessage().startswith("if the inputs you will fine")]

    with caplog.at_level(logging.INFO):
        assert _pretrain(data, tmp_path / "run", "--max-time", "60", "--max-steps", "2") == 0
    assert len(warned()) == 1  # the first start: said in full
    caplog.clear()
    with caplog.at_level(logging.INFO):
        assert _pretrain(data, tmp_path / "run", "--max-time", "60", "--max-steps", "4", "--resume", "auto") == 0
    saved = json.loads((tmp_path / "run" / "pretrain_settings.json").read_text())
    assert saved["recipe"]["name"] == "short"
    assert not warned()
    recalled = [r.getMessage() for r in caplog.records if "a resume does not repeat" in r.getMessage()]
    assert recalled == ["a resume does not repeat the warning a start with these settings gives about the inputs "
                        "you will fine-tune on (docs/pretraining.md, \"Every position a fine-tuning reads\")"]


def test_the_measurement_is_real_and_leaves_the_rng_alone():
    import torch

    from bertkit.config import preset

    torch.manual_seed(3)
    before = torch.get_rng_state()
    rate = pretrain_plan.measure_steps_per_second(preset("bert-debug", vocab_size=100), 16, 4, "fp32", "cpu",
                                                  seconds=0.1)
    assert rate > 0 and torch.equal(torch.get_rng_state(), before)


def test_finetune_learning_rate_auto_reads_the_pretraining_record(tmp_path, caplog):
    from bertkit.config import preset
    from bertkit.data.glue import TextExample
    from bertkit.model import BertForPreTraining
    from bertkit.tasks.classification import ClassificationSettings, ClassificationTask
    from bertkit.workflows.finetune import FinetuneSettings, finetune

    tokenizer = WordPieceTokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "good", "bad"])
    BertForPreTraining(preset("bert-debug", vocab_size=7)).save_pretrained(tmp_path / "model", tokenizer=tokenizer)
    (tmp_path / "model" / "bertkit_pretraining.json").write_text(json.dumps({"steps": 40}))
    examples = [TextExample(f"x:{i}", ("good", "bad")[i % 2], None, ("good", "bad")[i % 2]) for i in range(8)]
    task = ClassificationTask(ClassificationSettings(labels=["bad", "good"], max_seq_length=8))
    cfg = FinetuneSettings.of(model=str(tmp_path / "model"), output=tmp_path / "out", max_steps=1, precision="fp32",
                         device="cpu")
    with caplog.at_level(logging.INFO):  # information, not a warning
        results = finetune(task, cfg, tokenizer, examples, [("", examples)], {})
    assert results["learning_rate"] == pytest.approx(3e-4 * math.sqrt(256 / 32))
    assert any("learning rate auto: 0.00085 (pre-trained only 40 steps" in r.getMessage() for r in caplog.records)


def test_the_time_budget_counts_every_process(data, monkeypatch):
    """Under torchrun each process runs its share of the global batch, so an hour buys world-size times the steps
    one process measured at the whole batch would (issue 38: the budget was one GPU's on sixteen)."""
    from bertkit.config import preset
    from bertkit.settings import PretrainSettings, TrainConfig

    measured = []
    # one process: 1 step/s at the whole batch (16); each of 4 processes: 4 steps/s at its quarter
    monkeypatch.setattr(pretrain_plan, "measure_steps_per_second", lambda config, length, rows, *a, **k:
                        measured.append(rows) or 16 / rows)
    settings = PretrainSettings(data=str(data["dynamic"]), model="bert-mini", output="unused", recipe="auto")
    train = TrainConfig(max_time_s=3600, precision="fp32")
    facts = pretrain_plan.DataFacts.read(settings.data)
    config = preset("bert-mini", vocab_size=facts.vocab_size)

    def choose(world_size: int):
        shape = pretrain_plan._planning_shape(settings, train, facts, None, config, world_size)
        return pretrain_plan._choose(settings, train, facts, None, config, shape, world_size)

    alone, four = choose(1), choose(4)
    assert measured == [16, 4]
    assert "3,600 steps" in alone.reason or "~3,600 steps" in alone.reason, alone.reason
    assert "~14,400 steps" in four.reason and "each of 4 processes' share" in four.reason, four.reason
    # --recipe short under a time budget is measured too: its budget is the steps the time buys
    short = dataclasses.replace(settings, recipe="short")
    shape = pretrain_plan._planning_shape(short, train, facts, None, config, 1)
    for seconds in (3_600, 7_200):  # 1 step/s
        chosen = pretrain_plan._choose(short, dataclasses.replace(train, max_time_s=seconds), facts, None, config,
                                       shape, 1)
        assert (chosen.budget_steps, chosen.nsp) == (seconds, False)



def test_the_time_budget_is_measured_at_the_batch_the_run_will_take(data, monkeypatch):
    """The rate is measured at the micro-batch the run will have: the continue recipe's 32 rows (a released
    checkpoint), the flags' micro-batch when batch flags are given (of the recipe's global batch when they give
    none), and divided by the accumulation steps (an optimizer step runs that many micro-batches)."""
    from bertkit.config import preset
    from bertkit.settings import PretrainSettings, TrainConfig

    settings = PretrainSettings(data=str(data["dynamic"]), model="bert-mini", output="unused", recipe="auto")
    facts = pretrain_plan.DataFacts.read(settings.data)
    config = preset("bert-mini", vocab_size=facts.vocab_size)
    plain = TrainConfig(max_time_s=3600, precision="fp32")
    continued = dataclasses.replace(settings, recipe="continue")
    assert pretrain_plan._planning_shape(continued, plain, facts, None, config, 1) == (32, facts.built_seq_length)
    assert pretrain_plan._planning_shape(continued, plain, facts, None, config, 4) == (8, facts.built_seq_length)
    flags = TrainConfig(max_time_s=3600, precision="fp32", global_batch_size=64, micro_batch_size=16)
    assert pretrain_plan._planning_shape(settings, flags, facts, None, config, 1) == (16, 64)
    # a flag that splits the recipe's batch: --micro-batch-size 4 of the short recipe's 16, or 2 accumulation steps
    micro = TrainConfig(max_time_s=3600, precision="fp32", micro_batch_size=4)
    assert pretrain_plan._planned_batch(settings, micro, None, config, 1) == (4, 4)
    halves = TrainConfig(max_time_s=3600, precision="fp32", gradient_accumulation_steps=2)
    assert pretrain_plan._planned_batch(settings, halves, None, config, 1) == (8, 2)
    assert pretrain_plan._planned_batch(settings, plain, None, config, 3) == (6, 1)  # 16 on 3 processes: rounded up
    monkeypatch.setattr(pretrain_plan, "measure_steps_per_second", lambda *a, **k: 4.0)  # micro-batches a second
    chosen = pretrain_plan._choose(settings, flags, facts, None, config, (16, 64), 1)
    assert chosen.budget_steps == 3600  # 4 micro-batches of 16 an optimizer step: 1 step a second


def test_pretraining_records_the_positions_it_trained_and_fine_tuning_says_when_inputs_go_past(data, tmp_path,
                                                                                                caplog):
    """Issue 48: the short recipe trains 64-token instances, and fine-tuning 128-token inputs then read positions
    64-127 through embeddings pre-training never trained (it lost to random initialisation on long texts, silently).
    `final/bertkit_pretraining.json` records the positions trained (the longest chain of --init-from runs), and
    fine-tuning names the examples that reach past them, with the fix."""
    from bertkit.data.glue import TextExample
    from bertkit.tasks.classification import ClassificationSettings, ClassificationTask
    from bertkit.workflows.finetune import FinetuneSettings, finetune

    with caplog.at_level(logging.INFO):
        assert _pretrain(data, tmp_path / "short", "--max-steps", "2", "--max-seq-length", "24") == 0
    said = [r.getMessage() for r in caplog.records if "stay untrained" in r.getMessage()]
    assert len(said) == 1 and "so positions 24-95 stay untrained (--full-length-share" in said[0]  # the recipe's line
    record = json.loads((tmp_path / "short" / "final" / "bertkit_pretraining.json").read_text())
    assert record["trained_positions"] == 24
    assert _pretrain(data, tmp_path / "long", "--max-steps", "2", "--max-seq-length", "64", "--init-from",
                     str(tmp_path / "short" / "final")) == 0
    assert json.loads((tmp_path / "long" / "final" / "bertkit_pretraining.json").read_text())["trained_positions"] == 64

    from bertkit.serve.predictor import load_predictor

    embedder = load_predictor(tmp_path / "short" / "final")  # predict, extract and serve read it so
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        embedder.embed(["word " * 40, "word", "word " * 30])
        embedder.embed(["word " * 40])  # said once: a server reads many batches
    said = [r.getMessage() for r in caplog.records if "never trained" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("2 of 3 inputs reach positions past 24")
    assert "--max-seq-length 24" in said[0]
    assert embedder.untrained.past == 3
    lines = tmp_path / "lines.txt"
    lines.write_text("word " * 40 + "\nword\n")
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert main(["extract", "--model", str(tmp_path / "short" / "final"), "--input", str(lines), "--output",
                     str(tmp_path / "vectors.npy")]) == 0
    assert any(r.getMessage().startswith("1 of 2 inputs reach positions past 24") for r in caplog.records)
    assert load_predictor(tmp_path / "long" / "final").untrained.trained == 64

    tokenizer = WordPieceTokenizer.from_pretrained(data["tok"])
    words = [w for w in tokenizer.vocab if w.isalpha()][:40]
    texts = [" ".join(words[(i + j) % len(words)] for j in range(40 if i % 2 else 5)) for i in range(8)]
    examples = [TextExample(f"x:{i}", text, None, ("a", "b")[i % 2]) for i, text in enumerate(texts)]
    task = ClassificationTask(ClassificationSettings(labels=["a", "b"], max_seq_length=48))
    for model, expected in (("short", 4), ("long", 0)):
        settings = FinetuneSettings.of(model=str(tmp_path / model / "final"), output=tmp_path / f"ft-{model}",
                                       max_steps=1, precision="fp32", device="cpu")
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            results = finetune(task, settings, tokenizer, examples, [("", examples)], {})
        assert results["past_trained_positions"] == expected
        said = [r.getMessage() for r in caplog.records if "never trained" in r.getMessage()]
        assert len(said) == (1 if expected else 0)
        if expected:
            assert said[0].startswith("4 of 8 training examples reach positions past 24") and "--init-from" in said[0]
        budget = [r.getMessage() for r in caplog.records
                  if "measured to gain less than 5 points over random" in r.getMessage()]
        assert budget == ([] if not expected else [budget[0]])
        if expected:  # half the inputs past a 2-step model's positions: the long-input measurement applies
            assert budget[0].startswith("50% of the inputs are longer than the 24 tokens this model was pre-trained")


def test_precision_auto_is_measured_once_and_the_plans_answer_is_what_runs(data, tmp_path, monkeypatch):
    """Issue 47: `--precision auto` was resolved twice at different shapes (the budget's rate and the run), so near
    the threshold a recipe could plan for bf16 and run fp32. The plan measures once; the run and its record use
    that answer."""
    from bertkit.workflows import prepare

    asked = []
    monkeypatch.setattr(pretrain_plan, "resolve_precision", lambda *a, **k: asked.append(a[3:]) or "bf16")
    original = prepare.resolve_precision
    monkeypatch.setattr(prepare, "resolve_precision", lambda *a, **k: pytest.fail("resolved again") if a[0] == "auto"
                        else original(*a, **k))
    assert main(["pretrain", "--data", str(data["dynamic"]), "--tokenizer", str(data["tok"]), "--model", "bert-debug",
                 "--output", str(tmp_path / "run"), "--eval-examples", "8", "--device", "cpu", "--max-steps", "1",
                 "--recipe", "short"]) == 0
    assert len(asked) == 1 and asked[0] == (16, 64)  # the short recipe's micro-batch and length
    recorded = json.loads((tmp_path / "run" / "pretrain_settings.json").read_text())
    assert recorded["train"]["precision"] == "bf16"


@pytest.mark.parametrize(("share", "placement", "steps", "expected"), [
    (0.25, "spread", 12, [3, 7, 11]),  # every 4th step, evenly: floor((k + 1) / 4) > floor(k / 4)
    (0.1, "end", 10, [9]),  # the last tenth of the budget
    (0.5, "end", 10, [5, 6, 7, 8, 9]),
    (0.0, "end", 10, []),
])
def test_full_length_steps_are_a_share_of_the_budget(share, placement, steps, expected):
    chosen = [k for k in range(steps) if full_length_step(k, k / steps, share, placement)]
    assert chosen == expected
    spread = [k for k in range(1000) if full_length_step(k, k / 1000, 0.3, "spread")]
    assert len(spread) == 300 and max(np.diff(spread)) <= 4  # exactly the share, no long gaps


def _lengths_read(monkeypatch) -> list:
    """The (index, length) keys the training split is read with, in order (one process, no workers)."""
    from bertkit.workflows import pretrain as pretrain_workflow

    keys: list = []
    original = pretrain_workflow._Split.__getitem__

    def recording(self, key):
        if isinstance(key, tuple):  # the training split's reads (the held-out split is read by index)
            keys.append(key)
        return original(self, key)

    monkeypatch.setattr(pretrain_workflow._Split, "__getitem__", recording)
    return keys


def test_full_length_steps_train_every_position_the_data_has(data, tmp_path, monkeypatch, caplog):
    """Issue 48: the short recipe cuts instances to 64 tokens for speed, which leaves positions 64 and up untrained.
    --full-length-share reads the data whole in that share of the steps (end: as the paper's 512-token phase;
    spread: through the run): every step's batch is one length, the full-length steps are the share asked for,
    and final/ records the full length as trained."""
    keys = _lengths_read(monkeypatch)
    assert _pretrain(data, tmp_path / "auto", "--max-steps", "10", "--max-seq-length", "24",
                     "--global-batch-size", "4", "--full-length-share", "0.1", "--full-length-placement", "end") == 0
    lengths = [length for _, length in keys]
    per_step = [set(lengths[k:k + 4]) for k in range(0, len(lengths), 4)]
    assert per_step == [{24}] * 9 + [{96}]  # the last 10% of the steps at the data's length
    record = json.loads((tmp_path / "auto" / "final" / "bertkit_pretraining.json").read_text())
    assert record["trained_positions"] == 96
    saved = json.loads((tmp_path / "auto" / "pretrain_settings.json").read_text())
    assert (saved["settings"]["full_length_share"], saved["settings"]["full_length_placement"]) == (0.1, "end")
    keys.clear()
    assert _pretrain(data, tmp_path / "spread", "--max-steps", "8", "--max-seq-length", "24", "--global-batch-size",
                     "4", "--full-length-share", "0.25", "--full-length-placement", "spread") == 0
    lengths = [length for _, length in keys]
    assert [lengths[k] for k in range(0, len(lengths), 4)] == [24, 24, 24, 96, 24, 24, 24, 96]


def test_full_length_steps_resume_exactly(data, tmp_path, monkeypatch):
    """A run stopped and resumed reads the same lengths at the same steps, and so trains the same losses."""
    common = ("--max-seq-length", "24", "--global-batch-size", "4", "--full-length-share", "0.34",
              "--full-length-placement", "spread", "--learning-rate", "1e-3", "--warmup-ratio", "0",
              "--lr-schedule", "constant-with-warmup")  # (a decay would follow the budget)
    assert _pretrain(data, tmp_path / "whole", "--max-steps", "6", *common) == 0
    assert _pretrain(data, tmp_path / "parts", "--max-steps", "3", "--save-every", "3", *common) == 0
    assert _pretrain(data, tmp_path / "parts", "--max-steps", "6", "--resume", "auto", *common) == 0

    def losses(run: str) -> dict[int, float]:
        lines = (tmp_path / run / "metrics.jsonl").read_text().splitlines()
        return {r["step"]: r["loss"] for r in map(json.loads, lines) if r.get("kind") == "train"}

    assert losses("parts") == losses("whole") and len(losses("whole")) == 6


def test_a_library_run_that_cuts_instances_says_which_positions_stay_untrained(data, tmp_path, caplog):
    """Without a recipe (a library caller) no recipe line says it, so `pretrain` warns once, with the fix; with
    full-length steps it does not."""
    from bertkit.settings import PretrainSettings, TrainConfig
    from bertkit.workflows.pretrain import pretrain

    def run(name: str, share: float | None) -> list[str]:
        caplog.clear()
        settings = PretrainSettings(data=str(data["dynamic"]), model="bert-debug", output=str(tmp_path / name),
                                    tokenizer=str(data["tok"]), eval_examples=8, max_seq_length=24,
                                    full_length_share=share)
        with caplog.at_level(logging.WARNING):
            pretrain(settings, TrainConfig(max_steps=1, device="cpu", precision="fp32", batch_size=4))
        return [r.getMessage() for r in caplog.records if "stay untrained" in r.getMessage()]

    said = run("cut", None)
    assert len(said) == 1 and said[0].startswith("positions 24-95 stay untrained") and "--full-length-share" in said[0]
    assert run("whole", 0.5) == []


def test_budgets_measured_too_short_for_long_inputs_are_said_with_the_measurement(monkeypatch):
    """Issue 48, item 4: a short-recipe budget no longer than every budget measured not to pay on long inputs is said
    to be too short for them, with the figures; a longer or unknown budget, or one that paid, is not."""
    from bertkit.workflows import recipe_notes as notes

    monkeypatch.setattr(notes, "LONG_INPUT_STUDY", (("task A", ((100, "1 minute", 0.5, 0.4),
                                                                (200, "2 minutes", 1.5, 0.2))),))
    said = long_input_budget(150)
    assert said.startswith("measured with bert-mini on a long-input task fine-tuned at 128 tokens, in points over "
                           "random initialisation (steps of 16 x 64 tokens; the minutes are the study's 2-core CPU's, "
                           "4.4 steps a second: compare your budget's steps): task A: +0.5 after 1 minute (~100 steps, "
                           "p = 0.4), +1.5 after")
    assert long_input_budget(200) and not long_input_budget(201) and not long_input_budget(None)
    monkeypatch.setattr(notes, "LONG_INPUT_STUDY", (("task A", ((100, "1 minute", 0.5, 0.4),
                                                                (200, "2 minutes", 6.0, 0.01))),))
    assert long_input_budget(100) and not long_input_budget(150)  # 2 minutes paid: longer budgets are not said
    # Two tasks: a budget is said while any task failed at it or longer; every task's figures are said.
    monkeypatch.setattr(notes, "LONG_INPUT_STUDY", (("task A", ((100, "1 minute", 6.0, 0.01),)),
                                                    ("task B", ((100, "1 minute", -9.0, 0.01),
                                                                (200, "2 minutes", 2.0, 0.3)))))
    said = long_input_budget(150)
    assert said.startswith("measured with bert-mini on 2 long-input tasks") and "task A: +6.0 after" in said
    assert "task B: -9.0 after 1 minute" in said and not long_input_budget(201)
    monkeypatch.setattr(notes, "LONG_INPUT_STUDY", (("task A", ((100, "1 minute", 0.5, 0.4),
                                                                (200, "2 minutes", 6.0, 0.01))),))
    short = choose_recipe("auto", 256, 100)
    assert short.budget_steps == 100  # the budget the recipe was planned at is kept with it
    note = long_input_note(short, 64, 128)
    assert note.startswith("if the inputs you will fine-tune on are mostly longer than 64 tokens, expect this")
    assert "over random initialisation on them, or to lose" in note
    assert "`bertkit finetune` fine-tunes random initialisation as well" in note and "--compare-random-init" in note
    assert not long_input_note(short, 128, 128)  # every step reads the data whole: not what was measured
    assert not long_input_note(choose_recipe("paper", 256, 100), 64, 128)  # not the short recipe
    assert not long_input_note(choose_recipe("auto", 256, 150), 64, 128)  # a budget not measured to fail
    lengths = [100] * 5 + [20] * 5
    said = long_input_task_note(64, lengths, 80)
    assert said.startswith("50% of the inputs are longer than the 64 tokens this model was pre-trained on for ~80")
    assert not long_input_task_note(64, lengths[1:], 80)  # fewer than half
    assert not long_input_task_note(None, lengths, 80)  # trained everywhere (made elsewhere)
    assert not long_input_task_note(64, lengths, 150) and not long_input_task_note(64, lengths, None)


def test_the_long_input_measurement_is_the_studys():
    """The figures said are docs/pretraining.md's rows, of the recipe each budget gets."""
    from bertkit.workflows import recipe_notes as notes

    rows = [row for _, task_rows in notes.LONG_INPUT_STUDY for row in task_rows]
    assert long_input_budget(10_560) and not long_input_budget(10_561)  # 40 CPU-minutes did not pay on the Treasury
    assert "-1.2 after 40 CPU-minutes" in long_input_budget(5_280)  # the Treasury, today's recipe
    assert "-3.3 after 10 CPU-minutes" in long_input_budget(2_640)  # the Treasury, over 3 pre-training seeds
    assert "+3.7 after 10 CPU-minutes" in long_input_budget(2_640)  # the dictionary, three pre-training seeds
    assert "+9.2 after 20 CPU-minutes" in long_input_budget(2_640)  # and where 20 CPU-minutes paid (2 seeds)
    assert "World English Bible passages by part of the Bible: +3.7 after 10" in long_input_budget(2_640)
    assert "+9.2 after 40 CPU-minutes (~10,560 steps, p = 0.0044)" in long_input_budget(2_640)  # the Bible, 2 seeds
    assert "+12.1 after 40 CPU-minutes (~10,560 steps, p = 0.054)" in long_input_budget(2_640)  # the commentary
    text = (Path(__file__).resolve().parents[2] / "docs" / "pretraining.md").read_text(encoding="utf-8")
    for steps, _, gain, p in rows:
        assert f"{gain:+.1f}" in text and f"p = {p:.2g}" in text and f"{steps:,}" in text
    # leaving NSP out is not offered as a lever: over 3 pre-training seeds it did not help on the long tasks
    assert "NSP" not in long_input_note(choose_recipe("auto", 256, 2_640), 64, 128)
    assert "45.5 ± 1.9" in text and "29.7 ± 0.3" in text and "42.9 ± 4.6" in text and "53.4 ± 0.9" in text


def test_a_vocabulary_larger_than_the_short_recipe_was_measured_with_is_said_with_the_measurement(monkeypatch):
    """A short-recipe run that cuts its data's instances, at a budget no longer than one where a larger vocabulary
    lost on long inputs against 8,000 pieces, with a vocabulary larger than every one measured not to lose, is said
    in one line with every task's figures, the short-text ones too, and the fix; a smaller vocabulary, a longer or
    unknown budget, data read whole, or another recipe is not."""
    from bertkit.workflows import recipe_notes as notes

    monkeypatch.setattr(notes, "VOCABULARY_STUDY", (("task A", 30_000, ((100, "1 minute", 30.0, 40.0, 41.0),)),
                                                    ("task B", 12_000, ((150, "1 minute", 70.0, 69.0, 60.0),))))
    short_texts = (("task C", 30_000, ((100, "1 minute", 50.0, 49.0, 42.0),)),)
    monkeypatch.setattr(notes, "VOCABULARY_SHORT_TEXTS", short_texts)
    short = choose_recipe("auto", 256, 100)
    note = vocabulary_note(short, 20_000, 64, 128)
    assert note.startswith("if the inputs you will fine-tune on are mostly longer than 64 tokens, this vocabulary of "
                           "20,000 pieces may cost points: the short recipe was chosen and measured with 8,000")
    assert "task A with 30,000 pieces: 30.0 after 1 minute (~100 steps) against 40.0 (random initialisation " in note
    assert "task B with 12,000 pieces: 70.0 after" in note and "--vocab-size 8000" in note
    assert "on short texts: task C with 30,000 pieces: 50.0 after" in note
    assert not vocabulary_note(short, 20_000, 128, 128)  # read whole: short inputs, where it tied
    assert not vocabulary_note(short, 12_000, 64, 128)  # no larger than a vocabulary measured not to lose
    assert not vocabulary_note(short, 8_000, 64, 128)
    assert not vocabulary_note(choose_recipe("auto", 256, 101), 30_000, 64, 128)  # longer than any budget that lost
    assert not vocabulary_note(choose_recipe("auto", 256, None), 30_000, 64, 128)  # unknown budget
    assert not vocabulary_note(choose_recipe("paper", 256, 100), 30_000, 64, 128)
    assert not vocabulary_note(short, 30_000, 64, 128, continued=True)  # the checkpoint's vocabulary: measured only
    monkeypatch.setattr(notes, "VOCABULARY_STUDY", (("task A", 30_000, ((100, "1 minute", 38.0, 40.0, 41.0),)),))
    assert vocabulary_note(short, 30_000, 64, 128)  # 2 points below 8,000 pieces: a loss (VOCABULARY_LOSS)
    monkeypatch.setattr(notes, "VOCABULARY_STUDY", (("task A", 30_000, ((100, "1 minute", 38.5, 40.0, 41.0),)),))
    assert not vocabulary_note(short, 30_000, 64, 128)  # within VOCABULARY_LOSS of 8,000 pieces: not a loss


def test_the_vocabulary_measurement_is_the_studys_and_pretrain_says_it(data, tmp_path, caplog, monkeypatch):
    """VOCABULARY_STUDY's figures are docs/pretraining.md's, and `pretrain` says the note before its first step on
    data whose vocabulary is larger than the short recipe was measured with (and not on the same data built with
    8,000 pieces)."""
    from bertkit.workflows import recipe_notes as notes

    text = (Path(__file__).resolve().parents[2] / "docs" / "pretraining.md").read_text(encoding="utf-8")
    section = text[text.index("### The vocabulary the short recipe was measured with"):]
    for _, pieces, rows in notes.VOCABULARY_STUDY + notes.VOCABULARY_SHORT_TEXTS:
        for steps, _, large, small, random in rows:  # one table row holds the five figures, in this order
            assert re.search(rf"\| {pieces:,} \| {steps:,} \| {large:.1f} ± [^|]*\| {small:.1f} ± [^|]*\| "
                             rf"{random:.1f} ± ", section), (pieces, steps)
    assert vocabulary_note(choose_recipe("auto", 256, 1_785), 30_522, 64, 128)
    vocabulary = len(WordPieceTokenizer.from_pretrained(data["tok"]).vocab)
    monkeypatch.setattr(notes, "SHORT_RECIPE_VOCABULARY", vocabulary // 2)  # the toy vocabulary counts as large
    monkeypatch.setattr(notes, "VOCABULARY_STUDY", (("task A", vocabulary, ((10, "1 minute", 30.0, 40.0, 41.0),)),))
    with caplog.at_level(logging.WARNING):
        assert _pretrain(data, tmp_path / "large", "--max-steps", "2") == 0
    assert f"this vocabulary of {vocabulary:,} pieces may cost points" in caplog.text
    caplog.clear()
    monkeypatch.setattr(notes, "SHORT_RECIPE_VOCABULARY", vocabulary)
    with caplog.at_level(logging.WARNING):
        assert _pretrain(data, tmp_path / "measured", "--max-steps", "2") == 0
    assert "may cost points" not in caplog.text


def test_the_short_recipe_trains_masked_lm_only_at_every_budget():
    """The short recipe has no NSP at any budget (SHORT_NSP, measured with the decoder bias at the word frequencies)
    and its reason says so; the paper's keeps it; --nsp / --no-nsp decide it for any budget."""
    from bertkit.workflows.recipes import SHORT_NSP, SHORT_OBJECTIVE

    assert SHORT_NSP is False
    for budget in (None, 2_640, 5_280, 50_000):
        chosen = choose_recipe("short", 256, budget)
        assert not chosen.nsp and chosen.reason.endswith(SHORT_OBJECTIVE)
    twenty = choose_recipe("auto", 256, 5_280)
    assert not twenty.nsp and "MLM only" in twenty.describe() and "MLM + NSP" not in twenty.describe()
    assert not choose_recipe("auto", 256, 2_640, "short", True).nsp  # a short run with NSP goes on without it
    assert choose_recipe("auto", 256, 100_000).nsp  # the paper's
    from types import SimpleNamespace

    from bertkit.settings import PretrainSettings
    from bertkit.train import TrainConfig
    from bertkit.workflows.recipes import apply_recipe

    shape = SimpleNamespace(directory="data", dynamic=True, nsp=True, layout="pairs", built_seq_length=128)
    for given, expected in ((None, False), (True, True)):  # the recipe's, or the user's --nsp
        settings = PretrainSettings(data="data", model="bert-mini", output="o", recipe="auto", nsp=given)
        assert apply_recipe(twenty, settings, TrainConfig(max_steps=5_280), shape, 1)[0].nsp is expected


def test_the_short_recipe_starts_a_fresh_decoder_bias_at_the_word_frequencies():
    assert short_recipe(256, 2640).mlm_bias_init == "unigram" and "log word frequencies" in short_recipe(256).describe()
    assert choose_recipe("paper", 256, None).mlm_bias_init == "zeros"  # Google's initialisation
    assert choose_recipe("continue", 256, 1000).mlm_bias_init == "zeros"


def _final_bias(run: Path) -> np.ndarray:
    from bertkit.model import read_state_dict  # noqa: PLC0415

    return read_state_dict(run / "final")["cls.predictions.bias"].numpy()


def test_pretrain_starts_the_decoder_bias_at_the_training_splits_word_frequencies(data, tmp_path, monkeypatch,
                                                                                   caplog):
    """The bias after one step of a learning rate too small to move it is the centred log frequency of the words
    the run's own unigram baseline counted; --mlm-bias-init zeros keeps Google's zeros; a checkpoint's own bias is
    never replaced, whatever the flag."""
    from bertkit.workflows import pretrain as pretrain_module  # noqa: PLC0415

    counted = []
    original = pretrain_module.unigram_baseline
    monkeypatch.setattr(pretrain_module, "unigram_baseline", lambda *a, **k: counted.append(original(*a, **k))
                        or counted[-1])
    with caplog.at_level(logging.INFO):
        assert _pretrain(data, tmp_path / "unigram", "--max-steps", "1", "--learning-rate", "1e-12") == 0
    log_frequency = counted[0].log_frequency.numpy()
    assert len(counted) == 1 and counted[0].words > 0  # counted once: the bias and the held-out gain share it
    np.testing.assert_allclose(_final_bias(tmp_path / "unigram"), log_frequency - log_frequency.mean(), atol=1e-5)
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("the MLM decoder's bias starts")]
    assert said == [f"the MLM decoder's bias starts at the log frequencies of {counted[0].words:,} words of the "
                    "training data (--mlm-bias-init unigram)"]
    saved = json.loads((tmp_path / "unigram" / "pretrain_settings.json").read_text())
    assert saved["settings"]["mlm_bias_init"] == "unigram" and saved["recipe"]["mlm_bias_init"] == "unigram"

    assert _pretrain(data, tmp_path / "zeros", "--max-steps", "1", "--learning-rate", "1e-12",
                     "--mlm-bias-init", "zeros") == 0
    np.testing.assert_allclose(_final_bias(tmp_path / "zeros"), 0.0, atol=1e-5)

    assert _pretrain(data, tmp_path / "continued", "--max-steps", "1", "--learning-rate", "1e-12", "--recipe",
                     "short", "--init-from", str(tmp_path / "zeros" / "final"), "--mlm-bias-init", "unigram") == 0
    np.testing.assert_allclose(_final_bias(tmp_path / "continued"), 0.0, atol=1e-5)  # the checkpoint's own


def test_an_encoder_checkpoint_without_an_mlm_head_gets_the_bias_at_the_word_frequencies(data, tmp_path, monkeypatch):
    """--init-from a checkpoint with no MLM head (a sentence encoder's BertModel): its decoder bias is new, so
    --mlm-bias-init unigram starts it at the data's centred log frequencies, while the encoder's weights load."""
    from bertkit.model import BertModel, read_state_dict  # noqa: PLC0415
    from bertkit.workflows import pretrain as pretrain_module  # noqa: PLC0415

    assert _pretrain(data, tmp_path / "source", "--max-steps", "1", "--mlm-bias-init", "zeros") == 0
    encoder = tmp_path / "encoder"
    BertModel.from_pretrained(tmp_path / "source" / "final").save_pretrained(
        encoder, tokenizer=WordPieceTokenizer.from_pretrained(data["tok"]))
    assert not any(key.startswith("cls.") for key in read_state_dict(encoder))
    counted = []
    original = pretrain_module.unigram_baseline
    monkeypatch.setattr(pretrain_module, "unigram_baseline", lambda *a, **k: counted.append(original(*a, **k))
                        or counted[-1])
    assert _pretrain(data, tmp_path / "adapted", "--max-steps", "1", "--learning-rate", "1e-12", "--recipe",
                     "continue", "--init-from", str(encoder), "--mlm-bias-init", "unigram") == 0
    log_frequency = counted[0].log_frequency.numpy()
    np.testing.assert_allclose(_final_bias(tmp_path / "adapted"), log_frequency - log_frequency.mean(), atol=1e-5)
    kept = read_state_dict(tmp_path / "adapted" / "final")["bert.encoder.layer.0.attention.self.query.weight"]
    loaded = read_state_dict(encoder)
    source = next(v for k, v in loaded.items() if k.endswith("encoder.layer.0.attention.self.query.weight"))
    np.testing.assert_allclose(kept.numpy(), source.numpy(), atol=1e-6)  # the encoder is the checkpoint's


def test_the_plans_measurements_run_at_the_dropout_the_run_will_most_likely_have():
    """Attention dropout decides the CPU training attention kernel, so the precision and rate measured before the
    recipe is chosen use the short recipe's dropout (none) where it will most likely be chosen, --dropout when given,
    and the config's when continuing a released checkpoint (the continue recipe keeps it)."""
    from bertkit.config import preset
    from bertkit.settings import PretrainSettings

    config = preset("bert-mini", vocab_size=100)
    plan = pretrain_plan._planning_dropout
    auto = PretrainSettings(data="d", model="bert-mini", output="o", recipe="auto")
    assert plan(auto, None, config).attention_probs_dropout_prob == 0.0
    assert plan(dataclasses.replace(auto, dropout=0.2), None, config).hidden_dropout_prob == 0.2
    released = pretrain_plan.InitFacts("ckpt", config, "released", frozenset({"mlm"}), False)
    assert plan(auto, released, config) is config and config.attention_probs_dropout_prob == 0.1
    assert plan(dataclasses.replace(auto, recipe=None), None, config) is config  # library defaults: the config's


@pytest.mark.parametrize("masking", ["static", "dynamic"])
def test_a_time_budget_is_measured_on_the_datas_own_batches(data, monkeypatch, masking):
    """The rate a time budget is turned into steps with is measured on MEASURED_BATCHES batches of the run's own
    instances at the planned length, padded as the run pads them (a corpus of short documents trains slower a step
    than full rows: its padding decides the CPU attention kernel), the same instances every time, the run's RNG
    untouched; dynamic data is masked at the recipe's rate, static data keeps its own."""
    import torch

    from bertkit.config import preset

    seen: list[list[dict]] = []
    monkeypatch.setattr(pretrain_plan, "training_steps_per_second",
                        lambda build, loss, batches, *rest: seen.append(batches) or 1.0)
    facts = pretrain_plan.DataFacts.read(str(data[masking]))
    config = preset("bert-debug", vocab_size=120)
    state = torch.random.get_rng_state()
    for _ in range(2):
        pretrain_plan.measure_steps_per_second(config, 64, 16, "fp32", "cpu", masked_lm_prob=0.3, data=facts)
    assert torch.equal(torch.random.get_rng_state(), state)
    first, again = seen
    assert len(first) == pretrain_plan.MEASURED_BATCHES
    assert all(batch["input_ids"].shape[0] == 16 and batch["input_ids"].shape[1] <= 64 for batch in first)
    assert all(torch.equal(a["input_ids"], b["input_ids"]) for a, b in zip(first, again))
    real = sum(int(batch["attention_mask"].sum()) for batch in first)
    assert real < sum(batch["attention_mask"].numel() for batch in first)  # some rows are padded, as in the run
    predicted = sum(int((batch["mlm_labels"] != -100).sum()) for batch in first)
    assert predicted / real == pytest.approx(0.3 if masking == "dynamic" else 0.15, abs=0.05)
    pretrain_plan.measure_steps_per_second(config, 64, 16, "fp32", "cpu", masked_lm_prob=0.3)
    assert len(seen[-1]) == 1 and bool(seen[-1][0]["attention_mask"].all())  # no data: one batch of full rows


def test_the_throughput_measurement_takes_every_batch_and_clips_as_the_loop_does(monkeypatch):
    """`training_steps_per_second` given several batches runs each at least once, in turn, after the warm-up (even
    when the time is up sooner), and clips the gradients as the loop does every step."""
    import torch
    from torch import nn

    from bertkit.train import throughput

    seen, clipped = [], []
    real_clip = torch.nn.utils.clip_grad_norm_
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", lambda params, norm: clipped.append(norm)
                        or real_clip(params, norm))

    def loss(model, batch):
        seen.append(int(batch["x"][0, 0]))
        return model(batch["x"].float()).sum(), {}

    batches = [{"x": torch.full((2, 3), float(i))} for i in range(5)]
    rate = throughput.training_steps_per_second(lambda: nn.Linear(3, 1), loss, batches, "fp32",
                                                torch.device("cpu"), seconds=0.0)
    assert rate > 0 and seen[:6] == [0, 1, 2, 3, 4, 0] and len(seen) == 6  # the warm-up, then all five
    assert clipped == [1.0] * len(seen)
