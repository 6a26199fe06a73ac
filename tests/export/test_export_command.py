"""`bertkit export onnx` through the command line: what it prints, and what it refuses before writing anything
(a missing `onnx` extra: one line naming it; a failed export leaves no directory behind)."""

from __future__ import annotations

import sys

import pytest

from bertkit.cli import main
from bertkit.export import onnx as export
from bertkit.settings import ExportSettings


def test_export_onnx_prints_the_check_and_the_int8_change(classifier_dir, tmp_path, capsys):
    assert main(["export", "onnx", "--model", str(classifier_dir), "--output", str(tmp_path / "m.onnx"),
                 "--quantize", "int8"]) == 0
    out = capsys.readouterr().out
    assert "onnxruntime vs PyTorch (fp32): max |diff|" in out and "int8 dynamic quantization" in out
    assert f"wrote {tmp_path / 'm.onnx'} (int8 (dynamic quantization), BertForSequenceClassification: logits" in out


@pytest.mark.parametrize("module", ["onnx", "onnxruntime"])
def test_without_the_onnx_extra_it_says_what_to_install_and_writes_nothing(module, classifier_dir, tmp_path,
                                                                           monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, module, None)  # an import of it fails, as when it is not installed
    output = tmp_path / "deploy" / "onnx"
    assert main(["export", "onnx", "--model", str(classifier_dir), "--output", str(output)]) == 2
    assert capsys.readouterr().err == (f"bertkit: error: bertkit export onnx needs the optional packages of "
                                       f"bertkit[onnx] ({module} not installed); install them with: pip install "
                                       "\"bertkit[onnx]\"\n")
    assert list(tmp_path.iterdir()) == []


def test_a_failed_export_removes_the_directories_it_made(classifier_dir, tmp_path, monkeypatch):
    def broken(path, batch):
        raise RuntimeError("onnxruntime failed")

    monkeypatch.setattr(export, "run_onnx", broken)
    with pytest.raises(RuntimeError, match="onnxruntime failed"):
        export.export_onnx(ExportSettings(classifier_dir, tmp_path / "a" / "b" / "model.onnx"))
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "kept").mkdir()
    with pytest.raises(RuntimeError):
        export.export_onnx(ExportSettings(classifier_dir, tmp_path / "kept" / "onnx"))
    assert [p.name for p in tmp_path.iterdir()] == ["kept"] and list((tmp_path / "kept").iterdir()) == []
