"""Observability: /metrics scraped and parsed after a few requests, X-Request-ID on every response, and
the JSON access log.

The app is the real one over a tiny MLM; the access log is read from a handler attached to the
`bertkit.access` logger (so the app leaves the logger's output to it).
"""

from __future__ import annotations

import json
import logging
import re

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from bertkit.cli import main
from bertkit.serve.app import create_app
from bertkit.serve.cost import token_cost
from bertkit.serve.predictor import load_predictor
from bertkit.serve.routes import CALLS
from bertkit.settings import Limits, ServerSettings

GENERATED_ID = re.compile(r"[0-9a-f]{32}")


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture()
def access_log():
    logger, handler = logging.getLogger("bertkit.access"), _Lines()
    logger.addHandler(handler)
    yield handler.lines
    logger.removeHandler(handler)


def _samples(client: TestClient) -> dict[tuple[str, frozenset], float]:
    response = client.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(response.text) for s in family.samples}


def _value(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def test_metrics_count_requests_batches_and_tokens(mlm_dir, access_log):
    predictor = load_predictor(mlm_dir)
    counts = token_cost(predictor, CALLS)

    def cost(key, text):
        return counts(key, [text])[0]

    texts = ["the cat sat", "the dog ran in the park", "paris"]
    app = create_app(predictor, ServerSettings(json_access_log=True, limits=Limits(max_body_bytes=512)))
    with TestClient(app) as client:
        assert client.post("/embed", json={"inputs": texts[:2]}).status_code == 200
        assert client.post("/embed", json={"inputs": texts[2]}).status_code == 200
        assert client.post("/fill-mask", json={"inputs": "the [MASK] sat"}).status_code == 200
        assert client.post("/embed", json={"inputs": []}).status_code == 400
        assert client.post("/embed", json={"inputs": "x" * 600}).status_code == 413
        assert client.get("/no/such/path/12345").status_code == 404
        samples = _samples(client)
        text = client.get("/metrics").text

    def requests(endpoint: str, status: str, method: str = "POST") -> float:
        return _value(samples, "bertkit_requests_total", endpoint=endpoint, method=method, status=status)

    assert requests("/embed", "200") == 2 and requests("/fill-mask", "200") == 1
    assert requests("/embed", "400") == 1 and requests("/embed", "413") == 1
    assert requests("unmatched", "404", "GET") == 1 and "12345" not in text  # route templates, not raw paths
    assert _value(samples, "bertkit_request_duration_seconds_count", endpoint="/embed", method="POST",
                  status="200") == 2
    embed_tokens = sum(cost(("embed",), t) for t in texts)
    assert _value(samples, "bertkit_tokens_total", call="embed") == embed_tokens
    assert _value(samples, "bertkit_batch_tokens_sum", call="embed") == embed_tokens
    assert _value(samples, "bertkit_batch_inputs_sum", call="embed") == 3
    assert _value(samples, "bertkit_queue_seconds_count", call="embed") == 2  # one per request
    assert _value(samples, "bertkit_queue_seconds_count", call="fill-mask") == 1
    assert _value(samples, "bertkit_batch_inference_seconds_count", call="embed") >= 1
    assert _value(samples, "bertkit_batch_inputs_count", call="embed") == \
        _value(samples, "bertkit_batch_inference_seconds_count", call="embed")
    assert ("bertkit_queue_depth", frozenset()) in samples
    assert ("process_cpu_seconds_total", frozenset()) in samples

    lines = [json.loads(line) for line in access_log]
    assert len(lines) == 8  # the six requests and the two scrapes
    first = lines[0]
    assert set(first) == {"time", "request_id", "method", "path", "status", "duration_ms", "inputs", "tokens",
                          "client", "trace_id"}
    assert (first["method"], first["path"], first["status"], first["inputs"]) == ("POST", "/embed", 200, 2)
    assert first["tokens"] == sum(cost(("embed",), t) for t in texts[:2])
    assert GENERATED_ID.fullmatch(first["request_id"]) and first["duration_ms"] > 0
    assert first["client"] == "testclient" and first["time"].endswith("+00:00")
    assert [line["status"] for line in lines] == [200, 200, 200, 400, 413, 404, 200, 200]
    assert lines[3]["inputs"] == 0 and lines[5]["path"] == "/no/such/path/12345"


def test_each_app_keeps_its_own_metrics_and_metrics_need_no_api_key(mlm_dir):
    predictor = load_predictor(mlm_dir)
    with TestClient(create_app(predictor)) as first:
        assert first.post("/embed", json={"inputs": "the cat"}).status_code == 200
        with TestClient(create_app(predictor, ServerSettings(api_key="secret"))) as second:
            assert second.post("/embed", json={"inputs": "the cat"}).status_code == 401
            samples = _samples(second)  # no key
        assert _value(samples, "bertkit_requests_total", endpoint="/embed", method="POST", status="401") == 1
        assert _value(samples, "bertkit_requests_total", endpoint="/embed", method="POST", status="200") == 0
        assert _value(_samples(first), "bertkit_requests_total", endpoint="/embed", method="POST", status="200") == 1
        assert "/metrics" in first.get("/openapi.json").json()["paths"]


def test_request_id_is_echoed_or_generated_on_every_response(mlm_dir):
    predictor = load_predictor(mlm_dir)

    def broken(texts, **options):
        raise RuntimeError("a bug")

    app = create_app(predictor, ServerSettings(limits=Limits(max_body_bytes=256)))
    with TestClient(app, raise_server_exceptions=False) as client:
        for request_id in ["abc-123", "0f" * 16, "x" * 128]:
            response = client.post("/embed", json={"inputs": "the cat"}, headers={"X-Request-ID": request_id})
            assert response.status_code == 200 and response.headers["x-request-id"] == request_id
        for bad in [b"has space", b"x" * 129, "caf\u00e9".encode(), b"", b"tab\there"]:
            response = client.get("/health", headers={"X-Request-ID": bad})
            assert GENERATED_ID.fullmatch(response.headers["x-request-id"]), bad
        responses = [client.get("/health"), client.post("/embed", json={"inputs": []}),
                     client.post("/embed", content=b"{", headers={"Content-Type": "application/json"}),
                     client.post("/embed", json={"inputs": "x" * 300}), client.get("/nowhere"), client.get("/embed")]
        assert [r.status_code for r in responses] == [200, 400, 400, 413, 404, 405]
        predictor.embed = broken  # type: ignore[method-assign]
        responses.append(client.post("/embed", json={"inputs": "the cat"}, headers={"X-Request-ID": "bug-1"}))
        assert responses[-1].status_code == 500 and responses[-1].headers["x-request-id"] == "bug-1"
        ids = [r.headers["x-request-id"] for r in responses[:-1]]
        assert all(GENERATED_ID.fullmatch(i) for i in ids) and len(set(ids)) == len(ids)
        samples = _samples(client)
    assert _value(samples, "bertkit_requests_total", endpoint="/embed", method="POST", status="500") == 1


def test_serve_help_lists_the_access_log_flag(capsys):
    assert main(["serve", "--help"]) == 0
    assert "--json-access-log" in capsys.readouterr().out
    assert ServerSettings().json_access_log is False
