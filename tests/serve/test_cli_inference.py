"""`bertkit extract`, `bertkit export onnx` and `bertkit serve` through the real command line."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import tomllib
from pathlib import Path

import httpx
import numpy as np
import pytest

from bertkit.cli import main
from bertkit.cli.inference import EXTRAS
from bertkit.serve.client import wait_until_ready
from bertkit.serve.predictor import load_predictor
from bertkit.settings import ServeSettings
from bertkit.tokenizer import WordPieceTokenizer

from .conftest import VOCAB, free_port


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


def test_extract_refuses_a_max_seq_length_past_the_position_embeddings(tmp_path, capsys):
    """It was cut to the model's 512 (here 16) without a word; a default longer than the model is still cut."""
    from bertkit.model import BertForMaskedLM

    from .conftest import build

    model = build(tmp_path / "short", BertForMaskedLM, max_position_embeddings=16)
    source = tmp_path / "in.txt"
    source.write_text("the cat sat on the mat " * 10 + "\n", encoding="utf-8")
    output = tmp_path / "f.jsonl"
    argv = ["extract", "--model", str(model), "--input", str(source), "--output", str(output), "--layers", "-1"]
    assert main([*argv, "--max-seq-length", "2048"]) == 2
    error = capsys.readouterr().err
    assert error == (f"bertkit: error: --max-seq-length 2048 exceeds the model's max_position_embeddings (16, "
                     f"{model / 'config.json'}); give at most 16\n")
    assert not output.exists()
    assert main(argv) == 0  # unset: 128, cut to the model's 16
    assert len(json.loads(output.read_text())["features"]) == 16


def test_serve_without_the_serve_extra_says_what_to_install(mlm_dir, monkeypatch, capsys):
    """A plain `pip install -e .` has no uvicorn: one line naming the extra, exit 2, no traceback."""
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # an import of it fails, as when it is not installed
    assert main(["serve", "--model", str(mlm_dir)]) == 2
    assert capsys.readouterr().err == ("bertkit: error: bertkit serve needs the optional packages of bertkit[serve] "
                                       "(uvicorn not installed); install them with: pip install \"bertkit[serve]\"\n")


def test_the_extras_checked_are_pyprojects():
    extras = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    for extra, modules in EXTRAS.items():
        names = {re.match(r"[A-Za-z0-9_.-]+", requirement)[0].replace("-", "_") for requirement in extras[extra]}
        assert set(modules) == names, extra


def test_serve_help_shows_safe_defaults(capsys):
    assert main(["serve", "--help"]) == 0
    out = capsys.readouterr().out
    for text in ("127.0.0.1", "--api-key", "BERTKIT_API_KEY", "--max-batch-size", "--max-queue", "--timeout",
                 "--max-body-bytes", "--max-inputs", "--max-input-chars", "--drain-timeout", "--max-connections",
                 "--header-timeout", "--body-timeout", "--keep-alive-timeout", "--max-header-bytes", "--tokenizer"):
        assert text in out


def test_serving_code_never_imports_training_code():
    code = ("import sys, bertkit.serve.app, bertkit.workflows.extract, bertkit.export.onnx, bertkit.cli.inference; "
            "bad = [m for m in sys.modules if m.startswith('bertkit.train')]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.fixture(scope="module")
def cased_tokenizer_dir(tmp_path_factory):
    """The models' vocabulary without lower-casing: 'The' is [UNK] to it, 'the' to the model's own."""
    directory = tmp_path_factory.mktemp("cased")
    WordPieceTokenizer(VOCAB, do_lower_case=False).save_pretrained(directory)
    return directory


def test_load_predictor_takes_another_tokenizer_directory(mlm_dir, cased_tokenizer_dir, tmp_path, capsys):
    assert load_predictor(mlm_dir).tokenizer.tokenize("The cat") == ["the", "cat"]
    cased = load_predictor(ServeSettings(mlm_dir, tokenizer=cased_tokenizer_dir))
    assert cased.tokenizer.tokenize("The cat") == ["[UNK]", "cat"]
    WordPieceTokenizer([*VOCAB, "extra"]).save_pretrained(tmp_path)
    assert main(["serve", "--model", str(mlm_dir), "--tokenizer", str(tmp_path)]) == 2
    assert "vocab.txt is not the vocabulary of the model in" in capsys.readouterr().err  # more tokens, and not its own


def test_serve_on_a_port_in_use_is_one_line_before_the_model_loads(mlm_dir, monkeypatch, capsys):
    """It loaded the model, printed "serving ... on", then uvicorn's "[Errno 98] address already in use"."""
    import socket

    from bertkit.serve import predictor as predictor_module

    loaded = []
    monkeypatch.setattr(predictor_module, "load_predictor", lambda *a, **k: loaded.append(1))
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        assert main(["serve", "--model", str(mlm_dir), "--host", "127.0.0.1", "--port", str(port)]) == 2
    out = capsys.readouterr()
    assert f"--port {port}: 127.0.0.1:{port} is in use (another server?); stop it or choose another --port" in out.err
    assert "serving" not in out.out and "Traceback" not in out.err and loaded == []



def test_the_port_check_binds_as_uvicorn_does():
    """Every interface ("" or 0.0.0.0), and "::" beside an IPv4 server on the same port (asyncio's IPv6 sockets
    are IPv6-only), are free; a port held on the same family is not."""
    import socket

    from bertkit.errors import BertkitError
    from bertkit.serve.app import check_port_free

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(BertkitError, match=f"--port {port}: 0.0.0.0:{port} is in use"):
            check_port_free("0.0.0.0", port)
        if socket.has_ipv6:
            check_port_free("::", port)
    check_port_free("", port)  # every interface, once released
    check_port_free("127.0.0.1", 0)  # any free port: nothing to check

@pytest.mark.timeout(120)
def test_bertkit_serve_answers_and_stops_on_sigterm(mlm_dir, cased_tokenizer_dir):
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "bertkit", "serve", "--model", str(mlm_dir), "--port", str(port),
                                "--tokenizer", str(cased_tokenizer_dir), "--log-level", "warning"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(url, process, timeout_s=120)
        response = httpx.post(f"{url}/fill-mask", json={"inputs": ["the [MASK] sat"], "top_k": 2})
        assert response.status_code == 200 and len(response.json()["results"][0][0]) == 2
        cased = httpx.post(f"{url}/embed", json={"inputs": ["The cat", "qqq cat", "the cat"]}).json()
        assert cased[0] == cased[1] != cased[2]  # 'The' is [UNK] like 'qqq': the --tokenizer directory's rules
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
