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


@pytest.mark.parametrize(("body", "why"), [
    (b'{"inputs": ' + b"9" * 5000 + b"}", "a number in it has too many digits"),
    (b"[" * 100_000 + b"]" * 100_000, "it is nested too deeply"),
    (gzip.compress(b'{"inputs": "the cat"}'), "its bytes are not UTF-8 text"),
    ('{"inputs": "café"}'.encode("latin-1"), "its bytes are not UTF-8 text"),
    ('{"inputs": "café"}'.encode("utf-16"), "UTF-16 or UTF-32"),  # valid JSON to Python's parser: not to TEI's
    ('{"inputs": "café"}'.encode("utf-32"), "UTF-16 or UTF-32"),
    ('{"inputs": "café"}'.encode("utf-16-le"), "UTF-16 or UTF-32")])
def test_a_body_that_is_not_json_for_any_reason_is_invalid_json_said_in_the_clients_terms(client, body, why):
    answer = client.post("/embed", content=body, headers={"Content-Type": "application/json"})
    assert answer.status_code == 400 and answer.json()["code"] == "invalid_json", answer.text
    message = answer.json()["error"]
    assert why in message and "sys." not in message and "Error" not in message  # not Python's internals


def test_a_utf8_body_with_a_byte_order_mark_is_read(client):
    answer = client.post("/embed", content=b"\xef\xbb\xbf" + '{"inputs": "café"}'.encode(),
                         headers={"Content-Type": "application/json"})
    assert answer.status_code == 200


def test_head_over_a_real_connection(bert_dir):
    import urllib.request

    from .conftest import LiveServer

    with LiveServer(create_app(load_predictor(bert_dir))) as url:
        for path in ("/health", "/ready", "/metrics"):
            with urllib.request.urlopen(urllib.request.Request(f"{url}{path}", method="HEAD"), timeout=10) as answer:
                assert answer.status == 200 and answer.read() == b""


def test_a_schema_error_names_its_field_in_the_message_tei_clients_show(client):
    answer = client.post("/embed", json={"inputs": None})
    assert answer.status_code == 422 and answer.json()["code"] == "invalid_request"
    assert answer.json()["error"] == ("the request does not match the schema (see /docs); inputs: Input should be a "
                                      "valid string / Input should be a valid list")  # the field, not inputs.str


def test_a_trailing_slash_is_a_404_listing_the_routes_not_a_redirect_to_the_host_sent(client):
    answer = client.post("/embed/", json={"inputs": "the cat"}, headers={"Host": "elsewhere"}, follow_redirects=False)
    assert answer.status_code == 404 and answer.json()["code"] == "not_found" and "/embed" in answer.json()["error"]
    assert "location" not in answer.headers


def test_decode_of_no_ids_names_the_field(client):
    answer = client.post("/decode", json={"ids": []})
    assert answer.status_code == 400 and answer.json()["error"] == "`ids` cannot be empty; send some token ids"


def test_without_the_api_key_a_bad_body_is_401_not_a_parse_error(bert_dir):
    from bertkit.settings import ServerSettings

    with TestClient(create_app(load_predictor(bert_dir), ServerSettings(api_key="s3cret"))) as keyed:
        for body in (b"garbage", b"[" * 100_000, b'{"inputs": null}'):
            answer = keyed.post("/embed", content=body, headers={"Content-Type": "application/json"})
            assert answer.status_code == 401 and answer.json()["code"] == "unauthorized", body[:10]
            assert answer.headers["www-authenticate"] == "Bearer"
        wrong = keyed.post("/v1/embeddings", content=b"garbage",
                           headers={"Content-Type": "application/json", "Authorization": "Bearer nope"})
        assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "unauthorized"
        for key in ({"X-API-Key": "s3cret"}, {"Authorization": "Bearer s3cret"}):
            answer = keyed.post("/embed", content=b"garbage", headers={"Content-Type": "application/json", **key})
            assert answer.status_code == 400 and answer.json()["code"] == "invalid_json"


@pytest.mark.parametrize("headers", [{"Content-Type": "application/json"}, {}])
def test_an_empty_body_is_said_to_be_empty_not_a_missing_field(client, headers):
    answer = client.post("/embed", content=b"", headers=headers)
    assert answer.status_code == 400 and answer.json()["code"] == "invalid_json", answer.text
    assert answer.json()["error"].startswith("the body is empty; send a JSON object")


def test_an_empty_body_without_the_key_is_refused_for_the_key_first(bert_dir):
    from bertkit.settings import ServerSettings

    with TestClient(create_app(load_predictor(bert_dir), ServerSettings(api_key="k")),
                    raise_server_exceptions=False) as keyed:
        assert keyed.post("/embed", content=b"").status_code == 401
        assert keyed.post("/embed", content=b"", headers={"X-API-Key": "k"}).json()["code"] == "invalid_json"


def test_an_id_out_of_range_in_a_list_of_id_lists_is_named_with_its_index(client):
    answer = client.post("/v1/embeddings", json={"input": [[5, 6, 70000]], "model": "m"})
    assert answer.status_code == 422 and answer.json()["error"]["param"] == "input", answer.text
    assert answer.json()["error"]["message"].startswith("'input[0]' holds token id 70000 at position 2")
    one = client.post("/v1/embeddings", json={"input": [5, 6, 70000], "model": "m"})  # one list of ids: no index
    assert one.json()["error"]["message"].startswith("'input' holds token id 70000 at position 2")
