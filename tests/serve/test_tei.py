"""text-embeddings-inference's contract (bertkit.serve.tei, compat, observability), driven by the clients a TEI
user already runs: huggingface_hub's InferenceClient at the server's root, the openai client and LangChain's
OpenAIEmbeddings with token ids, plain HTTP in TEI 1.9's shapes for every route and every error class, and
prometheus_client's parser over the te_* metrics."""

from __future__ import annotations

import json
import logging

import httpx
import numpy as np
import openai
import pytest
from fastapi.testclient import TestClient
from huggingface_hub import InferenceClient
from prometheus_client.parser import text_string_to_metric_families

from bertkit.serve.app import build_server, create_app
from bertkit.serve.predictor import load_predictor
from bertkit.settings import Limits, ServerSettings, ServeSettings

from .conftest import LiveServer

TEXTS = ["the cat sat on the mat", "john smith lives in london", "where did the dog go?"]


def _client(directory, **settings) -> TestClient:
    return TestClient(create_app(load_predictor(directory), ServerSettings(**settings)), raise_server_exceptions=False)


def _tei_error(response, status: int, error_type: str) -> dict:
    """TEI's error body: {"error": message, "error_type": class}, the status TEI gives that class."""
    assert response.status_code == status, response.text
    body = response.json()
    assert body["error_type"] == error_type and isinstance(body["error"], str) and body["error"], body
    return body


# --- the real clients -------------------------------------------------------------------------------------------

def test_inference_client_at_the_root_of_an_embedding_model(sentence_dir):
    directory, model = sentence_dir
    with LiveServer(create_app(load_predictor(directory))) as url:
        client = InferenceClient(model=url)
        vectors = client.feature_extraction(TEXTS[0])
        similarities = client.sentence_similarity(TEXTS[0], other_sentences=TEXTS[1:])
    np.testing.assert_allclose(np.asarray(vectors).reshape(-1), model.encode(TEXTS[0]), atol=1e-5)
    expected = model.similarity(model.encode(TEXTS[:1]), model.encode(TEXTS[1:]))[0].tolist()
    assert similarities == pytest.approx(expected, abs=1e-5)


def test_inference_client_text_classification_at_the_root(classifier_dir):
    predictor = load_predictor(classifier_dir)
    [expected] = predictor.classify([TEXTS[0]])
    with LiveServer(create_app(predictor)) as url:
        best = InferenceClient(model=url).text_classification(TEXTS[0])
    # huggingface_hub 2.4 reads the first of TEI's best-first predictions (a TEI server gives it the same)
    label, score = max(expected["probabilities"].items(), key=lambda item: item[1])
    assert (best.label, best.score) == (label, pytest.approx(score, abs=1e-6))


def test_openai_client_and_langchain_send_token_ids(sentence_dir):
    """Token-id inputs of this model's vocabulary (what /tokenize gives) embed as their text; LangChain's
    OpenAIEmbeddings, told not to send tiktoken's ids, gets the same vectors."""
    from langchain_openai import OpenAIEmbeddings

    directory, model = sentence_dir
    with LiveServer(create_app(load_predictor(directory))) as url:
        ids = [[t["id"] for t in tokens] for tokens in
               httpx.post(f"{url}/tokenize", json={"inputs": TEXTS, "add_special_tokens": False}).json()]
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        from_ids = client.embeddings.create(model="m", input=ids, encoding_format="float")
        one = client.embeddings.create(model="m", input=ids[0], encoding_format="float")
        from_text = client.embeddings.create(model="m", input=TEXTS, encoding_format="float")
        langchain = OpenAIEmbeddings(base_url=f"{url}/v1", api_key="unused", model="m",
                                     check_embedding_ctx_length=False).embed_documents(TEXTS)
        tei_alias = httpx.post(f"{url}/embeddings", json={"input": TEXTS}).json()  # TEI's alias of /v1/embeddings
    vectors = [d.embedding for d in from_text.data]
    assert [d.embedding for d in from_ids.data] == vectors and one.data[0].embedding == vectors[0]
    np.testing.assert_allclose(langchain, model.encode(TEXTS), atol=1e-5)
    assert [d["embedding"] for d in tei_alias["data"]] == vectors


# --- every route in TEI's shapes ---------------------------------------------------------------------------------

