"""The held-out context gain (`mlm_context_gain`): how much better than the held-out set's own word frequencies a
model predicts the words behind [MASK], the measure of the unigram plateau a short pre-training can end on; what
`pretrain` says about it and what `finetune --compare-random-init auto` does with it."""

from __future__ import annotations

import json
import logging
import math

import pytest
import torch

from bertkit.train.distributed import DistributedContext
from bertkit.workflows import pretrain as pretrain_module
from bertkit.workflows.recipes import (
    UNIGRAM_PLATEAU_NATS,
    context_gain,
    plateau_note,
    random_init_comparison,
)

from .conftest import TOKENS
from .test_random_init_comparison import _finetune, _short_budget_model, _task

ID = {token: index for index, token in enumerate(TOKENS)}
PAD, CLS, SEP, MASK = ID["[PAD]"], ID["[CLS]"], ID["[SEP]"], ID["[MASK]"]
SPECIAL = tuple(ID[t] for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"))


def _item(inputs: list[str], labels: dict[int, str]) -> dict[str, torch.Tensor]:
    ids = torch.tensor([ID[t] for t in inputs])
    mlm = torch.full_like(ids, -100)
    for position, word in labels.items():
        mlm[position] = ID[word]
    return {"input_ids": ids, "token_type_ids": torch.zeros_like(ids), "attention_mask": torch.ones_like(ids),
            "mlm_labels": mlm, "nsp_labels": torch.tensor(0)}


# Originals (masked positions read as their labels; [CLS], [SEP] and padding left out): good good film bad, then
# good awful film: good 3, film 2, bad 1, awful 1 of 7. Behind [MASK]: good, good, film. "bad" is predicted where it
# was kept, "awful" where "plot" replaced it: both can be copied from the input, so neither counts.
ITEMS = [
    _item(["[CLS]", "[MASK]", "good", "film", "[SEP]", "bad", "[SEP]"], {1: "good", 5: "bad"}),
    _item(["[CLS]", "[MASK]", "plot", "[SEP]", "[MASK]", "[SEP]"], {1: "good", 2: "awful", 4: "film"}),
]
UNIGRAM_LOSS = -(2 * math.log(3 / 7) + math.log(2 / 7)) / 3
FREQUENCIES = torch.tensor([{"good": 3, "film": 2, "bad": 1, "awful": 1}.get(t, 0) / 7 for t in TOKENS])


class _Encoder(torch.nn.Module):
    """What `_held_out_metrics` reads the vocabulary size from; the predictions are patched in."""

    def __init__(self) -> None:
        super().__init__()
        from bertkit.config import preset  # noqa: PLC0415
        from bertkit.model import BertModel  # noqa: PLC0415

        self.bert = BertModel(preset("bert-debug", vocab_size=len(TOKENS)))


def _gain(monkeypatch, predict) -> float:
    """mlm_context_gain of a model whose log-probabilities at the masked positions are `predict(targets)`."""
    def logits_and_targets(model, batch, nsp, sparse):
        targets = batch["mlm_labels"][batch["mlm_labels"] != -100]
        return predict(targets), targets, None

    monkeypatch.setattr(pretrain_module, "mlm_logits_and_targets", logits_and_targets)
    metrics = pretrain_module._held_out_metrics(_Encoder(), ITEMS, 2, False, PAD, DistributedContext(),
                                                torch.device("cpu"), SPECIAL)
    return metrics["mlm_context_gain"]


def test_a_model_that_predicts_from_frequency_alone_gains_nothing(monkeypatch):
    frequency = torch.log(FREQUENCIES.clamp(min=1e-30))
    assert _gain(monkeypatch, lambda targets: frequency.expand(len(targets), -1)) == pytest.approx(0, abs=1e-6)


def test_a_model_that_reads_the_context_gains_the_unigram_loss(monkeypatch):
    def oracle(targets):
        return torch.nn.functional.one_hot(targets, len(TOKENS)).float() * 100
    assert _gain(monkeypatch, oracle) == pytest.approx(UNIGRAM_LOSS, rel=1e-6)


def test_the_gain_is_left_out_without_the_vocabulary_or_without_a_mask(monkeypatch):
    def uniform(model, batch, nsp, sparse):
        targets = batch["mlm_labels"][batch["mlm_labels"] != -100]
        return torch.zeros(len(targets), len(TOKENS)), targets, None

    monkeypatch.setattr(pretrain_module, "mlm_logits_and_targets", uniform)
    run = pretrain_module._held_out_metrics
    assert "mlm_context_gain" not in run(_Encoder(), ITEMS, 2, False, PAD, DistributedContext(), torch.device("cpu"))
    kept_only = [_item(["[CLS]", "good", "film", "[SEP]"], {1: "good"})]  # predicted, never behind [MASK]
    metrics = run(_Encoder(), kept_only, 2, False, PAD, DistributedContext(), torch.device("cpu"), SPECIAL)
    assert "mlm_context_gain" not in metrics and metrics["mlm_loss"] == pytest.approx(math.log(len(TOKENS)))


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
    assert compare and reason.startswith("auto: the model predicts held-out masked words only 0.16 nats better")
    assert not random_init_comparison("auto", 64, short_inputs, 2_640, UNIGRAM_PLATEAU_NATS)[0]
    assert not random_init_comparison("auto", 64, short_inputs, 2_640, None)[0]
    assert random_init_comparison("off", 64, short_inputs, 2_640, 0.16) == (False, "--compare-random-init off")
    assert plateau_note(UNIGRAM_PLATEAU_NATS) == plateau_note(None) == ""
    note = plateau_note(0.16)
    assert note.startswith("the model predicts held-out masked words only 0.16 nats better") and "\n" not in note
    assert "--resume auto" in note and "--compare-random-init auto" in note
    assert plateau_note(-0.5).startswith("the model predicts held-out masked words 0.50 nats worse than their")


def test_finetune_compares_random_initialisation_for_a_model_whose_record_says_plateau(tmp_path):
    model = _short_budget_model(tmp_path / "model", steps=2640, trained_positions=64)
    record = json.loads((model / "bertkit_pretraining.json").read_text())
    (model / "bertkit_pretraining.json").write_text(json.dumps({**record, "last_eval": {"mlm_context_gain": 0.1}}))
    data = _task(tmp_path, words=3)  # short inputs
    assert _finetune(model, data, tmp_path / "out") == 0
    decision = json.loads((tmp_path / "out" / "eval_results.json").read_text())["random_init"]
    assert decision["compare"] and "0.10 nats" in decision["reason"]
    assert (tmp_path / "out" / "random-init" / "best").is_dir()


def test_pretrain_records_the_gain_and_says_when_it_ends_on_the_plateau(tmp_path, caplog, write_toy_corpus):
    from bertkit.cli import main  # noqa: PLC0415
    from bertkit.data import InstanceSettings, PretrainingDataSettings, build_pretraining_data  # noqa: PLC0415
    from bertkit.tokenizer import WordPieceTokenizer  # noqa: PLC0415

    corpus = write_toy_corpus(tmp_path / "corpus.txt", documents=20, sentences=(3, 6), words=(6, 14))
    tokenizer = WordPieceTokenizer.train([corpus], vocab_size=120, min_frequency=1)
    tokenizer.save_pretrained(tmp_path / "tok")
    build_pretraining_data(PretrainingDataSettings((str(corpus),), "(in memory)", str(tmp_path / "data"), workers=1,
                                                   quiet=True, instances=InstanceSettings(max_seq_length=64)),
                           tokenizer)
    with caplog.at_level(logging.WARNING):
        assert main(["pretrain", "--data", str(tmp_path / "data"), "--tokenizer", str(tmp_path / "tok"), "--model",
                     "bert-debug", "--output", str(tmp_path / "run"), "--max-steps", "2", "--eval-examples", "8",
                     "--device", "cpu", "--precision", "fp32"]) == 0
    gain = json.loads((tmp_path / "run" / "final" / "bertkit_pretraining.json").read_text())["last_eval"][
        "mlm_context_gain"]
    evals = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["mlm_context_gain"] for r in evals if r["kind"] == "eval"][-1] == gain
    assert gain < UNIGRAM_PLATEAU_NATS  # two steps of a random model: nothing read yet
    said = [r for r in caplog.records if r.getMessage().startswith("the model predicts held-out masked words")]
    assert len(said) == 1 and said[0].levelno == logging.WARNING and f"{abs(gain):.2f} nats" in said[0].getMessage()
