"""The teacher's outputs are computed once and kept: the same teacher on the same inputs reads them back, another
teacher or other inputs start over, a damaged chunk is computed again (said), never used."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from bertkit.config import preset
from bertkit.errors import ModelFault
from bertkit.inference.batching import model_outputs
from bertkit.model import BertForTokenClassification
from bertkit.settings import TaggingSettings
from bertkit.tasks.tagging import TaggingTask
from bertkit.workflows import teacher_outputs as cache

TASK = TaggingTask(TaggingSettings(labels=["O", "B-X", "I-X"]))


def _features(count: int) -> list[dict]:
    rng = np.random.default_rng(0)
    out = []
    for _ in range(count):
        n = int(rng.integers(3, 9))
        out.append({"input_ids": [2, *rng.integers(5, 30, n - 2).tolist(), 3], "token_type_ids": [0] * n,
                    "attention_mask": [1] * n})
    return out


def _teacher(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return BertForTokenClassification(preset("bert-debug", vocab_size=30).replace(num_labels=3)).eval()


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(cache, "CHUNK_SIZE", 4)


def _computed(monkeypatch) -> list[int]:
    calls: list[int] = []
    real = cache.model_outputs

    def counting(model, features, *args, **kwargs):
        calls.append(len(features))
        return real(model, features, *args, **kwargs)
    monkeypatch.setattr(cache, "model_outputs", counting)
    return calls


def test_outputs_are_the_teachers_and_are_read_back_not_recomputed(tmp_path, small_chunks, monkeypatch) -> None:
    teacher, features = _teacher(), _features(10)
    calls = _computed(monkeypatch)
    first = cache.teacher_outputs(teacher, TASK, features, tmp_path / "t", 0, 3, torch.device("cpu"))
    assert calls == [1, 4, 4, 2] and len(first) == 10  # the teacher on one feature (the shapes), then the chunks
    reference = model_outputs(teacher, features, ("logits",), ("logits",), 3, 0)["logits"]
    for row, expected in zip(first, reference):
        # (batched otherwise than the chunks are, so padded otherwise: equal to rounding)
        np.testing.assert_allclose(row["logits"], expected, rtol=1e-5, atol=1e-6)
    again = cache.teacher_outputs(teacher, TASK, features, tmp_path / "t", 0, 3, torch.device("cpu"))
    assert calls == [1, 4, 4, 2, 1] and all(np.array_equal(a["logits"], b["logits"]) for a, b in zip(first, again))


def test_another_teacher_or_other_inputs_start_over(tmp_path, small_chunks, monkeypatch) -> None:
    features = _features(6)
    cache.teacher_outputs(_teacher(0), TASK, features, tmp_path / "t", 0, 3, torch.device("cpu"))
    calls = _computed(monkeypatch)
    other = cache.teacher_outputs(_teacher(1), TASK, features, tmp_path / "t", 0, 3, torch.device("cpu"))
    assert calls == [1, 4, 2]
    expected = model_outputs(_teacher(1), features, ("logits",), ("logits",), 3, 0)["logits"]
    for row, logits in zip(other, expected):
        np.testing.assert_allclose(row["logits"], logits, rtol=1e-5, atol=1e-6)
    cache.teacher_outputs(_teacher(1), TASK, features[:5], tmp_path / "t", 0, 3, torch.device("cpu"))
    assert calls == [1, 4, 2, 1, 4, 1]


@pytest.mark.parametrize("damage", ["truncated", "non-finite", "wrong-count", "wrong-shapes", "no-key",
                                    "another-run"])
def test_a_damaged_chunk_is_computed_again(tmp_path, small_chunks, monkeypatch, caplog, damage) -> None:
    teacher, features = _teacher(), _features(8)
    cache.teacher_outputs(teacher, TASK, features, tmp_path / "t", 0, 3, torch.device("cpu"))
    chunk = tmp_path / "t" / "chunk-00001.safetensors"
    if damage == "truncated":
        chunk.write_bytes(chunk.read_bytes()[:40])
    else:
        from safetensors import safe_open
        from safetensors.numpy import load_file, save_file
        with safe_open(str(chunk), framework="np") as handle:
            metadata = handle.metadata()
        tensors = load_file(str(chunk))
        if damage == "non-finite":
            tensors["logits"][3] = np.nan
        elif damage == "wrong-count":
            tensors["logits.shapes"] = tensors["logits.shapes"][:2]
        elif damage == "wrong-shapes":  # the same count and values, 3 labels read as 1 per token: it broadcast
            tensors["logits.shapes"] = tensors["logits.shapes"][:, ::-1].copy()
        elif damage == "no-key":
            metadata = None
        else:  # a chunk of another teacher's run on the same inputs, copied in: it was read as this run's
            cache.teacher_outputs(_teacher(1), TASK, features, tmp_path / "other", 0, 3, torch.device("cpu"))
            chunk.write_bytes((tmp_path / "other" / chunk.name).read_bytes())
        if damage != "another-run":
            save_file(tensors, str(chunk), metadata=metadata)
    calls = _computed(monkeypatch)
    with caplog.at_level(logging.WARNING):
        rows = cache.teacher_outputs(teacher, TASK, features, tmp_path / "t", 0, 3, torch.device("cpu"))
    assert calls == [1, 4] and "chunk-00001.safetensors is damaged" in caplog.text
    reference = model_outputs(teacher, features, ("logits",), ("logits",), 3, 0)["logits"]
    for row, expected in zip(rows, reference):
        np.testing.assert_allclose(row["logits"], expected, rtol=1e-5, atol=1e-6)
    assert all(np.isfinite(r["logits"]).all() for r in rows)


def test_a_teacher_that_computes_nan_is_refused(tmp_path) -> None:
    teacher = _teacher()
    with torch.no_grad():
        teacher.classifier.weight.fill_(float("nan"))
    with pytest.raises(ModelFault, match="my-teacher"):
        cache.teacher_outputs(teacher, TASK, _features(3), tmp_path / "t", 0, 3, torch.device("cpu"), "my-teacher")
