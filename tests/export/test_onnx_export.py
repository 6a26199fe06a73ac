"""ONNX export of every head: onnxruntime equals PyTorch within 1e-4 on a batch of another shape than
the traced one (dynamic axes), and int8 quantization reports its measured output change."""

from __future__ import annotations

import numpy as np
import onnxruntime
import pytest
import torch

from bertkit.errors import BertkitError
from bertkit.export.onnx import export_onnx, heads, run_onnx, sample_batch
from bertkit.model import MODEL_CLASSES
from bertkit.settings import ClassificationSettings, ExportSettings, SquadSettings
from bertkit.tasks.classification import ClassificationTask
from bertkit.tasks.squad import SquadTask

from .conftest import build, build_feature_based, tokenizer

TEXTS = ["the cat sat on the mat .", "john lives in london", "paris", "where did the big red dog go in the park ?"]


@pytest.mark.parametrize("head", ["BertModel", "BertForPreTraining", "BertForMaskedLM", "BertForSequenceClassification",
                                  "BertForTokenClassification", "BertForQuestionAnswering", "BertForMultipleChoice"])
def test_every_head_matches_onnxruntime(head, tmp_path, mlm_dir):
    directory = mlm_dir if head == "BertForMaskedLM" else build(tmp_path / head, MODEL_CLASSES[head])
    report = export_onnx(ExportSettings(directory, tmp_path / "model.onnx"))
    assert report.max_abs_diff < 1e-4
    session = onnxruntime.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
    assert [o.name for o in session.get_outputs()] == list(report.outputs)
    # A fresh batch of yet another shape, against the padding-free PyTorch path.
    batch = sample_batch(tokenizer(), TEXTS[:3], head)
    model = MODEL_CLASSES[head].from_pretrained(directory).eval()
    with torch.no_grad():
        expected = model(*batch.values())
    _assert_matches(tmp_path / "model.onnx", report.outputs, expected, batch)


def test_int8_quantization_measures_the_change(tmp_path, tmp_path_factory, classifier_dir, caplog):
    sample = tmp_path_factory.mktemp("sample") / "sample.txt"
    sample.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    with caplog.at_level("WARNING"):
        report = export_onnx(ExportSettings(classifier_dir, tmp_path / "int8.onnx", quantize="int8", sample=sample))
    assert not [r for r in caplog.records if "pre-processing" in r.getMessage()]  # onnxruntime's advice, silenced
    q = report.quantized
    assert report.size_bytes < q["fp32_size_bytes"]
    assert 0 < q["max_abs_diff"] < 0.5 and 0.0 <= q["top1_agreement"] <= 1.0 and q["positions"] == len(TEXTS)
    text = "\n".join(report.lines())
    assert "int8 dynamic quantization" in text and "top-1 agreement" in text
    assert [p.name for p in tmp_path.iterdir()] == ["int8.onnx"]  # the fp32 intermediate is removed
    with pytest.raises(BertkitError, match="--quantize"):
        export_onnx(ExportSettings(classifier_dir, tmp_path / "x.onnx", quantize="int4"))


@pytest.mark.parametrize("kind", ["classification", "squad"])
def test_a_feature_based_directory_exports_encoder_and_head(kind, tmp_path):
    """Not the bare encoder (config.json says BertModel): the graph computes what the fine-tuned model does."""
    if kind == "classification":
        task = ClassificationTask(ClassificationSettings(labels=["a", "b", "c"], max_seq_length=16))
    else:
        task = SquadTask(SquadSettings(max_seq_length=16, doc_stride=4))
    directory, model = build_feature_based(tmp_path / kind, task)
    report = export_onnx(ExportSettings(directory, tmp_path / "model.onnx"))
    head = task.model_class.__name__
    assert report.architecture == f"feature-based {head}" and report.outputs == heads()[head].outputs
    assert report.max_abs_diff < 1e-4
    batch = sample_batch(tokenizer(), TEXTS[:3], head)
    with torch.no_grad():
        expected = model(*batch.values())
    _assert_matches(tmp_path / "model.onnx", report.outputs, expected, batch)


def _assert_matches(path, names, expected, batch) -> None:
    """onnxruntime's outputs on `batch` equal PyTorch's `expected` within 1e-4 at the real positions."""
    mask = batch["attention_mask"].bool().numpy()
    for name, actual in zip(names, run_onnx(path, batch)):
        reference = getattr(expected, name).numpy()
        if reference.shape[:mask.ndim] == mask.shape:
            reference, actual = reference[mask], actual[mask]  # padded positions are unspecified
        np.testing.assert_allclose(actual, reference, atol=1e-4, rtol=0)