def test_embed_answers_teis_shapes_and_defaults(bert_dir):
    """A plain BERT directory: vectors are unit length unless normalize is false (TEI's default), a single
    string gets a list of one vector, token ids and dimensions and truncate null are accepted, unknown fields
    ignored."""
    predictor = load_predictor(bert_dir)
    raw = predictor.embed(TEXTS)
    with _client(bert_dir) as client:
        unit = client.post("/embed", json={"inputs": TEXTS}).json()
        single = client.post("/embed", json={"inputs": TEXTS[0], "truncate": None, "prompt_name": None,
                                             "some_future_field": 1}).json()
        as_is = client.post("/embed", json={"inputs": TEXTS, "normalize": False}).json()
        cut = client.post("/embed", json={"inputs": TEXTS, "dimensions": 4}).json()
        ids = client.post("/tokenize", json={"inputs": TEXTS[1], "add_special_tokens": False}).json()[0]
        from_ids = client.post("/embed", json={"inputs": [[t["id"] for t in ids]]}).json()
        mixed = client.post("/embed", json={"inputs": [TEXTS[0], [t["id"] for t in ids]]}).json()
        bare = client.post("/embed", json={"inputs": TEXTS[0]}, headers={"Content-Type": "application/json"})
    with TestClient(create_app(predictor, ServerSettings(normalize=False))) as client:
        default_off = client.post("/embed", json={"inputs": TEXTS}).json()
    np.testing.assert_allclose(as_is, raw, atol=1e-6)
    np.testing.assert_allclose(unit, raw / np.linalg.norm(raw, axis=1, keepdims=True), atol=1e-6)
    assert single == unit[:1] and bare.json() == unit[:1] and from_ids == unit[1:2] and mixed == [unit[0], unit[1]]
    np.testing.assert_allclose(np.linalg.norm(cut, axis=1), 1, atol=1e-6)  # cut to 4, then normalised (TEI)
    np.testing.assert_allclose(cut, np.array(as_is)[:, :4] / np.linalg.norm(np.array(as_is)[:, :4], axis=1,
                                                                                keepdims=True), atol=1e-6)
    np.testing.assert_allclose(default_off, raw, atol=1e-6)  # --no-normalize: the directory's own (raw here)


def test_embed_all_similarity_decode_and_the_sagemaker_routes(sentence_dir):
    directory, model = sentence_dir
    predictor = load_predictor(directory)
    with _client(directory) as client:
        [tokens] = client.post("/embed_all", json={"inputs": TEXTS[0]}).json()
        similarity = client.post("/similarity", json={"inputs": {"source_sentence": TEXTS[0], "sentences": TEXTS[1:]},
                                                      "parameters": {"truncate": True}}).json()
        ids = [t["id"] for t in client.post("/tokenize", json={"inputs": TEXTS[1]}).json()[0]]
        decoded = client.post("/decode", json={"ids": ids}).json()
        with_specials = client.post("/decode", json={"ids": [ids, ids[1:2]], "skip_special_tokens": False}).json()
        invocations = client.post("/invocations", json={"inputs": TEXTS}).json()
        root = client.post("/", json={"inputs": TEXTS}).json()
        assert client.get("/").status_code == 200 and client.get("/ping").status_code == 200
        embed = client.post("/embed", json={"inputs": TEXTS}).json()
    features, _ = predictor.encode([TEXTS[0]])
    assert len(tokens) == len(features[0]["input_ids"]) and len(tokens[0]) == 32  # every token, [CLS] and [SEP] too
    expected = model.similarity(model.encode(TEXTS[:1]), model.encode(TEXTS[1:]))[0].tolist()
    assert similarity == pytest.approx(expected, abs=1e-5)
    assert decoded == [TEXTS[1]] and with_specials == [f"[CLS] {TEXTS[1]} [SEP]", "john"]
    assert invocations == root == embed


def test_predict_single_pair_and_batch(classifier_dir):
    predictor = load_predictor(classifier_dir)
    [one] = predictor.classify([TEXTS[0]])
    [pair] = predictor.classify([TEXTS[0]], [TEXTS[1]])
    with _client(classifier_dir) as client:
        single = client.post("/predict", json={"inputs": TEXTS[0]}).json()
        as_pair = client.post("/predict", json={"inputs": [TEXTS[0], TEXTS[1]]}).json()
        batch = client.post("/predict", json={"inputs": [[TEXTS[0]], [TEXTS[0], TEXTS[1]]]}).json()
        root = client.post("/", json={"inputs": TEXTS[0], "parameters": {"top_k": 2}}).json()
        three = client.post("/predict", json={"inputs": TEXTS})
        raw = client.post("/predict", json={"inputs": TEXTS[0], "raw_scores": True})

    def best_first(answer):
        pairs = sorted(answer["probabilities"].items(), key=lambda item: -item[1])
        return [{"score": s, "label": label} for label, s in pairs]

    assert single == best_first(one) == root and as_pair == best_first(pair)
    assert batch == [best_first(one), best_first(pair)]
    _tei_error(three, 422, "Validation")  # three strings: neither a text, a pair nor a batch
    _tei_error(raw, 422, "Validation")


