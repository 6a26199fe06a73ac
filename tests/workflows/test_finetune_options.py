"""Early stopping and the feature-based options of the fine-tuning driver."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bertkit.cli import main
from bertkit.config import preset
from bertkit.errors import BertkitError
from bertkit.model.feature_based import FeatureBasedModel
from bertkit.tasks.classification import ClassificationSettings, ClassificationTask
from bertkit.tokenizer import WordPieceTokenizer
from bertkit.workflows.finetune import FinetuneSettings, ModelSource, build_model


def _vocab(directory: Path) -> WordPieceTokenizer:
    tokenizer = WordPieceTokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "good", "bad", "film"])
    tokenizer.save_pretrained(directory)
    return tokenizer


def test_early_stopping_ends_a_seed_after_patience_evaluations(tmp_path: Path) -> None:
    _vocab(tmp_path / "vocab")
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"text": t, "label": t}) + "\n" for t in ["good", "bad"] * 4))
    # A negligible learning rate: dev accuracy never improves after the first epoch.
    assert main(["finetune", "classification", "--model", "bert-debug", "--tokenizer", str(tmp_path / "vocab"),
                 "--train", str(data), "--dev", str(data), "--output", str(tmp_path / "out"), "--epochs", "6",
                 "--batch-size", "4", "--learning-rate", "1e-12", "--precision", "fp32", "--device", "cpu",
                 "--early-stopping-patience", "2"]) == 0
    records = [json.loads(line) for line in (tmp_path / "out" / "seed-1" / "metrics.jsonl").read_text().splitlines()]
    # Epoch 1 sets the best; epochs 2 and 3 do not improve -> stop after 3 of 6 epochs (2 steps each).
    assert max(r["step"] for r in records if r["kind"] == "train") == 6
    assert [r["step"] for r in records if r["kind"] == "eval"] == [2, 4, 6]


def test_freeze_encoder_and_feature_layers_train_only_the_head(tmp_path: Path) -> None:
    tokenizer = _vocab(tmp_path / "vocab")
    task = ClassificationTask(ClassificationSettings(labels=["bad", "good"], max_seq_length=16))
    source = ModelSource(None, preset("bert-debug"), tokenizer, None)
    frozen = build_model(task, FinetuneSettings(model="bert-debug", output=tmp_path, freeze_encoder=True), tokenizer,
                         source)
    trainable = {name for name, p in frozen.named_parameters() if p.requires_grad}
    assert trainable == {"classifier.weight", "classifier.bias"}
    with pytest.raises(BertkitError, match="--feature-layers -4 is outside"):  # bert-debug: 3 hidden states
        build_model(task, FinetuneSettings(model="bert-debug", output=tmp_path, feature_layers=(-1, -4)), tokenizer,
                    source)
    cfg = FinetuneSettings(model="bert-debug", output=tmp_path, feature_layers=(-1, -2, -3))
    features = build_model(task, cfg, tokenizer, source)
    assert isinstance(features, FeatureBasedModel)
    assert {name for name, p in features.named_parameters() if p.requires_grad} == {"head.weight", "head.bias"}
    assert features.head.in_features == 3 * 32  # concatenation of three hidden states (H = 32)


def test_task_settings_round_trip_and_unknown_field_is_a_user_error():
    from bertkit.tasks.kinds import TASK_CLASSES

    for cls in TASK_CLASSES.values():
        fields = {"labels": ["O", "B-PER"]} if cls.kind in ("classification", "tagging") else {}
        task = cls(cls.settings_class(**fields))
        assert cls.from_json(task.to_json()).settings == task.settings
    with pytest.raises(BertkitError, match="task.json: invalid squad settings .*doc_stride"):
        TASK_CLASSES["squad"].from_json({"task": "squad", "stride": 3}, source="task.json")
