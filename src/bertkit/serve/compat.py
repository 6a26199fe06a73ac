"""The endpoints other servers made conventional: OpenAI's `POST /v1/embeddings`, and Text Embeddings
Inference's (TEI) `POST /rerank`, `POST /tokenize` and `GET /info`; the request fields every text
endpoint shares (`truncate`, `truncation_direction`); OpenAI's error shape.

Design decision: these are other servers' request and response layouts over bertkit's own inference,
not new inference. /v1/embeddings runs what /embed runs with the directory's own pooling, /rerank the
pair scoring /classify does, /tokenize the tokenizer every predictor uses; all go through the same
limits and micro-batcher. So the `openai` client, gateways that speak OpenAI, and TEI clients work
unchanged, and the numbers equal bertkit's other endpoints. Status codes stay the server's own
(app.py); under /v1/ the error body takes OpenAI's shape, which the `openai` client reads into its
exception's message, type, code and param.

References: OpenAI API reference, "Embeddings" (dimensions, encoding_format) and "Error codes";
huggingface/text-embeddings-inference, router/src/http/types.rs (rerank, tokenize, info, truncate,
truncation_direction; 413 for an input over the maximum length).
"""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Literal, cast

import numpy as np
from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict, Field

import bertkit
from bertkit.serve.limits import RequestError, check_text, check_texts
from bertkit.serve.predictor import Predictor
from bertkit.settings import ServerSettings

OPENAI_PREFIX = "/v1/"
ALWAYS_SERVED = ("/v1/embeddings", "/tokenize", "/info", "/metrics", "/ready", "/health")
"""Endpoints of every model, beside its task endpoints (predictor.endpoints)."""

Submit = Callable[..., Awaitable[list[Any]]]
"""The app's `submit(key, items, field, paired)`: the items' results from the micro-batcher (app.py)."""


class FieldError(RequestError):
    """A refused request that names the request field at fault (OpenAI's `param`)."""

    def __init__(self, status: int, error: str, message: str, param: str) -> None:
        super().__init__(status, error, message)
        self.param = param


def openai_error(status: int, code: str, message: str, param: str | None = None) -> dict[str, Any]:
    """OpenAI's error body, {"error": {message, type, param, code}}: the `openai` client raises it as the
    APIStatusError subclass of the status, with these four fields as attributes."""
    kind = "server_error" if status >= 500 else "invalid_request_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


# --- request bodies ----------------------------------------------------------------------------------

class StrictBody(BaseModel):
    """Every request body: a JSON object of exactly the documented fields and types."""

    model_config = ConfigDict(extra="forbid", strict=True)


class Truncation(StrictBody):
    truncate: bool = Field(True, description="Cut an input longer than the model's maximum length to fit (true), "
                           "or refuse it with 413 and its token count (false).")
    truncation_direction: Literal["right", "left", "Right", "Left"] = Field(
        "right", description="Which end is cut: right keeps the start of each text, left its end "
        "(TEI's spellings Right and Left are accepted).")

    @property
    def direction(self) -> str:
        return self.truncation_direction.lower()


class EmbeddingsRequest(Truncation):
    input: str | list[str] | list[int] | list[list[int]] = Field(
        description="A text or a list of texts (token-id arrays are refused: this server reads text).")
    model: str | None = Field(None, description="Any name; echoed in the answer (this server has one model).")
    dimensions: int | None = Field(None, ge=1, description="Keep the first N values of each vector (normalised "
                                   "again when the model's vectors are unit length).")
    encoding_format: Literal["float", "base64"] = Field("float", description="base64: little-endian float32 "
                                                        "bytes, as the openai client decodes them.")
    user: str | None = Field(None, description="Accepted and ignored.")


class RerankRequest(Truncation):
    query: str
    texts: list[str] = Field(description="Texts to score against the query, each as the pair (query, text).")
    top_n: int | None = Field(None, ge=1, description="Answer only the N best; default all.")
    return_text: bool = Field(False, description="Include each text in its result.")
    raw_scores: bool = Field(False, description="The model's raw output (a logit) instead of a probability.")


class TokenizeRequest(StrictBody):
    inputs: str | list[str]
    add_special_tokens: bool = Field(True, description="Include [CLS] and [SEP].")


# --- routes --------------------------------------------------------------------------------------------