def test_tokenize_gives_teis_byte_offsets_and_character_offsets(mlm_dir):
    text = "é the cat"  # 'é' is two bytes: TEI's 'the' is 3..6, Python's 2..5
    with _client(mlm_dir) as client:
        [tokens] = client.post("/tokenize", json={"inputs": text, "add_special_tokens": False}).json()
    the = next(t for t in tokens if t["text"] == "the")
    assert (the["start"], the["stop"], the["char_start"], the["char_stop"]) == (3, 6, 2, 5)
    assert all(text.encode()[t["start"]:t["stop"]].decode() == t["text"] == text[t["char_start"]:t["char_stop"]]
               for t in tokens)


# --- errors: every class, TEI's status --------------------------------------------------------------------------

def test_every_error_class_has_teis_status_and_shape(bert_dir, classifier_dir):
    with _client(bert_dir, limits=Limits(max_inputs=2, max_input_chars=100)) as client:  # 64 positions
        _tei_error(client.post("/embed", json={"inputs": []}), 400, "Empty")
        _tei_error(client.post("/embed", json={"inputs": ""}), 400, "Empty")
        _tei_error(client.post("/embed", json={"inputs": [[]]}), 400, "Empty")
        _tei_error(client.post("/similarity", json={"inputs": {"source_sentence": "a", "sentences": []}}), 400, "Empty")
        body = _tei_error(client.post("/embed", json={"inputs": ["a", "b", "c"]}), 422, "Validation")
        assert body["error"].startswith("batch size 3 > maximum allowed batch size 2")
        body = _tei_error(client.post("/embed", json={"inputs": "the cat " * 40, "truncate": False}), 422, "Validation")
        assert "limit is 100" in body["error"]
        body = _tei_error(client.post("/embed", json={"inputs": "." * 90, "truncate": False}), 422, "Validation")
        assert body["error"].startswith("`inputs` must have at most")  # TEI 1.9: too many tokens is 422
        _tei_error(client.post("/embed", json={"inputs": [5, 1 << 20]}), 422, "Validation")
        _tei_error(client.post("/embed", json={"inputs": "a", "prompt_name": "query"}), 422, "Validation")
        _tei_error(client.post("/embed", json={"inputs": "a", "truncate": "yes"}), 422, "Validation")
        _tei_error(client.post("/embed", content=b"{", headers={"Content-Type": "application/json"}), 400, "Validation")
        _tei_error(client.post("/rerank", json={"query": "a", "texts": ["b"]}), 404, "Validation")  # not a reranker
        _tei_error(client.post("/predict", json={"inputs": "a"}), 404, "Validation")  # not a classifier
    predictor = load_predictor(classifier_dir)

    def broken(*args, **kwargs):
        raise RuntimeError("a bug")

    predictor.classify = broken  # type: ignore[method-assign]
    with TestClient(create_app(predictor), raise_server_exceptions=False) as client:
        _tei_error(client.post("/predict", json={"inputs": "a"}), 500, "Backend")


def test_a_500k_character_input_is_cut_with_bounded_cost(bert_dir):
    """TEI cuts a text over its character limit before tokenizing when truncating; so does bertkit (at
    --max-input-chars), so a huge input costs what a limit-sized one costs, and equals its cut form."""
    huge = "the cat sat on the mat " * 22_000  # 506k characters, under the 1 MiB body limit
    with _client(bert_dir, limits=Limits(max_input_chars=20_000, max_body_bytes=1 << 20)) as client:
        cut = client.post("/embed", json={"inputs": huge})
        limit_sized = client.post("/embed", json={"inputs": huge[:20_000]})
        left = client.post("/embed", json={"inputs": huge, "truncation_direction": "left"})
        _tei_error(client.post("/embed", json={"inputs": huge, "truncate": False}), 422, "Validation")
    assert cut.status_code == 200 and cut.json() == limit_sized.json()
    assert left.status_code == 200


# --- /info, metrics, headers, logs ------------------------------------------------------------------------------

