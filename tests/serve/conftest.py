"""Tiny fine-tuned checkpoint directories for the serving tests, built inline (no downloads).

Each directory is what fine-tuning writes: config.json + model.safetensors + vocab.txt +
tokenizer_config.json, and bertkit_task.json from the task's own `to_json` (the format
tasks/finetuned.py writes). Weights are random but seeded, so predictions are deterministic.
"""

from __future__ import annotations

import json
import shutil
import socket
import threading
from pathlib import Path

import pytest
import torch
import transformers
from sentence_transformers import SentenceTransformer
from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

from bertkit.config import preset
from bertkit.model import (
    BertForMaskedLM,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
)
from bertkit.serve.app import build_server
from bertkit.serve.client import wait_until_ready
from bertkit.settings import ServeSettings
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


# --- a live server and Hugging Face directories (the clients' tests) ------------------------------------

MAX_SEQ_LENGTH = 8
"""sentence_dir's max_seq_length."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LiveServer:
    """The production server (`build_server`) on a loopback port in a background thread."""

    def __init__(self, app) -> None:
        self.port = free_port()
        # The address and log level of `bertkit serve`'s settings (the model is already in the app).
        self.server = build_server(app, ServeSettings(Path(), port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        url = f"http://127.0.0.1:{self.port}"
        wait_until_ready(url)
        return url

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


@pytest.fixture(scope="session")
def bert_dir(tmp_path_factory) -> Path:
    """A random transformers BertModel with the tiny vocabulary, as a plain Hugging Face directory."""
    directory = tmp_path_factory.mktemp("bert")
    (directory / "vocab.txt").write_text("\n".join(VOCAB) + "\n", encoding="utf-8")
    config = transformers.BertConfig(vocab_size=len(VOCAB), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=37, max_position_embeddings=64)
    torch.manual_seed(0)
    transformers.BertModel(config).save_pretrained(directory)
    transformers.BertTokenizerFast(str(directory / "vocab.txt"), do_lower_case=True).save_pretrained(directory)
    return directory


@pytest.fixture(scope="session")
def sentence_dir(bert_dir, tmp_path_factory) -> tuple[Path, SentenceTransformer]:
    """A sentence-transformers directory (mean pooling, Normalize, max_seq_length 8) and its model."""
    model = SentenceTransformer(modules=[Transformer(str(bert_dir), max_seq_length=MAX_SEQ_LENGTH),
                                         Pooling(32, pooling_mode="mean"), Normalize()], device="cpu")
    directory = tmp_path_factory.mktemp("st")
    model.save(str(directory))
    shutil.copy(bert_dir / "vocab.txt", directory / "vocab.txt")  # sentence-transformers 6 saves tokenizer.json only
    return directory, model


@pytest.fixture(scope="session")
def pair_dir(tmp_path_factory) -> Path:
    """A two-label pair classifier (the second label: the pair matches)."""
    task = ClassificationTask(ClassificationSettings(labels=["different", "same"], max_seq_length=16))
    return build(tmp_path_factory.mktemp("pair"), BertForSequenceClassification, task.to_json(), num_labels=2,
                 id2label={0: "different", 1: "same"})
