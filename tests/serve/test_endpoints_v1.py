"""The other servers' endpoints (bertkit.serve.compat): /v1/embeddings through the real `openai` client
against a real server, equal to /embed and to sentence-transformers; /rerank against /classify's pair
scores and a sentence-transformers CrossEncoder; /tokenize, /info, per-request truncation, OpenAI's
error shape under /v1/, and the OpenAPI page listing every endpoint."""

from __future__ import annotations

import base64
import shutil
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import openai
import pytest
import torch
import transformers
from fastapi.testclient import TestClient
from sentence_transformers import CrossEncoder

from bertkit.model import BertForSequenceClassification
from bertkit.serve.app import create_app
from bertkit.serve.predictor import load_predictor
from bertkit.settings import Limits, ServerSettings

from .conftest import MAX_SEQ_LENGTH, LiveServer, tokenizer

TEXTS = ["the cat sat on the mat.", "John Smith lives in London, in a big red house!", "paris", "?",
         "where did the dog go? the dog ran in the park and the cat sat under the house"]
QUERY = "where did the dog go?"
LONG = "the cat sat on the mat " * 6  # 36 tokens

EVERY_MODEL = ("/embed", "/embed_all", "/similarity", "/v1/embeddings", "/embeddings", "/tokenize", "/decode", "/info",
               "/metrics", "/ready", "/health", "/ping", "/", "/invocations", "/docs")
"""What every model serves beside its task endpoints (the 404 body and /info list them)."""


def _client(directory, **settings) -> TestClient:
    return TestClient(create_app(load_predictor(directory), ServerSettings(**settings)), raise_server_exceptions=False)


def _clean(response, status: int, code: str) -> dict:
    """A JSON error of the server's shape (TEI's {error, error_type} with bertkit's code), no path or traceback."""
    assert response.status_code == status, response.text
    assert "Traceback" not in response.text and "/tmp" not in response.text and ".py" not in response.text
    body = response.json()
    assert body["code"] == code and isinstance(body["error"], str) and body["error_type"], body
    return body


# --- /v1/embeddings with the openai client ---------------------------------------------------------------

def test_openai_client_gets_the_vectors_of_embed_and_of_sentence_transformers(sentence_dir):
    directory, model = sentence_dir
    expected = model.encode(TEXTS)
    lengths = [len(ids) for ids in transformers.BertTokenizerFast(str(directory / "vocab.txt"), do_lower_case=True)(
        TEXTS, truncation=True, max_length=MAX_SEQ_LENGTH)["input_ids"]]
    with LiveServer(create_app(load_predictor(directory))) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        default = client.embeddings.create(model="my-model", input=TEXTS)  # the client asks for base64 and decodes it
        as_float = client.embeddings.create(model="my-model", input=TEXTS, encoding_format="float")
        as_base64 = client.embeddings.create(model="my-model", input=TEXTS, encoding_format="base64")
        one = client.embeddings.create(model="my-model", input=TEXTS[1])
        cut = client.embeddings.create(model="my-model", input=TEXTS, dimensions=8, encoding_format="float")
        embed = httpx.post(f"{url}/embed", json={"inputs": TEXTS}).json()
    floats = np.array([d.embedding for d in as_float.data], dtype=np.float32)
    np.testing.assert_allclose(floats, expected, atol=1e-5)
    np.testing.assert_array_equal(floats, np.array(embed, dtype=np.float32))
    np.testing.assert_array_equal(np.array([d.embedding for d in default.data], dtype=np.float32), floats)
    decoded = [np.frombuffer(base64.b64decode(d.embedding), dtype="<f4") for d in as_base64.data]
    np.testing.assert_array_equal(np.stack(decoded), floats)
    np.testing.assert_array_equal(np.array(one.data[0].embedding, dtype=np.float32), floats[1])
    assert [d.index for d in as_float.data] == list(range(len(TEXTS))) and as_float.object == "list"
    assert as_float.model == "my-model" and as_float.data[0].object == "embedding"
    assert as_float.usage.prompt_tokens == as_float.usage.total_tokens == sum(lengths)
    shortened = expected[:, :8] / np.linalg.norm(expected[:, :8], axis=1, keepdims=True)  # OpenAI: unit length again
    np.testing.assert_allclose([d.embedding for d in cut.data], shortened, atol=1e-5)


