"""Every inference command says the precision it runs in one line (docs/inference.md): auto's choice with
the measurement behind it, a given precision as given; `bertkit predict` shows it on stderr as a user sees
it (its INFO lines were not configured, so auto's choice was never printed)."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest
import torch

from bertkit.runtime import probe
from bertkit.serve.predictor import load_predictor
from bertkit.settings import ExtractSettings, PredictSettings, ServeSettings
from bertkit.workflows.extract import extract_features
from bertkit.workflows.predict import predict_file


def _precision_lines(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.getMessage().startswith(("precision auto for inference",
                                                                    "precision for inference"))]


@pytest.fixture
def fresh_choice():
    """auto's line is logged once per process and width: forget earlier choices (the probe file stays)."""
    probe.reset()
    yield
    probe.reset()


def _run_each(classifier_dir, tmp_path, precision):
    """The three library entries of predict/evaluate, serve and extract, in `precision`."""
    source = tmp_path / "in.tsv"
    source.write_text("text\tlabel\nthe cat sat\tpositive\n", encoding="utf-8")
    lines = tmp_path / "in.txt"
    lines.write_text("the cat sat\n", encoding="utf-8")
    yield "predict", lambda: predict_file(PredictSettings(str(classifier_dir), str(source), str(tmp_path / "p"),
                                                          device="cpu", precision=precision, evaluate=True))
    yield "serve", lambda: load_predictor(ServeSettings(classifier_dir, precision=precision))
    yield "extract", lambda: extract_features(ExtractSettings(classifier_dir, lines, tmp_path / "f.npy",
                                                              precision=precision))


@pytest.mark.parametrize("precision, expected", [("fp32", "precision for inference: fp32 ("),
                                                 ("bf16", "precision for inference: bf16 ("),
                                                 ("auto", "precision auto for inference: bf16 (")])
def test_each_inference_entry_logs_its_precision_in_one_line(classifier_dir, tmp_path, caplog, fresh_choice,
                                                              precision, expected):
    for name, run in _run_each(classifier_dir, tmp_path, precision):
        probe.reset()
        caplog.clear()
        with caplog.at_level(logging.INFO):
            run()
        [line] = _precision_lines(caplog)  # one line, not one per batch or per model copy
        assert line.levelno == logging.INFO and line.getMessage().startswith(expected), name
        if precision == "auto":  # the test profile (tests/conftest.py): bf16 measured faster
            assert "GFLOP/s" in line.getMessage() and "probe BERTKIT_PROBE_FILE" in line.getMessage()


def test_auto_on_a_gpu_says_what_it_chose_without_probing(monkeypatch, caplog, fresh_choice):
    monkeypatch.setattr(probe, "measurements", lambda *a, **k: pytest.fail("probed for a GPU"))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    with caplog.at_level(logging.INFO):
        assert probe.auto_precision(torch.device("cuda"), purpose="inference") == "bf16"
    assert "precision auto for inference: bf16 (this CUDA device supports it)" in caplog.messages


def test_bertkit_predict_prints_the_precision_auto_chose(classifier_dir, tmp_path):
    source = tmp_path / "new.jsonl"
    source.write_text('{"text": "the cat sat"}\n{"text": "john lives in london"}\n', encoding="utf-8")
    command = [sys.executable, "-m", "bertkit", "predict", "--model", str(classifier_dir), "--input", str(source),
               "--output", str(tmp_path / "out"), "--device", "cpu"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    [line] = [line for line in done.stderr.splitlines() if "precision" in line]
    assert line.startswith("INFO bertkit.runtime.probe: precision auto for inference: bf16 (")
    assert "2 predictions written" in done.stdout
