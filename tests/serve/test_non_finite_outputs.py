"""A model that computes NaN or infinite values (altered weights, doctored int8 scales) is never answered as
numbers (issue 50: `/embed` answered 200 with `null` everywhere, `bertkit extract` exited 0 with NaN vectors):
the server's warm-up fails and /ready says why, every route that runs the model answers a 500 naming the cause
(in OpenAI's shape under /v1/), and `extract`, `predict` and `evaluate` stop in one line without leaving an
output behind."""

from __future__ import annotations

import shutil
import time

import pytest
import torch
from fastapi.testclient import TestClient
from safetensors.torch import load_file, save_file

from bertkit.cli import main
from bertkit.serve.app import create_app
from bertkit.serve.predictor import load_predictor

ROUTES = [("/embed", {"inputs": "the cat"}), ("/similarity", {"inputs": {"source_sentence": "the cat",
                                                                        "sentences": ["a dog"]}}),
          ("/embed_all", {"inputs": "the cat"}), ("/v1/embeddings", {"input": "the cat", "model": "m"}),
          ("/predict", {"inputs": "the cat"}), ("/classify", {"inputs": ["the cat"]})]


@pytest.fixture
def nan_dir(classifier_dir, tmp_path):
    """The classifier with its first feed-forward's weights at 1e38: finite (so the directory loads), but their
    products overflow to inf, and every output is NaN - what altered weights or kept state do silently."""
    directory = tmp_path / "nan"
    shutil.copytree(classifier_dir, directory)
    weights = load_file(directory / "model.safetensors")
    name = next(k for k in weights if k.endswith("layer.0.intermediate.dense.weight"))
    weights[name] = torch.full_like(weights[name], 1e38)
    save_file(weights, str(directory / "model.safetensors"), metadata={"format": "pt"})
    return directory


def _settled(client: TestClient):
    """/ready once the warm-up has finished, one way or the other (it runs beside the first requests)."""
    deadline = time.monotonic() + 30
    while (ready := client.get("/ready")).json().get("code") == "not_ready" and time.monotonic() < deadline:
        time.sleep(0.05)
    return ready


def test_a_model_that_computes_nan_is_not_ready_and_never_answers_numbers(nan_dir):
    with TestClient(create_app(load_predictor(nan_dir)), raise_server_exceptions=False) as client:
        ready = _settled(client)
        assert ready.status_code == 503 and ready.json()["code"] == "warm_up_failed"
        assert "NaN or infinite" in ready.json()["error"]
        for path, body in ROUTES:
            answer = client.post(path, json=body)
            assert answer.status_code == 500 and "NaN or infinite" in answer.text, (path, answer.text)
        assert client.post("/v1/embeddings", json={"input": "x", "model": "m"}).json()["error"]["code"] == \
            "non_finite_output"


def test_a_model_that_turns_nan_after_warm_up_answers_500_not_null(classifier_dir):
    predictor = load_predictor(classifier_dir)
    with TestClient(create_app(predictor), raise_server_exceptions=False) as client:
        assert _settled(client).status_code == 200
        assert client.post("/embed", json={"inputs": "the cat"}).status_code == 200
        with torch.no_grad():
            for parameter in predictor.model.parameters():
                parameter.fill_(float("nan"))
        for path, body in ROUTES:
            answer = client.post(path, json=body)
            assert answer.status_code == 500 and "non_finite_output" in answer.text, (path, answer.text)


@pytest.mark.parametrize("command", ["extract", "predict", "evaluate"])
def test_extract_predict_and_evaluate_stop_in_one_line_and_leave_no_output(command, nan_dir, tmp_path, capsys):
    data = tmp_path / "in.csv"
    data.write_text("text,label\nthe cat,positive\na dog,negative\n", encoding="utf-8")
    output = tmp_path / ("vectors.npy" if command == "extract" else "out")
    argv = [command, "--model", str(nan_dir), "--input", str(data), "--output", str(output)]
    if command == "extract":
        argv += ["--text-column", "text"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "NaN or infinite" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not output.exists() or not any(output.iterdir())
    assert not list(tmp_path.glob("*.partial"))
