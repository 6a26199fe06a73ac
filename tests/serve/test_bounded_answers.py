"""What one request can make the server hold is bounded (issue 50: /embed_all of 64 x 300 ids answered a 130 MB
JSON body built on the event loop, and /health waited 0.89 s): /embed_all answers at most --max-token-vectors
token vectors a request, refused before the model runs, and its JSON is made on a worker thread."""

from __future__ import annotations

import threading

import numpy as np
from fastapi.testclient import TestClient

from bertkit.serve import tei
from bertkit.serve.app import create_app
from bertkit.serve.predictor import load_predictor
from bertkit.settings import Limits, ServerSettings


def test_embed_all_is_capped_in_token_vectors_before_the_model_runs(bert_dir):
    predictor = load_predictor(bert_dir)
    settings = ServerSettings(limits=Limits(max_token_vectors=20))
    runs = []
    real = predictor.token_vectors
    predictor.token_vectors = lambda *a, **k: runs.append(1) or real(*a, **k)  # type: ignore[method-assign]
    with TestClient(create_app(predictor, settings)) as client:
        runs.clear()  # (the warm-up)
        refused = client.post("/embed_all", json={"inputs": ["the cat sat on the mat"] * 4})  # 4 x 8 tokens
        assert refused.status_code == 422 and refused.json()["code"] == "too_many_token_vectors"
        assert "read 32 tokens" in refused.json()["error"] and "--max-token-vectors" in refused.json()["error"]
        assert runs == []
        answer = client.post("/embed_all", json={"inputs": ["the cat sat on the mat", "a dog"]})  # 8 + 4
        assert answer.status_code == 200 and answer.headers["content-type"] == "application/json"
        vectors = answer.json()
        assert [len(v) for v in vectors] == [8, 4]
        expected = predictor.token_vectors(["the cat sat on the mat", "a dog"])
        np.testing.assert_allclose(np.array(vectors[0]), expected[0], rtol=0, atol=1e-6)


def test_the_answer_is_serialised_off_the_event_loop(bert_dir, monkeypatch):
    threads = []
    real = tei.json_bytes
    monkeypatch.setattr(tei, "json_bytes", lambda value: threads.append(threading.current_thread()) or real(value))
    with TestClient(create_app(load_predictor(bert_dir))) as client:
        loop_thread = client.portal.call(threading.current_thread)
        assert client.post("/embed_all", json={"inputs": "the cat"}).status_code == 200
    assert threads and threads[0] is not loop_thread
