"""Fine-tuning a checkpoint that already has a classifier (transformers' or bertkit's): its head is kept only for
the same labels, its rows read in the run's label order (transformers keeps id2label's order, bertkit sorts), and
a head of other labels starts fresh, said, instead of being loaded as if its rows were this task's labels or
refused on a shape."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
import transformers

from bertkit.settings import FinetuneSettings
from bertkit.tasks.classification import ClassificationSettings, ClassificationTask
from bertkit.tokenizer import WordPieceTokenizer
from bertkit.workflows.finetune import build_model, model_source

from .conftest import TOKENS


def _classifier(directory: Path, labels: list[str]) -> Path:
    """transformers' BertForSequenceClassification whose head gives each label its own bias."""
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=len(TOKENS), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=64, id2label=dict(enumerate(labels)),
                                     label2id={name: i for i, name in enumerate(labels)})
    model = transformers.BertForSequenceClassification(config)
    with torch.no_grad():
        model.classifier.bias.copy_(torch.arange(len(labels), dtype=torch.float32))
    model.save_pretrained(directory)
    WordPieceTokenizer(TOKENS).save_pretrained(directory)
    return directory


def _built(directory: Path, labels: list[str]):
    task = ClassificationTask(ClassificationSettings(labels=labels))
    settings = FinetuneSettings.of(model=str(directory), output=directory.parent / "out")
    source = model_source(settings)
    return build_model(task, settings, source.tokenizer, source)


def test_the_checkpoints_head_is_read_in_the_runs_label_order(tmp_path, caplog):
    directory = _classifier(tmp_path / "hf", ["positive", "negative"])
    with caplog.at_level(logging.INFO):
        model = _built(directory, ["negative", "positive"])  # bertkit's order: sorted
    assert model.classifier.bias.tolist() == [1.0, 0.0]  # negative's row, then positive's
    hf = transformers.BertForSequenceClassification.from_pretrained(directory)
    assert torch.equal(model.classifier.weight, hf.classifier.weight[[1, 0]])
    assert "its head's labels are in another order (positive, negative)" in caplog.text


@pytest.mark.parametrize("labels", [["no", "yes"], ["negative", "neutral", "positive"]])
def test_a_head_of_other_labels_starts_fresh_and_is_said(tmp_path, caplog, labels):
    directory = _classifier(tmp_path / "hf", ["negative", "positive"])
    with caplog.at_level(logging.WARNING):
        model = _built(directory, labels)  # other names of the same count, or another count (was: a shape error)
    assert model.classifier.weight.shape == (len(labels), 32)
    assert torch.equal(model.classifier.bias, torch.zeros(len(labels)))  # BERT's start: not the checkpoint's 0, 1
    assert "head is for the labels negative, positive, not this task's" in caplog.text
    hf = transformers.BertModel.from_pretrained(directory)
    assert torch.equal(model.bert.embeddings.word.weight, hf.embeddings.word_embeddings.weight)
