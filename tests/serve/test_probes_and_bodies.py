"""Issue 50's smaller findings: a monitor that checks with HEAD gets what GET says, not a 405; a body json.loads
cannot read for other reasons than a syntax error (a 5,000-digit number, nesting past Python's recursion, a gzip
body, Latin-1 bytes) is `invalid_json` as the docs say, not `http_error`; over real sockets too."""

from __future__ import annotations

import gzip
import time

import pytest
from fastapi.testclient import TestClient

from bertkit.serve.app import create_app
from bertkit.serve.predictor import load_predictor


@pytest.fixture(scope="module")
def client(bert_dir):
    with TestClient(create_app(load_predictor(bert_dir)), raise_server_exceptions=False) as client:
        deadline = time.monotonic() + 30
        while client.get("/ready").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        yield client


@pytest.mark.parametrize("path", ["/health", "/ready", "/info", "/metrics", "/"])
def test_head_answers_as_get_without_a_body(client, path):
    get, head = client.get(path), client.head(path)
    assert head.status_code == get.status_code == 200 and head.content == b""
    assert head.headers["content-type"] == get.headers["content-type"]


@pytest.mark.parametrize("body", [b'{"inputs": ' + b"9" * 5000 + b"}", b"[" * 100_000 + b"]" * 100_000,
                                  gzip.compress(b'{"inputs": "the cat"}'), '{"inputs": "café"}'.encode("latin-1")])
def test_a_body_that_is_not_json_for_any_reason_is_invalid_json(client, body):
    answer = client.post("/embed", content=body, headers={"Content-Type": "application/json"})
    assert answer.status_code in (400, 422) and answer.json()["code"] == "invalid_json", answer.text


def test_head_over_a_real_connection(bert_dir):
    import urllib.request

    from .conftest import LiveServer

    with LiveServer(create_app(load_predictor(bert_dir))) as url:
        for path in ("/health", "/ready", "/metrics"):
            with urllib.request.urlopen(urllib.request.Request(f"{url}{path}", method="HEAD"), timeout=10) as answer:
                assert answer.status == 200 and answer.read() == b""