def test_info_has_teis_keys(pair_dir, regression_dir, sentence_dir):
    with _client(pair_dir, max_batch_tokens=999, limits=Limits(max_inputs=7)) as client:
        info = client.get("/info").json()
    assert info["model_type"] == {"classifier": {"id2label": {"0": "different", "1": "same"},
                                                 "label2id": {"different": 0, "same": 1}}}
    with _client(regression_dir) as client:  # TEI's reranker: a classifier with one output
        assert client.get("/info").json()["model_type"] == {"reranker": {"id2label": {"0": "LABEL_0"},
                                                                         "label2id": {"LABEL_0": 0}}}
    tei_keys = {"model_id", "model_sha", "model_dtype", "served_model_name", "model_type", "max_concurrent_requests",
                "max_input_length", "max_batch_tokens", "max_batch_requests", "max_client_batch_size", "auto_truncate",
                "tokenization_workers", "version", "sha", "docker_label"}
    assert tei_keys <= set(info) and info["max_batch_tokens"] == 999 and info["max_client_batch_size"] == 7
    with _client(sentence_dir[0], auto_truncate=False) as client:
        info = client.get("/info").json()
        refused = client.post("/embed", json={"inputs": "the cat " * 10})
    assert info["model_type"] == {"embedding": {"pooling": "mean"}} and info["auto_truncate"] is False
    _tei_error(refused, 422, "Validation")  # --no-auto-truncate: a long input is refused unless truncate is true


def test_te_metrics_parse_and_headers_and_traceparent(sentence_dir):
    directory, _ = sentence_dir
    trace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    with _client(directory, limits=Limits(max_inputs=2)) as client:
        ok = client.post("/embed", json={"inputs": TEXTS[:2]}, headers={"traceparent": trace})
        client.post("/embed", json={"inputs": TEXTS[0]})
        client.post("/embed", json={"inputs": TEXTS})  # 3 > 2: batch_size
        client.post("/embed", json={"inputs": ""})  # Empty: validation
        info = client.get("/info", headers={"traceparent": "not-a-trace"})
        text = client.get("/metrics").text
    assert ok.headers["x-compute-type"] == "cpu" and int(ok.headers["x-compute-tokens"]) > 2
    assert int(ok.headers["x-compute-characters"]) == len(TEXTS[0]) + len(TEXTS[1])
    for name in ("x-compute-time", "x-total-time", "x-tokenization-time", "x-queue-time", "x-inference-time"):
        assert int(ok.headers[name]) >= 0
    version, trace_id, span, flags = ok.headers["traceparent"].split("-")
    assert (version, trace_id, flags) == ("00", trace.split("-")[1], "01") and span != trace.split("-")[2]
    assert "traceparent" not in info.headers and "x-compute-time" not in info.headers
    families = {f.name: f for f in text_string_to_metric_families(text)}
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families.values() for s in f.samples}
    assert samples[("te_request_count_total", (("method", "batch"),))] == 2  # the parser names counters *_total
    assert samples[("te_request_count_total", (("method", "single"),))] == 2
    assert samples[("te_request_success_total", (("method", "batch"),))] == 1
    assert samples[("te_request_failure_total", (("err", "batch_size"),))] == 1
    assert samples[("te_request_failure_total", (("err", "validation"),))] == 1
    assert "\nte_request_count{method=\"batch\"} 2\n" in text  # written as TEI's exporter writes it
    for name in ("te_request_duration", "te_request_tokenization_duration", "te_request_queue_duration",
                 "te_request_inference_duration"):
        assert samples[(f"{name}_count", ())] == 2, name
    assert samples[("te_request_input_length_count", ())] == 3 and samples[("te_batch_next_size_count", ())] >= 2
    assert families["te_batch_next_tokens"].type == "histogram" and ("te_queue_size", ()) in samples


def test_json_access_log_is_alone_on_stdout(mlm_dir):
    app = create_app(load_predictor(mlm_dir), ServerSettings(json_access_log=True))
    assert build_server(app, ServeSettings(mlm_dir)).config.access_log is False  # uvicorn's plain-text access lines off
    assert build_server(create_app(load_predictor(mlm_dir)), ServeSettings(mlm_dir)).config.access_log is True
    assert logging.getLogger("bertkit.access").propagate is False  # its JSON lines: test_metrics


# --- what a review found ------------------------------------------------------------------------------------