def test_openai_client_errors_carry_code_param_and_message(sentence_dir):
    directory, _ = sentence_dir
    with LiveServer(create_app(load_predictor(directory), ServerSettings(api_key="s3cret"))) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="s3cret", max_retries=0)
        with pytest.raises(openai.UnprocessableEntityError) as error:
            client.embeddings.create(model="m", input=["the cat"], dimensions=33)
        assert (error.value.code, error.value.param, error.value.type) == ("invalid_dimensions", "dimensions",
                                                                           "invalid_request_error")
        assert "send at most 32" in error.value.message
        with pytest.raises(openai.UnprocessableEntityError) as error:  # tiktoken's ids, as LangChain sends them
            client.embeddings.create(model="m", input=[[5, 6, 70000]])
        assert error.value.code == "invalid_token_id" and error.value.param == "input"
        assert "'input[0]' holds token id 70000" in error.value.message  # the list of lists: its index
        assert "check_embedding_ctx_length=False" in error.value.message
        with pytest.raises(openai.BadRequestError) as error:
            client.embeddings.create(model="m", input="")
        assert error.value.code == "empty"
        with pytest.raises(openai.APIStatusError) as error:
            client.embeddings.create(model="m", input=["the cat", LONG], extra_body={"truncate": False})
        assert error.value.status_code == 422 and error.value.code == "too_many_tokens"
        assert "'input[1]' has 38" in error.value.message and "at most 8 tokens" in error.value.message
        client.embeddings.create(model="m", input=["the cat"], extra_body={"colour": "red"})  # ignored, as TEI does
        with pytest.raises(openai.UnprocessableEntityError) as error:
            client.embeddings.create(model="m", input=["the cat"], extra_body={"truncate": "no"})
        assert error.value.code == "invalid_request" and error.value.param == "truncate"
        with pytest.raises(openai.AuthenticationError) as error:
            openai.OpenAI(base_url=f"{url}/v1", api_key="wrong", max_retries=0).embeddings.create(model="m", input="a")
        assert error.value.code == "unauthorized"
        with pytest.raises(openai.NotFoundError):
            client.models.list()


def test_v1_errors_take_openai_shape_and_other_paths_keep_the_servers(mlm_dir):
    with _client(mlm_dir, limits=Limits(max_inputs=2)) as client:
        response = client.post("/v1/embeddings", json={"input": ["a", "b", "c"], "model": "m"})
        assert response.status_code == 422
        assert response.json() == {"error": {"message": "batch size 3 > maximum allowed batch size 2: 'input' has 3 "
                                             "inputs (split the request)", "type": "invalid_request_error",
                                             "param": None, "code": "too_many_inputs"}}
        error = client.post("/v1/embeddings", json={"input": 5}).json()["error"]
        assert error["code"] == "invalid_request" and error["param"] == "input"
        assert client.post("/v1/embeddings", content=b"{no", headers={"Content-Type": "application/json"}
                           ).json()["error"]["code"] == "invalid_json"
        assert client.post("/v1/chat/completions", json={}).json()["error"]["code"] == "not_found"
        _clean(client.post("/embed", json={"inputs": ["a", "b", "c"]}), 422, "too_many_inputs")


# --- /rerank -----------------------------------------------------------------------------------------------

def test_rerank_scores_are_classify_pair_probabilities_sorted(pair_dir):
    texts = ["the dog ran in the park", "paris is the capital of france", "the cat sat", "where did the dog go?"]
    with _client(pair_dir) as client:
        classified = client.post("/classify", json={"inputs": [QUERY] * len(texts), "text_pairs": texts}).json()
        ranked = client.post("/rerank", json={"query": QUERY, "texts": texts, "return_text": True}).json()
        top = client.post("/rerank", json={"query": QUERY, "texts": texts, "top_n": 2}).json()
        raw = client.post("/rerank", json={"query": QUERY, "texts": texts[:1], "raw_scores": True}).json()
    expected = [r["probabilities"]["same"] for r in classified["results"]]
    order = sorted(range(len(texts)), key=lambda i: -expected[i])
    assert [r["index"] for r in ranked] == order
    assert [r["score"] for r in ranked] == pytest.approx([expected[i] for i in order], rel=1e-5)
    assert [r["text"] for r in ranked] == [texts[i] for i in order]
    assert top == [{"index": r["index"], "score": r["score"]} for r in ranked[:2]]
    model = BertForSequenceClassification.from_pretrained(pair_dir).eval()
    encoding = tokenizer().encode(QUERY, texts[0], max_length=16)
    with torch.no_grad():
        logits = model(torch.tensor([encoding.input_ids]), torch.tensor([encoding.token_type_ids])).logits[0]
    assert raw[0]["score"] == pytest.approx(logits[1].item(), rel=1e-5)


