"""Tiny fine-tuned checkpoint directories for the serving tests, built inline (no downloads).

Each directory is what fine-tuning writes: config.json + model.safetensors + vocab.txt +
tokenizer_config.json, and bertkit_task.json from the task's own `to_json` (the format
tasks/finetuned.py writes). Weights are random but seeded, so predictions are deterministic.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from bertkit.config import preset
from bertkit.model import (
    BertForMaskedLM,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
)
from bertkit.tasks.classification import ClassificationSettings, ClassificationTask
from bertkit.tasks.finetuned import feature_based_model, save_finetuned
from bertkit.tasks.squad import SquadSettings, SquadTask
from bertkit.tasks.tagging import TaggingSettings, TaggingTask
from bertkit.tokenizer import WordPieceTokenizer

WORDS = ("the cat sat on mat dog ran in park paris is capital of france where did go who john smith lives "
         "london and a big red house , . ? ! ' ##s ##ing ##ed un ##der".split())
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
TAGS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]


def tokenizer() -> WordPieceTokenizer:
    return WordPieceTokenizer(VOCAB, do_lower_case=True)


def build(directory: Path, model_class: type, task: dict | None = None, seed: int = 0, **config) -> Path:
    """Save a seeded random `model_class` (bert-debug size) with the tiny vocabulary into `directory`."""
    torch.manual_seed(seed)
    model = model_class(preset("bert-debug", vocab_size=len(VOCAB), **config))
    with torch.no_grad():  # a visible bias so no-answer / label choices are not all ties
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.05)
    model.save_pretrained(directory, tokenizer=tokenizer())
    if task is not None:
        (directory / "bertkit_task.json").write_text(json.dumps(task, indent=2), encoding="utf-8")
    return directory


def build_feature_based(directory, task, layers=(-1, -2), combine="concat"):
    """A feature-based fine-tuned directory as fine-tuning writes it (random seeded weights)."""
    torch.manual_seed(0)
    config = preset("bert-debug", vocab_size=len(VOCAB), **task.config_overrides())
    model = feature_based_model(task, BertModel(config), layers, combine, 0.0)
    with torch.no_grad():
        model.head.weight.normal_(std=1.0)  # scores far enough apart that the labels are not ties
    save_finetuned(model, task, tokenizer(), directory)
    return directory, model.eval()


@pytest.fixture(scope="session")
def mlm_dir(tmp_path_factory) -> Path:
    return build(tmp_path_factory.mktemp("mlm"), BertForMaskedLM)


@pytest.fixture(scope="session")
def classifier_dir(tmp_path_factory) -> Path:
    task = ClassificationTask(ClassificationSettings(labels=["negative", "positive", "neutral"], max_seq_length=16))
    return build(tmp_path_factory.mktemp("cls"), BertForSequenceClassification, task.to_json(),
                 num_labels=3, id2label={0: "negative", 1: "positive", 2: "neutral"})


@pytest.fixture(scope="session")
def regression_dir(tmp_path_factory) -> Path:
    task = ClassificationTask(ClassificationSettings(labels=None, max_seq_length=32))
    return build(tmp_path_factory.mktemp("reg"), BertForSequenceClassification, task.to_json(),
                 num_labels=1, problem_type="regression")


@pytest.fixture(scope="session")
def tagger_dir(tmp_path_factory) -> Path:
    task = TaggingTask(TaggingSettings(labels=TAGS, max_seq_length=10, doc_stride=3))
    return build(tmp_path_factory.mktemp("tag"), BertForTokenClassification, task.to_json(),
                 num_labels=len(TAGS), id2label=dict(enumerate(TAGS)))


@pytest.fixture(scope="session")
def squad_dir(tmp_path_factory) -> Path:
    task = SquadTask(SquadSettings(max_seq_length=24, doc_stride=5, max_query_length=8, n_best_size=20,
                                   max_answer_length=6))
    return build(tmp_path_factory.mktemp("squad"), BertForQuestionAnswering, task.to_json())


@pytest.fixture(scope="session")
def squad_v2_dir(tmp_path_factory) -> Path:
    task = SquadTask(SquadSettings(max_seq_length=24, doc_stride=5, max_query_length=8, n_best_size=20,
                                   max_answer_length=6, version_2_with_negative=True))
    return build(tmp_path_factory.mktemp("squad2"), BertForQuestionAnswering, task.to_json(), seed=1)