def add_routes(app: FastAPI, predictor: Predictor, settings: ServerSettings, submit: Submit,
               dependencies: list[Any]) -> None:
    """/v1/embeddings, /tokenize and /info for every model; /rerank for a model that scores pairs."""
    limits = settings.limits

    @app.post("/v1/embeddings", dependencies=dependencies, summary="Sentence vectors in OpenAI's format "
              "(the directory's pooling and normalisation, as /embed with its defaults).")
    async def embeddings(body: EmbeddingsRequest) -> dict[str, Any]:
        texts = _texts(body.input)
        check_texts(texts, "input", limits)
        _, normalize, width = predictor.embedding_spec()
        if body.dimensions is not None and body.dimensions > width:
            raise FieldError(422, "invalid_dimensions", f"'dimensions' is {body.dimensions} but this model's vectors "
                             f"have {width} values; send at most {width}", "dimensions")
        results = await submit(("embeddings", body.truncate, body.direction), texts, "input")
        data = [{"object": "embedding", "index": i,
                 "embedding": _vector(vector, body.dimensions, normalize, body.encoding_format)}
                for i, (vector, _) in enumerate(results)]
        tokens = sum(count for _, count in results)
        return {"object": "list", "data": data, "model": body.model or predictor.model_id,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}

    if "rerank" in predictor.endpoints:
        @app.post("/rerank", dependencies=dependencies, summary="Texts scored against a query by the pair "
                  "classifier, best first (TEI's shape).")
        async def rerank(body: RerankRequest) -> list[dict[str, Any]]:
            check_text(body.query, "query", limits)
            check_texts(body.texts, "texts", limits)
            scores = await submit(("rerank", body.truncate, body.direction, body.raw_scores),
                                  [(body.query, text) for text in body.texts], "texts", " with the query")
            return ranked(scores, body.texts if body.return_text else None, body.top_n)

    @app.post("/tokenize", dependencies=dependencies, summary="Tokens as the model reads them, never truncated "
              "(TEI's shape: one list per input).")
    async def tokenize(body: TokenizeRequest) -> list[list[dict[str, Any]]]:
        texts = [body.inputs] if isinstance(body.inputs, str) else body.inputs
        check_texts(texts, "inputs", limits)
        return await submit(("tokenize", body.add_special_tokens), texts, "inputs")

    @app.get("/info", dependencies=dependencies, summary="The model, its maximum input length, labels and "
             "precision, and the server's limits.")
    async def info() -> dict[str, Any]:
        return server_info(predictor, settings)


def _texts(value: str | list[str] | list[int] | list[list[int]]) -> list[str]:
    if isinstance(value, str):
        return [value]
    if value and not isinstance(value[0], str):
        raise FieldError(422, "token_ids_not_supported", "'input' holds token ids; this server reads text, so send "
                         "strings (LangChain's OpenAIEmbeddings sends token ids unless check_embedding_ctx_length="
                         "False)", "input")
    return cast(list[str], value)  # the schema allows no mixed list


def _vector(values: Sequence[float], dimensions: int | None, normalize: bool, encoding: str) -> list[float] | str:
    """One embedding as OpenAI answers it: cut to `dimensions` (unit length again if the model's vectors are,
    as OpenAI's shortened embeddings are), as JSON numbers or base64 of little-endian float32."""
    vector = np.asarray(values, dtype=np.float32)
    if dimensions is not None and dimensions < len(vector):
        vector = vector[:dimensions]
        if normalize:  # the eps of torch.nn.functional.normalize, which made the full vector unit length
            vector = vector / max(float(np.linalg.norm(vector)), 1e-12)
    if encoding == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return vector.tolist()


def ranked(scores: Sequence[float], texts: Sequence[str] | None, top_n: int | None) -> list[dict[str, Any]]:
    """[{index, score(, text)}] best first (ties in input order), the first `top_n` of them."""
    order = sorted(range(len(scores)), key=lambda i: -scores[i])[:top_n]
    return [{"index": i, "score": scores[i], **({"text": texts[i]} if texts is not None else {})} for i in order]


def server_info(predictor: Predictor, settings: ServerSettings) -> dict[str, Any]:
    """GET /info: the model (predictor.describe), what is served, and the limits a client must respect."""
    limits = settings.limits
    return {**predictor.describe(), "version": bertkit.__version__,
            "endpoints": [f"/{name}" for name in predictor.endpoints] + list(ALWAYS_SERVED),
            "truncate_default": True, "truncation_direction_default": "right",
            "limits": {"max_batch_size": settings.max_batch_size,
                       "max_batch_tokens": getattr(settings, "max_batch_tokens", None),
                       "max_wait_ms": settings.max_wait_ms, "max_queue": settings.max_queue,
                       "timeout_s": settings.timeout_s, "max_client_batch_size": limits.max_inputs,
                       "max_input_chars": limits.max_input_chars, "max_body_bytes": limits.max_body_bytes}}
