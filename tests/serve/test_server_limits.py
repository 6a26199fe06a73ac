"""The HTTP layer through TestClient: every endpoint's answer, and each limit and status code.

Malformed requests of every kind must get a 4xx JSON body that carries no path and no traceback.
"""

from __future__ import annotations

import json
import re
import time

import numpy as np
import pytest
from fastapi.testclient import TestClient

from bertkit.serve.app import create_app
from bertkit.serve.predictor import load_predictor
from bertkit.settings import Limits, ServerSettings

LIMITS = Limits(max_body_bytes=4096, max_inputs=4, max_input_chars=200)

EVERY_MODEL = ("/embed", "/embed_all", "/similarity", "/v1/embeddings", "/embeddings", "/tokenize", "/decode", "/info",
               "/metrics", "/ready", "/health", "/ping", "/", "/invocations", "/docs")
"""What every model serves beside its task endpoints (the 404 body and /info list them)."""


def _client(directory, **settings) -> TestClient:
    predictor = load_predictor(directory)
    return TestClient(create_app(predictor, ServerSettings(limits=LIMITS, **settings)), raise_server_exceptions=False)


def _wait_ready(client: TestClient) -> None:
    deadline = time.monotonic() + 30
    while client.get("/ready").status_code != 200:
        assert time.monotonic() < deadline, "the server never became ready"
        time.sleep(0.01)


@pytest.fixture(scope="module")
def mlm(mlm_dir):
    with _client(mlm_dir) as client:
        _wait_ready(client)
        yield client


def _assert_clean_error(response, status: int, error: str | None = None) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) >= {"error", "error_type", "code"}  # TEI's shape, with bertkit's code
    if error is not None:
        assert body["code"] == error
    assert "Traceback" not in response.text and "/tmp" not in response.text and ".py" not in response.text
    return body


def _same_but_float_bits(actual: object, expected: object) -> bool:
    """Equal JSON, floats within 1e-5 relative: a batch changes the last bits of float results on some CPUs
    (an Intel Xeon with AMX: 0.10641028771 batched, 0.10641027927 alone), so a batch and single requests, or
    the server and the predictor, agree on everything else exactly and on scores to float32 rounding."""
    if isinstance(actual, float) or isinstance(expected, float):
        return actual == pytest.approx(expected, rel=1e-5, abs=1e-7)
    if isinstance(actual, dict) and isinstance(expected, dict):
        return actual.keys() == expected.keys() and all(_same_but_float_bits(actual[k], expected[k]) for k in actual)
    if isinstance(actual, list) and isinstance(expected, list):
        return len(actual) == len(expected) and all(map(_same_but_float_bits, actual, expected))
    return actual == expected


def test_fill_mask_and_embed_answer_like_the_predictor(mlm, mlm_dir):
    predictor = load_predictor(mlm_dir)
    response = mlm.post("/fill-mask", json={"inputs": ["the [MASK] sat", "paris is [MASK]"], "top_k": 2})
    assert response.status_code == 200
    expected = predictor.fill_mask(["the [MASK] sat", "paris is [MASK]"], 2)
    assert _same_but_float_bits(response.json()["results"], json.loads(json.dumps(expected)))
    response = mlm.post("/embed", json={"inputs": "the cat", "pooling": "mean", "normalize": False})
    np.testing.assert_allclose(response.json(), predictor.embed(["the cat"], "mean"), atol=1e-6)  # TEI's bare list
    response = mlm.post("/embed", json={"inputs": "the cat", "pooling": "mean"})  # TEI's default: unit length
    np.testing.assert_allclose(response.json(), predictor.embed(["the cat"], "mean", normalize=True), atol=1e-6)


def test_probes_and_openapi(mlm):
    assert mlm.get("/health").json() == {"status": "ok"}
    assert mlm.get("/ready").json() == {"status": "ready"}
    paths = mlm.get("/openapi.json").json()["paths"]
    assert {"/fill-mask", "/embed", "/health", "/ready"} <= set(paths) and "/classify" not in paths
    assert mlm.get("/docs").status_code == 200


