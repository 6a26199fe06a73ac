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


def test_tokenize_is_capped_in_tokens_before_its_table_is_built(bert_dir, monkeypatch):
    """/tokenize of 50 texts of 20,000 punctuation marks answered 98 MB of JSON from a 1 MB body, built on the
    event loop: at most --max-tokenize-tokens tokens a request (specials included), counted before the table."""
    from bertkit.serve import compat

    predictor = load_predictor(bert_dir)
    built, threads = [], []
    real_table, real_json = predictor.tokenize, compat.json_bytes
    predictor.tokenize = lambda *a, **k: built.append(1) or real_table(*a, **k)  # type: ignore[method-assign]
    monkeypatch.setattr(compat, "json_bytes",
                        lambda value: threads.append(threading.current_thread()) or real_json(value))
    settings = ServerSettings(limits=Limits(max_tokenize_tokens=20))
    with TestClient(create_app(predictor, settings)) as client:
        loop_thread = client.portal.call(threading.current_thread)
        built.clear()
        refused = client.post("/tokenize", json={"inputs": ["!" * 19]})  # 19 pieces + [CLS] [SEP]
        assert refused.status_code == 422 and refused.json()["code"] == "too_many_tokens_listed"
        assert "hold 21 tokens" in refused.json()["error"] and "--max-tokenize-tokens" in refused.json()["error"]
        assert built == []
        fits = client.post("/tokenize", json={"inputs": ["!" * 19], "add_special_tokens": False})  # 19 pieces
        assert fits.status_code == 200 and len(fits.json()[0]) == 19
        assert fits.json() == real_table(["!" * 19], add_special_tokens=False)
        many_chars = client.post("/tokenize", json={"inputs": "the cat sat on the mat"})  # 22 chars, 8 tokens
        assert many_chars.status_code == 200 and len(many_chars.json()[0]) == 8
    assert threads and all(thread is not loop_thread for thread in threads)


def test_a_too_long_text_is_told_the_fix_its_route_has(bert_dir):
    """`"truncate": true` is offered only where the request has that field (/tokenize, /tag, /answer have not)."""
    with TestClient(create_app(load_predictor(bert_dir))) as client:
        long = "a" * 20_001
        tokenize = client.post("/tokenize", json={"inputs": long, "truncate": True})
        assert tokenize.status_code == 422 and tokenize.json()["code"] == "input_too_long"
        assert "(shorten or split it)" in tokenize.json()["error"] and "truncate" not in tokenize.json()["error"]
        embed = client.post("/embed", json={"inputs": long, "truncate": False})
        assert embed.status_code == 422 and 'or send "truncate": true' in embed.json()["error"]


def test_tokenize_counts_tokens_not_characters(bert_dir, tmp_path):
    """An uncased vocabulary splits each Hangul syllable into 2-3 letters, each a piece: more tokens than
    characters, so a cap checked by characters let such a request past it."""
    from bertkit.tokenizer import WordPieceTokenizer

    pieces = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "ᄒ", "##ᄒ", "##ᅡ", "##ᆫ"]
    WordPieceTokenizer(pieces).save_pretrained(tmp_path)
    hangul = WordPieceTokenizer.from_pretrained(tmp_path)
    assert len(hangul.encode_ids(["한" * 5])[0]) == 15  # the premise: 3 pieces a character
    predictor = load_predictor(bert_dir)
    with TestClient(create_app(predictor, ServerSettings(limits=Limits(max_tokenize_tokens=10)))) as client:
        predictor.tokenizer = hangul  # (after the warm-up: /tokenize runs no model)
        refused = client.post("/tokenize", json={"inputs": "한" * 5, "add_special_tokens": False})
        assert refused.status_code == 422 and "hold 15 tokens" in refused.json()["error"]
        answer = client.post("/tokenize", json={"inputs": "한" * 3, "add_special_tokens": False})
        assert answer.status_code == 200 and len(answer.json()[0]) == 9
        assert {token["text"] for token in answer.json()[0]} == {"한"}  # each piece's slice of the text
        assert "\\u" not in answer.text  # UTF-8 on the wire, as FastAPI sent it, not \\u escapes
