"""`bertkit extract`, `bertkit export onnx` and `bertkit serve` through the real command line."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import httpx
import numpy as np
import pytest

from bertkit.cli import main

from .test_server_process import _free_port, _wait_ready


def test_extract_jsonl_and_npy(mlm_dir, tmp_path, capsys):
    source = tmp_path / "in.txt"
    source.write_text("the cat sat\njohn ||| london\n", encoding="utf-8")
    assert main(["extract", "--model", str(mlm_dir), "--input", str(source), "--output", str(tmp_path / "f.jsonl"),
                 "--layers", "-1,-2"]) == 0
    lines = [json.loads(line) for line in (tmp_path / "f.jsonl").read_text().splitlines()]
    assert len(lines) == 2 and len(lines[0]["features"][0]["layers"]) == 2
    assert main(["extract", "--model", str(mlm_dir), "--input", str(source), "--output", str(tmp_path / "v.npy"),
                 "--layers", "-1", "--pooling", "mean"]) == 0
    assert np.load(tmp_path / "v.npy").shape == (2, 32)
    assert main(["extract", "--model", str(mlm_dir), "--input", str(source), "--output", str(tmp_path / "x.jsonl"),
                 "--layers", "-9"]) == 2
    assert "bertkit: error: --layers '-9'" in capsys.readouterr().err
    assert main(["extract", "--model", str(mlm_dir), "--input", str(source), "--output", str(tmp_path / "x.jsonl"),
                 "--pooling", "mean"]) == 2
    assert "bertkit: error: --output" in capsys.readouterr().err and not (tmp_path / "x.jsonl").exists()
    assert main(["extract", "--model", str(mlm_dir), "--tokenizer", str(mlm_dir / "vocab.txt"), "--input", str(source),
                 "--output", str(tmp_path / "n.npy"), "--pooling", "max", "--normalize"]) == 0
    assert np.linalg.norm(np.load(tmp_path / "n.npy"), axis=1) == pytest.approx([1.0, 1.0])


def test_export_onnx_prints_the_check_and_the_int8_change(classifier_dir, tmp_path, capsys):
    assert main(["export", "onnx", "--model", str(classifier_dir), "--output", str(tmp_path / "m.onnx"),
                 "--quantize", "int8"]) == 0
    out = capsys.readouterr().out
    assert "onnxruntime vs PyTorch (fp32): max |diff|" in out and "int8 dynamic quantization" in out


def test_serve_help_shows_safe_defaults(capsys):
    assert main(["serve", "--help"]) == 0
    out = capsys.readouterr().out
    for text in ("127.0.0.1", "--api-key", "BERTKIT_API_KEY", "--max-batch-size", "--max-queue", "--timeout",
                 "--max-body-bytes", "--max-inputs", "--max-input-chars", "--drain-timeout"):
        assert text in out


def test_serving_code_never_imports_training_code():
    code = ("import sys, bertkit.serve.app, bertkit.features, bertkit.export, bertkit.cli.inference; "
            "bad = [m for m in sys.modules if m.startswith('bertkit.train')]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.timeout(120)
def test_bertkit_serve_answers_and_stops_on_sigterm(mlm_dir):
    port = _free_port()
    process = subprocess.Popen([sys.executable, "-m", "bertkit", "serve", "--model", str(mlm_dir), "--port", str(port),
                                "--log-level", "warning"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url)
        response = httpx.post(f"{url}/fill-mask", json={"inputs": ["the [MASK] sat"], "top_k": 2})
        assert response.status_code == 200 and len(response.json()["results"][0][0]) == 2
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0, process.stdout.read().decode()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_extract_in_bf16_is_close_to_fp32(mlm_dir, tmp_path):
    source = tmp_path / "in.txt"
    source.write_text("the cat sat on the mat\nwhere did the dog go ||| to the park\n", encoding="utf-8")
    for precision in ("fp32", "bf16"):
        assert main(["extract", "--model", str(mlm_dir), "--input", str(source), "--output",
                     str(tmp_path / f"{precision}.npy"), "--layers", "-1", "--pooling", "mean",
                     "--precision", precision]) == 0
    exact, fast = np.load(tmp_path / "fp32.npy"), np.load(tmp_path / "bf16.npy")
    assert exact.shape == fast.shape == (2, 32) and fast.dtype == np.float32
    np.testing.assert_allclose(fast, exact, atol=0.05, rtol=0.05)
    assert not np.array_equal(fast, exact)  # the encoder really ran in bf16