def test_the_docs_pages_load_everything_from_this_server(mlm):
    """/docs and /redoc work offline: no URL of another host, and every script, style, icon and the API
    description they name answers here."""
    for page in ("/docs", "/redoc"):
        html = mlm.get(page).text
        assert "://" not in html and "'//" not in html and '"//' not in html, html
        urls = set(re.findall(r"""(?:src|href|spec-url)="(/[^"]*)"|url: '(/[^']*)'""", html))
        named = {url for pair in urls for url in pair if url}
        assert {"/openapi.json"} < named and any(url.endswith(".js") for url in named), named
        for url in named:
            response = mlm.get(url)
            assert response.status_code == 200 and len(response.content) > 100, url


def test_other_endpoints_404_with_what_this_model_serves(mlm):
    body = _assert_clean_error(mlm.post("/classify", json={"inputs": ["x"]}), 404, "not_found")
    assert body["endpoints"] == ["/fill-mask", *EVERY_MODEL]
    _assert_clean_error(mlm.get("/fill-mask"), 405, "method_not_allowed")


@pytest.mark.parametrize("payload, status, error", [
    (b"{not json", 400, "invalid_json"),
    (b"", 422, None),
    (b"[]", 422, "invalid_request"),
    (b'{"inputs": 5}', 422, "invalid_request"),
    (b'{"inputs": [1, 2]}', 422, "invalid_request"),
    (b'{"inputs": ["a [MASK]"], "top_k": "5"}', 422, "invalid_request"),
    (b'{"inputs": ["a [MASK]"], "top_k": 100000000000000000000000000000000}', 422, "invalid_request"),
    (b'{"inputs": ["a [MASK]"], "top_k": 1e999}', 422, "invalid_request"),
    (b'{"inputs": ["a [MASK]"], "top_k": NaN}', 422, "invalid_request"),
    (b'{"inputs": ["a [MASK]"], "top_k": ' + b"9" * 5000 + b"}", 422, None),
    (b'{"inputs": ["a [MASK]"], "unknown": 1}', 200, None),  # unknown fields are ignored, as TEI ignores them
    (b'{"inputs": ["a [MASK]"], "__class__": "os.system"}', 200, None),
    (b'{"inputs": []}', 400, "empty"),
    (b'{"inputs": [""]}', 400, "empty"),
    (b'{"inputs": ["no mask"]}', 422, "no_mask"),
    (b'{"inputs": ["\\ud800 [MASK]"]}', 422, "invalid_text"),
    (b'\xff\xfe\x00garbage', 400, "invalid_json"),
    (json.dumps({"inputs": ["\u202e\u0000\U0001f600 [MASK] \ufffd\U000e0001"]}).encode(), 200, None),
    (b'{"inputs": "' + b"[" * 3000 + b'"}', 422, None),
    (b"[" * 2000 + b"]" * 2000, 422, None),
])
def test_malformed_requests_get_4xx_json(mlm, payload, status, error):
    response = mlm.post("/fill-mask", content=payload, headers={"Content-Type": "application/json"})
    if status == 200:
        assert response.status_code == 200
        return
    assert 400 <= response.status_code < 500, response.text
    body = response.json()
    assert "Traceback" not in response.text and ".py" not in response.text
    if error is not None:
        assert response.status_code == status and body["code"] == error


def test_limits_inputs_and_characters_422(mlm):
    body = _assert_clean_error(mlm.post("/fill-mask", json={"inputs": ["a [MASK]"] * 5}), 422, "too_many_inputs")
    assert "maximum allowed batch size 4" in body["error"]
    response = mlm.post("/fill-mask", json={"inputs": ["a [MASK] " + "x" * 300]})
    body = _assert_clean_error(response, 422, "input_too_long")
    assert "limit is 200" in body["error"]
    _assert_clean_error(mlm.post("/embed", json={"inputs": ["a"] * 5}), 422, "too_many_inputs")