def test_rerank_of_a_regression_model_is_its_score_and_a_three_label_model_has_none(regression_dir, classifier_dir):
    texts = ["the dog ran", "paris is big", "the cat sat on the mat"]
    with _client(regression_dir) as client:
        scores = [r["score"] for r in client.post("/classify", json={"inputs": [QUERY] * 3, "text_pairs": texts}
                                                  ).json()["results"]]
        ranked = client.post("/rerank", json={"query": QUERY, "texts": texts}).json()
        assert sorted(r["score"] for r in ranked) == pytest.approx(sorted(scores), rel=1e-5)
        assert "/rerank" in client.get("/openapi.json").json()["paths"]
    with _client(classifier_dir) as client:  # negative, positive, neutral: no relevance score among them
        body = _clean(client.post("/rerank", json={"query": QUERY, "texts": texts}), 404, "not_found")
        assert body["endpoints"] == ["/classify", "/embed", "/predict", *EVERY_MODEL[1:]]
        assert "/rerank needs a classifier with one output or two labels (this one has 3 labels" in body["error"]


def test_rerank_equals_a_sentence_transformers_cross_encoder(bert_dir, tmp_path):
    """A CrossEncoder directory (one output, sigmoid activation, its max_length) is served as sentence-transformers
    ranks with it. max_length 9 leaves 6 tokens for a pair: where both texts must be cut, Google's rule and
    transformers' longest_first then keep 3 + 3 alike (with an odd room they give the extra token to different
    sides)."""
    model = CrossEncoder(str(bert_dir), num_labels=1, max_length=9, device="cpu")
    model.save(str(tmp_path / "ce"))
    shutil.copy(bert_dir / "vocab.txt", tmp_path / "ce" / "vocab.txt")
    expected = model.rank(QUERY, TEXTS)
    with _client(tmp_path / "ce") as client:
        ranked = client.post("/rerank", json={"query": QUERY, "texts": TEXTS}).json()
        assert client.post("/", json={"query": QUERY, "texts": TEXTS}).json() == ranked  # TEI's root, by the body
        info = client.get("/info").json()
    assert [r["index"] for r in ranked] == [e["corpus_id"] for e in expected]
    assert [r["score"] for r in ranked] == pytest.approx([float(e["score"]) for e in expected], abs=1e-5)
    assert info["max_input_length"] == 9 and info["labels"] is None


# --- /tokenize, /info, OpenAPI --------------------------------------------------------------------------

def test_tokenize_gives_ids_offsets_and_specials(mlm_dir):
    text = "John Smith's house"
    with _client(mlm_dir) as client:
        [tokens] = client.post("/tokenize", json={"inputs": text}).json()
        [bare] = client.post("/tokenize", json={"inputs": [text], "add_special_tokens": False}).json()
        [long] = client.post("/tokenize", json={"inputs": LONG * 20}).json()
    encoding = tokenizer().encode(text)
    assert [t["id"] for t in tokens] == encoding.input_ids
    assert tokens[0] == {"id": 2, "text": "[CLS]", "start": None, "stop": None, "char_start": None, "char_stop": None,
                         "special": True}
    assert tokens[-1]["text"] == "[SEP]" and tokens[-1]["special"]
    assert bare == tokens[1:-1] and not any(t["special"] for t in bare)
    assert all(text[t["char_start"]:t["char_stop"]] == t["text"] for t in bare)
    assert all(text.encode()[t["start"]:t["stop"]].decode() == t["text"] for t in bare)  # ASCII: bytes = characters
    assert [t["text"] for t in bare] == ["John", "Smith", "'", "s", "house"]
    assert len(long) == 722  # never truncated: a client counts tokens against /info's max_input_length


def test_info_describes_the_model_and_the_limits(classifier_dir, sentence_dir):
    with _client(classifier_dir, max_batch_size=7, limits=Limits(max_inputs=5)) as client:
        info = client.get("/info").json()
    assert info["task"] == "classification" and info["architecture"] == "BertForSequenceClassification"
    assert info["model_type"] == {"classifier": {"id2label": {"0": "negative", "1": "positive", "2": "neutral"},
                                                 "label2id": {"negative": 0, "positive": 1, "neutral": 2}}}
    assert info["max_client_batch_size"] == 5 and info["max_batch_requests"] == 7 and info["auto_truncate"] is True
    assert info["model_dtype"] == "float32" and info["served_model_name"] == info["model_id"]
    assert info["labels"] == ["negative", "positive", "neutral"] and info["max_input_length"] == 16
    assert info["precision"] == "fp32" and info["truncate_default"] is True
    assert info["limits"]["max_batch_size"] == 7 and info["limits"]["max_client_batch_size"] == 5
    assert info["endpoints"] == ["/classify", "/embed", "/predict", *EVERY_MODEL[1:]]
    assert info["model_id"] == classifier_dir.name and "/" not in info["model_id"]
    directory, _ = sentence_dir
    with _client(directory) as client:
        info = client.get("/info").json()
        [vector] = client.post("/embed", json={"inputs": "the cat"}).json()
    assert info["embedding"] == {"dimension": len(vector), "pooling": ["mean"], "normalize": True, "prompt": False}
    assert info["max_input_length"] == MAX_SEQ_LENGTH and info["task"] == "embed"
    assert info["model_type"] == {"embedding": {"pooling": "mean"}}


