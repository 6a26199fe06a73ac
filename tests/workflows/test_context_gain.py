"""The held-out context gain (`mlm_context_gain`): how much better than word frequencies counted on the training
split a model predicts the words behind [MASK], the measure of the unigram plateau a short pre-training can end on;
what `pretrain` says about it and what `finetune --compare-random-init auto` does with it."""

from __future__ import annotations

import json
import logging
import math

import pytest
import torch
from torch.nn import functional as F

from bertkit.config import preset
from bertkit.data import collate_pretraining
from bertkit.model import BertForPreTraining
from bertkit.train.distributed import DistributedContext
from bertkit.workflows import pretrain as pretrain_module
from bertkit.workflows.pretrain import evaluate_pretraining, unigram_baseline
from bertkit.workflows.recipe_notes import (
    UNIGRAM_PLATEAU_NATS,
    context_gain,
    plateau_note,
    random_init_comparison,
)

from .conftest import TOKENS
from .test_random_init_comparison import _finetune, _short_budget_model, _task

ID = {token: index for index, token in enumerate(TOKENS)}
PAD, MASK = ID["[PAD]"], ID["[MASK]"]
SPECIAL = tuple(ID[t] for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"))


def _item(inputs: list[str], labels: dict[int, str]) -> dict[str, torch.Tensor]:
    ids = torch.tensor([ID[t] for t in inputs])
    mlm = torch.full_like(ids, -100)
    for position, word in labels.items():
        mlm[position] = ID[word]
    return {"input_ids": ids, "token_type_ids": torch.zeros_like(ids), "attention_mask": torch.ones_like(ids),
            "mlm_labels": mlm, "nsp_labels": torch.tensor(0)}


# Words (masked positions read as their targets; [CLS], [SEP], [MASK] and padding left out): good good film bad
# [UNK], then good awful film: good 3, film 2, bad 1, awful 1, [UNK] 1 of 8. Behind [MASK]: good, good, film. "bad"
# is predicted where it was kept, "awful" where "plot" replaced it: both can be copied from the input, so neither
# counts in the gain.
ITEMS = [
    _item(["[CLS]", "[MASK]", "good", "film", "[SEP]", "bad", "[UNK]", "[SEP]"], {1: "good", 5: "bad"}),
    _item(["[CLS]", "[MASK]", "plot", "[SEP]", "[MASK]", "[SEP]"], {1: "good", 2: "awful", 4: "film"}),
]
COUNTS = {"good": 3, "film": 2, "bad": 1, "awful": 1, "[UNK]": 1}


def test_the_baseline_counts_every_word_of_the_sampled_training_instances():
    baseline = unigram_baseline(ITEMS, len(TOKENS), SPECIAL, seed=0)
    assert baseline.words == 8 and baseline.mask_token_id == MASK
    smoothed = {t: math.log((COUNTS.get(t, 0) + 0.5) / (8 + 0.5 * len(TOKENS))) for t in TOKENS}  # add-half
    assert baseline.log_frequency.tolist() == pytest.approx([smoothed[t] for t in TOKENS])
    one = unigram_baseline(ITEMS, len(TOKENS), SPECIAL, seed=0, instances=1)  # bounded: one instance counted
    again = unigram_baseline(ITEMS, len(TOKENS), SPECIAL, seed=0, instances=1)  # the seed draws the same one
    assert one.words in (5, 3) and again.words == one.words and torch.equal(again.log_frequency, one.log_frequency)
    assert unigram_baseline([], len(TOKENS), SPECIAL, seed=0).words == 0


def _gain(monkeypatch, predict) -> float:
    """mlm_context_gain on ITEMS, against ITEMS' own baseline, of a model whose logits at the masked positions are
    `predict(targets)`."""
    def logits_and_targets(model, batch, nsp, sparse):
        targets = batch["mlm_labels"][batch["mlm_labels"] != -100]
        return predict(targets), targets, None

    monkeypatch.setattr(pretrain_module, "mlm_logits_and_targets", logits_and_targets)
    baseline = unigram_baseline(ITEMS, len(TOKENS), SPECIAL, seed=0)
    return pretrain_module._held_out_metrics(None, ITEMS, 2, False, PAD, DistributedContext(), torch.device("cpu"),
                                             baseline)["mlm_context_gain"]


def test_a_model_that_predicts_from_frequency_alone_gains_nothing(monkeypatch):
    frequency = unigram_baseline(ITEMS, len(TOKENS), SPECIAL, seed=0).log_frequency.float()
    assert _gain(monkeypatch, lambda targets: frequency.expand(len(targets), -1)) == pytest.approx(0, abs=1e-6)


def test_a_model_that_reads_the_context_gains_the_baseline_loss_at_the_masks(monkeypatch):
    def oracle(targets):
        return F.one_hot(targets, len(TOKENS)).float() * 100
    behind_masks = -(2 * math.log(3.5 / 13.5) + math.log(2.5 / 13.5)) / 3  # good, good, film; add-half smoothed
    assert _gain(monkeypatch, oracle) == pytest.approx(behind_masks, rel=1e-6)


def test_the_gain_is_left_out_without_a_baseline_or_without_a_mask():
    model = BertForPreTraining(preset("bert-debug", vocab_size=len(TOKENS)))
    assert "mlm_context_gain" not in evaluate_pretraining(model, ITEMS, 2, True, PAD)
    kept_only = [_item(["[CLS]", "good", "film", "[SEP]"], {1: "good"})]  # predicted, never behind [MASK]
    baseline = unigram_baseline(ITEMS, len(TOKENS), SPECIAL, seed=0)
    assert "mlm_context_gain" not in evaluate_pretraining(model, kept_only, 2, True, PAD, baseline=baseline)


def test_a_real_model_is_scored_at_its_mask_positions(monkeypatch):
    """Through the model's sparse MLM path (masked positions gathered in row-major order) and its accelerated
    evaluation copy, against a dense recomputation of every position."""
    torch.manual_seed(0)
    model = BertForPreTraining(preset("bert-debug", vocab_size=len(TOKENS))).eval()
    baseline = unigram_baseline(ITEMS, len(TOKENS), SPECIAL, seed=0)
    gain = evaluate_pretraining(model, ITEMS, 2, True, PAD, baseline=baseline)["mlm_context_gain"]
    batch = collate_pretraining(ITEMS, PAD)
    with torch.no_grad():
        logits = model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"]).prediction_logits
    at_mask = batch["input_ids"] == MASK
    targets = batch["mlm_labels"][at_mask]
    model_loss = F.cross_entropy(logits[at_mask].float(), targets, reduction="mean")
    expected = float(-baseline.log_frequency[targets].mean() - model_loss)
    assert gain == pytest.approx(expected, abs=1e-4)


def test_the_record_is_read_only_for_a_bertkit_pretraining():
    mine = {"steps": 2640, "last_eval": {"mlm_context_gain": 0.16}}
    assert context_gain(mine) == 0.16
    released = {**mine, "continued_from": {"released": True}}  # assumed trained to convergence
    assert context_gain(released) is None
    for damaged in ({"steps": 2640}, {"steps": 2640, "last_eval": []}, {"steps": 2640, "last_eval": {
            "mlm_context_gain": "0.1"}}, {"steps": 2640, "last_eval": {"mlm_context_gain": float("nan")}}):
        assert context_gain(damaged) is None


def test_auto_compares_a_model_on_the_plateau_whatever_its_inputs():
    short_inputs = [10] * 10  # inside the trained positions: the long-input rule alone would not compare
    compare, reason = random_init_comparison("auto", 64, short_inputs, 2_640, 0.16)
    assert compare and reason.startswith("auto: the model predicts held-out masked words only 0.160 nats better")
    assert not random_init_comparison("auto", 64, short_inputs, 2_640, UNIGRAM_PLATEAU_NATS)[0]
    assert not random_init_comparison("auto", 64, short_inputs, 2_640, None)[0]
    assert random_init_comparison("off", 64, short_inputs, 2_640, 0.16) == (False, "--compare-random-init off")
    assert plateau_note(UNIGRAM_PLATEAU_NATS) == plateau_note(None) == ""
    note = plateau_note(0.16)
    assert note.startswith("the model predicts held-out masked words only 0.160 nats better") and "\n" not in note
    assert "--resume auto" in note and "--compare-random-init auto" in note and "quickstart: a larger --minutes" in note
    below = plateau_note(-0.5)
    assert below.startswith("the model predicts held-out masked words 0.500 nats worse than their frequency alone")
    assert "not yet learned even how common they are" in below and "barely begun" in note
    assert "only 0.497 nats better" in plateau_note(0.497)  # not "0.50 ... < 0.5"


def test_finetune_compares_random_initialisation_for_a_model_whose_record_says_plateau(tmp_path):
    model = _short_budget_model(tmp_path / "model", steps=2640, trained_positions=64)
    record = json.loads((model / "bertkit_pretraining.json").read_text())
    (model / "bertkit_pretraining.json").write_text(json.dumps({**record, "last_eval": {"mlm_context_gain": 0.1}}))
    data = _task(tmp_path, words=3)  # short inputs
    assert _finetune(model, data, tmp_path / "out") == 0
    decision = json.loads((tmp_path / "out" / "eval_results.json").read_text())["random_init"]
    assert decision["compare"] and "only 0.100 nats better" in decision["reason"]
    assert (tmp_path / "out" / "random-init" / "best").is_dir()


def test_pretrain_records_the_gain_and_says_when_it_ends_on_the_plateau(tmp_path, caplog, toy_pretraining_data):
    from bertkit.cli import main  # noqa: PLC0415

    data, tok = toy_pretraining_data["data"], toy_pretraining_data["tok"]
    with caplog.at_level(logging.WARNING):
        assert main(["pretrain", "--data", str(data), "--tokenizer", str(tok), "--model", "bert-debug", "--output",
                     str(tmp_path / "run"), "--max-steps", "2", "--eval-examples", "8", "--device", "cpu",
                     "--precision", "fp32"]) == 0
    gain = json.loads((tmp_path / "run" / "final" / "bertkit_pretraining.json").read_text())["last_eval"][
        "mlm_context_gain"]
    evals = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["mlm_context_gain"] for r in evals if r["kind"] == "eval"][-1] == gain
    assert gain < UNIGRAM_PLATEAU_NATS  # two steps of a random model: nothing read yet
    said = [r for r in caplog.records if r.getMessage().startswith("the model predicts held-out masked words")]
    assert len(said) == 1 and said[0].levelno == logging.WARNING and f"{abs(gain):.3f} nats" in said[0].getMessage()


def test_a_training_checkpoint_is_said_to_carry_no_pretraining_record(tmp_path, caplog):
    """Only a run's final/ has bertkit_pretraining.json: fine-tuning from RUN/checkpoints/step-N of a bertkit
    pre-training would take a short run for a converged one, so it says so, once, with the fix; another trainer's
    checkpoint (a trainer_state.json, no bertkit run around it) is not spoken of."""
    from .conftest import tiny_model  # noqa: PLC0415

    data = _task(tmp_path, words=3)
    for name, run_settings in (("bertkit", True), ("elsewhere", False)):
        checkpoint = tiny_model(tmp_path / name / "checkpoints" / "step-00000300")
        (checkpoint / "trainer_state.json").write_text("{}")
        if run_settings:
            (tmp_path / name / "pretrain_settings.json").write_text("{}")
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            assert _finetune(checkpoint, data, tmp_path / f"out-{name}") == 0
        said = [r.getMessage() for r in caplog.records if "is a checkpoint of a bertkit pre-training" in r.getMessage()]
        assert len(said) == run_settings and all("fine-tune from the run's final/" in line for line in said)