def test_a_body_sent_as_a_form_is_415_naming_the_header(mlm):
    """curl -d sends application/x-www-form-urlencoded: the answer says to send JSON with its header (it was a
    422 about the schema), in the server's error shape, and OpenAI's under /v1/."""
    body = b'{"inputs": ["the [MASK] sat"]}'
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    refused = _assert_clean_error(mlm.post("/fill-mask", content=body, headers=form), 415, "unsupported_media_type")
    assert "Content-Type: application/json" in refused["error"] and "x-www-form-urlencoded" in refused["error"]
    _assert_clean_error(mlm.post("/", content=b'{"inputs": "a"}', headers={"Content-Type": "text/plain"}), 415)
    openai = mlm.post("/v1/embeddings", content=b'{"input": "a"}', headers=form)
    assert openai.status_code == 415 and openai.json()["error"]["code"] == "unsupported_media_type"
    assert "sent without a Content-Type" in _assert_clean_error(mlm.post("/fill-mask", content=body), 415)["error"]
    assert mlm.post("/fill-mask", content=body, headers={"Content-Type": "application/json; charset=utf-8"}
                    ).status_code == 200


def test_body_size_413_before_parsing(mlm):
    big = json.dumps({"inputs": ["a [MASK]"], "pad": "x" * 5000}).encode()
    _assert_clean_error(mlm.post("/fill-mask", content=big, headers={"Content-Type": "application/json"}),
                        413, "body_too_large")

    def chunks():  # no Content-Length: chunked transfer is counted as it arrives
        for _ in range(10):
            yield b"x" * 1000

    _assert_clean_error(mlm.post("/fill-mask", content=chunks()), 413, "body_too_large")


def test_api_key_401(mlm_dir):
    with _client(mlm_dir, api_key="s3cret") as client:
        _wait_ready(client)
        assert client.get("/health").status_code == 200  # probes stay open for orchestrators
        _assert_clean_error(client.post("/embed", json={"inputs": ["a"]}), 401, "unauthorized")
        _assert_clean_error(client.post("/embed", json={"inputs": ["a"]}, headers={"X-API-Key": "wrong"}), 401)
        assert client.post("/embed", json={"inputs": ["a"]}, headers={"X-API-Key": "s3cret"}).status_code == 200
        ok = client.post("/embed", json={"inputs": ["a"]}, headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200


def test_task_endpoints(classifier_dir, tagger_dir, squad_dir):
    with _client(classifier_dir) as client:
        [result] = client.post("/classify", json={"inputs": ["the cat"], "text_pairs": ["sat"]}).json()["results"]
        assert result["label"] in {"negative", "positive", "neutral"}
        _assert_clean_error(client.post("/classify", json={"inputs": ["a", "b"], "text_pairs": ["c"]}), 422)
        _assert_clean_error(client.post("/fill-mask", json={"inputs": ["a [MASK]"]}), 404)
    with _client(tagger_dir) as client:
        assert isinstance(client.post("/tag", json={"inputs": ["john smith lives in london"]}).json()["results"][0],
                          list)
    with _client(squad_dir) as client:
        context = "john smith lives in london " * 5
        result = client.post("/answer", json={"question": "where?", "context": context}).json()
        assert set(result) == {"answer", "score", "start", "end", "no_answer"}
        if not result["no_answer"]:
            assert context[result["start"]:result["end"]] == result["answer"]
        _assert_clean_error(client.post("/answer", json={"question": "where?", "context": "x" * 300}), 422,
                            "input_too_long")
        _assert_clean_error(client.post("/answer", json={"question": "where?"}), 422, "invalid_request")


def test_answer_takes_a_batch_of_question_context_pairs(squad_dir):
    pairs = [{"question": "where?", "context": "john smith lives in london " * 3},
             {"question": "who lives in london?", "context": "john smith lives in london"}]
    with _client(squad_dir) as client:
        singles = [client.post("/answer", json=pair).json() for pair in pairs]
        batch = client.post("/answer", json={"inputs": pairs})
        assert batch.status_code == 200 and _same_but_float_bits(batch.json(), {"results": singles})
        _assert_clean_error(client.post("/answer", json={"inputs": []}), 400, "empty")
        _assert_clean_error(client.post("/answer", json={"inputs": pairs * 3}), 422, "too_many_inputs")
        long = [pairs[0], {"question": "where?", "context": "x" * 300}]
        body = _assert_clean_error(client.post("/answer", json={"inputs": long}), 422, "input_too_long")
        assert "inputs[1].context" in body["error"]
        _assert_clean_error(client.post("/answer", json={**pairs[0], "inputs": pairs}), 422, "invalid_request")
        _assert_clean_error(client.post("/answer", json={"inputs": [{"question": "where?"}]}), 422, "invalid_request")