def test_openapi_lists_every_endpoint(pair_dir):
    with _client(pair_dir) as client:
        paths = client.get("/openapi.json").json()["paths"]
    assert {"/v1/embeddings", "/rerank", "/tokenize", "/info", "/classify", "/embed"} <= set(paths)
    assert "post" in paths["/v1/embeddings"] and "get" in paths["/info"]


def test_info_and_tokenize_need_the_api_key(mlm_dir):
    with _client(mlm_dir, api_key="s3cret") as client:
        _clean(client.get("/info"), 401, "unauthorized")
        _clean(client.post("/tokenize", json={"inputs": "a"}), 401, "unauthorized")
        assert client.get("/info", headers={"X-API-Key": "s3cret"}).status_code == 200


# --- truncation ---------------------------------------------------------------------------------------------

def test_truncate_false_answers_422_with_the_token_count(classifier_dir, pair_dir):
    with _client(classifier_dir) as client:
        body = _clean(client.post("/embed", json={"inputs": ["the cat", LONG], "truncate": False}), 422,
                      "too_many_tokens")
        assert body["error"] == ("`inputs` must have at most 16 tokens: 'inputs[1]' has 38; shorten it, or send "
                                 "\"truncate\": true to cut it")  # TEI 1.9's words, and 422 as TEI 1.9
        body = _clean(client.post("/classify", json={"inputs": ["a", "the cat"], "text_pairs": ["b", LONG],
                                                     "truncate": False}), 422, "too_many_tokens")
        assert "'inputs[1]' with text_pairs[1] has 41;" in body["error"]
        assert client.post("/classify", json={"inputs": [LONG], "truncate": True}).json()["results"][0]["truncated"]
        assert client.post("/embed", json={"inputs": ["the cat"], "truncate": False}).status_code == 200
    with _client(pair_dir) as client:
        body = _clean(client.post("/rerank", json={"query": "a", "texts": ["b", LONG], "truncate": False}), 422,
                      "too_many_tokens")
        assert "'texts[1]' with the query has 40;" in body["error"]


def test_one_request_over_the_length_does_not_fail_its_neighbours(mlm_dir):
    """Requests batched together: the one with "truncate": false and a long input gets its 422, the others 200."""
    bodies = [{"inputs": ["the cat"], "truncate": False}] * 3 + [{"inputs": [LONG * 20], "truncate": False}]
    with _client(mlm_dir, max_wait_ms=200) as client, ThreadPoolExecutor(len(bodies)) as pool:
        codes = list(pool.map(lambda body: client.post("/embed", json=body).status_code, bodies))
    assert codes == [200, 200, 200, 422]


def test_left_truncation_keeps_the_end_of_each_text(classifier_dir):
    predictor = load_predictor(classifier_dir)  # max_seq_length 16
    ids = tokenizer().encode_ids([LONG, "the dog ran in the park"])
    [single], _ = predictor.encode([LONG], truncation_direction="left")
    assert single["input_ids"] == [2, *ids[0][-14:], 3]
    [pair], lost = predictor.encode([LONG], ["the dog ran in the park"], truncation_direction="left")
    right = tokenizer().encode(LONG, "the dog ran in the park", max_length=16)
    kept_a = right.token_type_ids.count(0) - 2  # Google's rule decides the lengths, the direction which tokens
    assert pair["input_ids"] == [2, *ids[0][-kept_a:], 3, *ids[1][-(13 - kept_a):], 3]
    assert pair["token_type_ids"] == right.token_type_ids and lost == [36 + 6 - 13]
    with _client(classifier_dir) as client:
        raw = {"normalize": False}
        left = client.post("/embed", json={"inputs": [LONG], "truncation_direction": "left", **raw}).json()
        tei = client.post("/embed", json={"inputs": [LONG], "truncation_direction": "Left", **raw}).json()
        right_vectors = client.post("/embed", json={"inputs": [LONG], **raw}).json()
        _clean(client.post("/embed", json={"inputs": [LONG], "truncation_direction": "middle"}), 422,
               "invalid_request")
    np.testing.assert_allclose(left, predictor.embed([LONG], truncation_direction="left"), atol=1e-6)
    assert left == tei and not np.allclose(left, right_vectors)