def test_token_ids_are_read_as_they_are(sentence_dir):
    """[UNK] stays [UNK] (TEI decodes and re-encodes; a decode that skipped it would embed another text), ids of
    specials alone embed [CLS] [SEP], and prompt_name with ids is refused."""
    directory, _ = sentence_dir
    with _client(directory) as client:
        [tokens] = client.post("/tokenize", json={"inputs": "zzz the cat"}).json()
        ids = [t["id"] for t in tokens]
        assert tokens[1]["text"] == "zzz" and tokens[1]["id"] == 1  # [UNK]
        from_ids = client.post("/embed", json={"inputs": ids}).json()
        bare = client.post("/embed", json={"inputs": ids[1:-1]}).json()
        assert from_ids == bare == client.post("/embed", json={"inputs": "zzz the cat"}).json()
        assert from_ids != client.post("/embed", json={"inputs": "the cat"}).json()
        assert client.post("/embed", json={"inputs": [2, 3]}).status_code == 200
        _tei_error(client.post("/embed", json={"inputs": [[2, 5], "the cat"], "prompt_name": "query"}), 422,
                   "Validation")


def test_named_prompts_and_tokenize_read_as_the_model_reads(sentence_dir, tmp_path):
    import shutil

    from sentence_transformers import SentenceTransformer

    directory, _ = sentence_dir
    shutil.copytree(directory, tmp_path / "st")
    config = json.loads((tmp_path / "st" / "config_sentence_transformers.json").read_text())
    config["prompts"] = {"query": "where did ", "document": ""}
    (tmp_path / "st" / "config_sentence_transformers.json").write_text(json.dumps(config))
    model = SentenceTransformer(str(tmp_path / "st"), device="cpu")
    with _client(tmp_path / "st") as client:
        queried = client.post("/embed", json={"inputs": ["the cat sat"], "prompt_name": "query"}).json()
        [tokens] = client.post("/tokenize", json={"inputs": "the cat", "prompt_name": "query"}).json()
        _tei_error(client.post("/embed", json={"inputs": "a", "prompt_name": "other"}), 422, "Validation")
    np.testing.assert_allclose(queried, model.encode(["the cat sat"], prompt_name="query"), atol=1e-5)
    assert [t["text"] for t in tokens[1:-1]] == ["where", "did", "the", "cat"]  # offsets into prompt + text


def test_odd_bodies_probes_and_batches_are_answered_as_tei(classifier_dir, regression_dir, sentence_dir):
    deep = b"[" * 100_000 + b"]" * 100_000
    with _client(classifier_dir, limits=Limits(max_body_bytes=1 << 20)) as client:
        _tei_error(client.post("/", content=deep, headers={"Content-Type": "application/json"}), 400, "Validation")
        _tei_error(client.post("/", content=b'{"inputs": "a"}', headers={"Content-Type": "text/plain"}), 415,
                   "Validation")
        body = _tei_error(client.post("/predict", json={"inputs": [["the cat"], ["a dog", "the cat " * 20]],
                                                        "truncate": False}), 422, "Validation")
        assert "'inputs[1]' has" in body["error"]  # the pair's place in the request, not in its group
        for _ in range(3):
            assert client.get("/").status_code == 200  # a health probe, not a TEI request
        client.post("/tokenize", json={"inputs": "the cat"})
        text = client.get("/metrics").text
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(text) for s in f.samples}
    assert samples[("te_request_failure_total", (("err", "tokenization"),))] == 1
    assert sum(v for (name, _), v in samples.items() if name == "te_request_count_total") == 3  # the POSTs only
    assert samples[("te_request_input_length_count", ())] == 2  # /predict's two inputs; /tokenize runs no model
    predictor = load_predictor(regression_dir)
    [value] = predictor.classify(["the cat"])
    with _client(regression_dir) as client:
        [answer] = client.post("/predict", json={"inputs": "the cat"}).json()
        [raw] = client.post("/predict", json={"inputs": "the cat", "raw_scores": True}).json()
    assert answer == raw == {"score": pytest.approx(value["score"], abs=1e-6), "label": "LABEL_0"}
    with _client(sentence_dir[0]) as client:
        same = client.post("/similarity", json={"inputs": {"source_sentence": "the cat",
                                                           "sentences": ["the cat", "the dog"]}}).json()
        upper = client.post("/embed", json={"inputs": "a"},
                            headers={"traceparent": "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01"})
    assert min(same) >= -1.0 and max(same) <= 1.0 and same[0] == pytest.approx(1.0, abs=1e-6)
    assert "traceparent" not in upper.headers  # uppercase hex is not a valid traceparent
