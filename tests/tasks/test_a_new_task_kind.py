"""The contract of a task kind: a new kind is one class (here, in this file) and one entry in the registry
(`bertkit.tasks.kinds.TASK_CLASSES`), and with nothing else touched it fine-tunes, evaluates, serves, exports to
ONNX and refuses another kind's flags by name; the lists of kinds elsewhere (the architectures a config.json
names, the ONNX heads, the owners of a column flag) follow the registry."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
import torch.nn.functional as F
from fastapi.testclient import TestClient

from bertkit.config import preset
from bertkit.errors import BertkitError
from bertkit.export.onnx import export_onnx, heads
from bertkit.model import BertForPreTraining, BertForSequenceClassification
from bertkit.serve.app import create_app
from bertkit.serve.predictor import load_predictor
from bertkit.settings import ExportSettings, FinetuneSettings, PredictSettings
from bertkit.settings.fields import Settings
from bertkit.tasks.kinds import TASK_CLASSES, build_task, kind_of_architecture, task_class
from bertkit.tasks.task import BaseTask, Task, write_jsonl
from bertkit.tokenizer import WordPieceTokenizer
from bertkit.workflows.finetune import run_finetuning
from bertkit.workflows.predict import predict_file

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "dog", "sat", "ran"]


# --- the one class: a new kind ----------------------------------------------------------------------------

@dataclass
class CatSettings(Settings):
    """Saved in bertkit_task.json."""

    labels: list[str] = field(default_factory=lambda: ["no", "yes"])
    """Label names by output index."""
    max_seq_length: int = 8
    """Longest input in tokens, [CLS]/[SEP] included."""


class CatTask(BaseTask):
    """Does a line mention a cat? A file of `label<TAB>text` lines; one score per label at [CLS]."""

    kind = "cat-spotting"
    settings_class = CatSettings
    model_class = BertForSequenceClassification
    metric_names: ClassVar[tuple[str, ...]] = ("accuracy",)
    settings: CatSettings

    def config_overrides(self) -> dict[str, Any]:
        return {"num_labels": len(self.settings.labels), "id2label": dict(enumerate(self.settings.labels))}

    def read(self, path, labelled=True, training=False):
        rows = [line.split("\t") for line in Path(path).read_text(encoding="utf-8").splitlines()]
        return [(text, label if labelled else None) for label, text in rows], []

    def features(self, examples, tokenizer, training=False):
        encodings = tokenizer.encode_batch([text for text, _ in examples], max_length=self.settings.max_seq_length)
        return [{"input_ids": e.input_ids, "token_type_ids": e.token_type_ids, "attention_mask": e.attention_mask,
                 **({"labels": self.settings.labels.index(label)} if label is not None else {})}
                for e, (_, label) in zip(encodings, examples)]

    def loss(self, model, batch):
        logits = model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"]).logits
        return F.cross_entropy(logits.float(), batch["labels"]), {}

    def decode(self, examples, features, outputs):
        return [self.settings.labels[int(np.argmax(row))] for row in outputs["logits"]]

    def score(self, examples, predictions):
        return {"accuracy": float(np.mean([p == label for p, (_, label) in zip(predictions, examples)]))}

    def write_predictions(self, examples, predictions, directory, prefix):
        return [write_jsonl(directory / f"{prefix}predictions.jsonl", ({"label": p} for p in predictions))]


@pytest.fixture()
def registered(monkeypatch):
    """The one registry entry (in the source: the tuple in bertkit/tasks/kinds.py)."""
    monkeypatch.setitem(TASK_CLASSES, CatTask.kind, CatTask)


@pytest.fixture()
def files(tmp_path) -> tuple[Path, Path]:
    model = tmp_path / "pretrained"
    BertForPreTraining(preset("bert-debug", vocab_size=len(VOCAB))).save_pretrained(
        model, tokenizer=WordPieceTokenizer(VOCAB))
    lines = [("yes", "the cat sat"), ("no", "the dog ran"), ("yes", "cat"), ("no", "dog sat")] * 4
    data = tmp_path / "train.tsv"
    data.write_text("".join(f"{label}\t{text}\n" for label, text in lines), encoding="utf-8")
    return model, data


def test_a_registered_class_is_a_kind_everywhere(registered, files, tmp_path):
    model, data = files
    task = build_task("cat-spotting", data, {})
    assert isinstance(task, Task) and task_class("cat-spotting") is CatTask
    settings = FinetuneSettings.of(model=str(model), output=tmp_path / "run", max_steps=2, precision="fp32",
                                   device="cpu")
    run_finetuning("cat-spotting", data, [data], settings, {})
    best = tmp_path / "run" / "best"
    assert json.loads((best / "bertkit_task.json").read_text())["task"] == "cat-spotting"

    metrics = predict_file(PredictSettings(str(best), str(data), str(tmp_path / "eval"), evaluate=True,
                                           device="cpu"))
    assert metrics["examples"] == 16 and 0.0 <= metrics["accuracy"] <= 1.0
    with pytest.raises(BertkitError, match="--text-column applies to classification models; this is a "
                                           "cat-spotting model"):
        task.with_columns(text_column="body")

    predictor = load_predictor(best)  # no predictor of its own: served for embed, its kind said in /info
    with TestClient(create_app(predictor)) as client:
        assert client.get("/info").json()["task"] == "cat-spotting"
        assert len(client.post("/embed", json={"inputs": "the cat"}).json()) == 1
        assert client.post("/classify", json={"inputs": "the cat"}).status_code == 404

    report = export_onnx(ExportSettings(best, tmp_path / "cat.onnx"))
    assert report.outputs == ("logits",) and report.max_abs_diff < 1e-4


def test_the_lists_of_kinds_follow_the_registry():
    for cls in TASK_CLASSES.values():
        assert kind_of_architecture(cls.model_class.__name__) is not None
        assert heads()[cls.model_class.__name__].outputs == cls.output_names
    assert kind_of_architecture("BertForMultipleChoice") == "multiple-choice"
    assert kind_of_architecture("BertModel") is None and "BertModel" in heads()
    assert heads()["BertForMultipleChoice"].input_axes == ("batch", "choices", "sequence")
