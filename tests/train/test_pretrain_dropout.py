"""`PretrainSettings.dropout` / `bertkit pretrain --dropout`: the override reaches the model's config
and its behaviour (0 makes training-mode forwards deterministic), None keeps the preset's 0.1, and an
out-of-range value is a user error naming the flag."""

from __future__ import annotations

import pytest
import torch

from bertkit.errors import BertkitError
from bertkit.settings import PretrainSettings
from bertkit.tokenizer import WordPieceTokenizer
from bertkit.train import TrainConfig
from bertkit.workflows.pretrain import build_model

TRAIN = TrainConfig(max_steps=1)

TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"abcdefghij"]


@pytest.fixture
def tokenizer(tmp_path) -> WordPieceTokenizer:
    (tmp_path / "vocab.txt").write_text("\n".join(TOKENS) + "\n", encoding="utf-8")
    return WordPieceTokenizer.from_pretrained(tmp_path)


def settings(dropout: float | None, nsp: bool = True) -> PretrainSettings:
    return PretrainSettings(data="unused", model="bert-debug", output="unused", nsp=nsp, dropout=dropout)


@pytest.mark.parametrize("nsp", [True, False])
def test_zero_dropout_makes_training_forward_deterministic(tokenizer, nsp):
    torch.manual_seed(0)
    model = build_model(settings(0.0, nsp), TRAIN, tokenizer, max_seq_length=16).train()
    assert model.config.hidden_dropout_prob == 0.0 and model.config.attention_probs_dropout_prob == 0.0
    ids = torch.randint(5, len(TOKENS), (2, 12))
    first = model.bert(ids).last_hidden_state
    assert torch.equal(first, model.bert(ids).last_hidden_state)


def test_default_keeps_the_preset_dropout(tokenizer):
    model = build_model(settings(None), TRAIN, tokenizer, max_seq_length=16).train()
    assert model.config.hidden_dropout_prob == 0.1
    ids = torch.randint(5, len(TOKENS), (2, 12))
    assert not torch.equal(model.bert(ids).last_hidden_state, model.bert(ids).last_hidden_state)


def test_init_from_takes_the_override(tokenizer, tmp_path):
    model = build_model(settings(None), TRAIN, tokenizer, max_seq_length=16)
    model.save_pretrained(tmp_path / "ckpt", tokenizer=tokenizer)
    resumed = PretrainSettings(data="unused", model="bert-debug", output="unused", init_from=str(tmp_path / "ckpt"),
                               dropout=0.0)
    assert build_model(resumed, TRAIN, tokenizer, max_seq_length=16).config.hidden_dropout_prob == 0.0


@pytest.mark.parametrize("value", [-0.1, 1.0])
def test_out_of_range_dropout_is_refused(tokenizer, value):
    with pytest.raises(BertkitError, match="--dropout must be in"):
        build_model(settings(value), TRAIN, tokenizer, max_seq_length=16)
