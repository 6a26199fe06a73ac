"""The endpoints other servers made conventional, over bertkit's own inference: OpenAI's
`POST /v1/embeddings` (and TEI's alias `/embeddings`), and text-embeddings-inference's (TEI 1.9)
`/rerank`, `/tokenize`, `/decode` and `GET /info`; the request bodies and fields every text endpoint
shares (`truncate`, `truncation_direction`, `prompt_name`, token-id inputs).

Design decision: these are other servers' request and response layouts, not new inference.
/v1/embeddings runs what /embed runs, /rerank the pair scoring /classify does, /tokenize the tokenizer
every predictor uses; all go through the same limits and micro-batcher. So the `openai` client, gateways
that speak OpenAI, and TEI's clients work unchanged, and the numbers equal bertkit's other endpoints.
Request bodies are read as TEI reads them: unknown fields are ignored, `null` means the default, types
are strict (no "1" for 1). Under /v1/ the error body takes OpenAI's shape (limits.openai_error).

Token ids: an input may be a list of this model's token ids (what /tokenize gives, with or without [CLS] and
[SEP]), as TEI and OpenAI accept. The model reads [CLS] ids [SEP], the ids as they are (an [UNK] stays
[UNK]; TEI decodes and re-encodes them); an id outside the vocabulary is refused, naming the likely cause:
LangChain's OpenAIEmbeddings sends tiktoken's ids, which mean nothing to a BERT vocabulary, unless
`check_embedding_ctx_length=False`.

References: OpenAI API reference, "Embeddings" and "Error codes"; huggingface/text-embeddings-inference
1.9, router/src/http/types.rs and server.rs, core/src/tokenization.rs.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Sequence
from typing import Any, Literal, cast

import numpy as np
from fastapi import Depends, Response
from pydantic import BaseModel, ConfigDict, Field

import bertkit
from bertkit.serve.limits import FieldError, RequestError, check_count, check_text, check_texts
from bertkit.serve.observability import note_batch
from bertkit.serve.predictor import Predictor
from bertkit.serve.routing import Server, paths, serving
from bertkit.serve.tokens import Ids
from bertkit.settings import ServerSettings

# --- request bodies ----------------------------------------------------------------------------------

class RequestBody(BaseModel):
    """Every request body: a JSON object whose known fields have exactly their types; other fields are
    ignored, as TEI and OpenAI's servers ignore them."""

    model_config = ConfigDict(extra="ignore", strict=True)


class Truncation(RequestBody):
    truncate: bool | None = Field(None, description="Cut an input longer than the model's maximum length to fit "
                                  "(true), or refuse it with 422 and its token count (false); null or absent: the "
                                  "server's --auto-truncate (on by default, as TEI 1.9).")
    truncation_direction: Literal["right", "left", "Right", "Left"] = Field(
        "right", description="Which end is cut: right keeps the start of each text, left its end.")

    @property
    def direction(self) -> str:
        return self.truncation_direction.lower()

    def cuts(self, settings: ServerSettings) -> bool:
        """Whether this request's long inputs are cut: its own `truncate`, else the server's default."""
        return settings.auto_truncate if self.truncate is None else self.truncate


TokenIds = list[int]
Inputs = str | TokenIds | list[str | TokenIds]
"""TEI's `inputs`: a text, a list of token ids, or a list of texts and token-id lists."""


class EmbeddingsRequest(Truncation):
    input: Inputs = Field(description="A text, a list of texts, or token ids (one list or a list of lists).")
    model: str | None = Field(None, description="Any name; echoed in the answer (this server has one model).")
    dimensions: int | None = Field(None, ge=1, description="Keep the first N values of each vector (normalised "
                                   "again when the vectors are unit length).")
    encoding_format: Literal["float", "base64"] = Field("float", description="base64: little-endian float32 "
                                                        "bytes, as the openai client decodes them.")
    user: str | None = Field(None, description="Accepted and ignored.")


class RerankRequest(Truncation):
    query: str
    texts: list[str] = Field(description="Texts to score against the query, each as the pair (query, text).")
    top_n: int | None = Field(None, ge=1, description="Answer only the N best; default all (a bertkit extra).")
    return_text: bool = Field(False, description="Include each text in its result.")
    raw_scores: bool = Field(False, description="The model's raw output (a logit) instead of a probability.")


class TokenizeRequest(RequestBody):
    inputs: str | list[str]
    add_special_tokens: bool = Field(True, description="Include [CLS] and [SEP].")
    prompt_name: str | None = Field(None, description="Put this named prompt of the directory before each text.")


class DecodeRequest(RequestBody):
    ids: TokenIds | list[TokenIds] = Field(description="Token ids, or a list of token-id lists.")
    skip_special_tokens: bool = Field(True, description="Leave [CLS], [SEP], [PAD] out of the text.")


# --- inputs -------------------------------------------------------------------------------------------------

def read_inputs(value: Inputs, field: str, predictor: Predictor, settings: ServerSettings, cut: str | None,
                prompt_name: str | None = None) -> list[str | Ids]:
    """The inputs of an `inputs` value: texts checked (limits.check_texts; cut to the character limit from the
    `cut` end when truncating), token-id lists checked against the vocabulary and read as `Ids` ([CLS] and
    [SEP] at their ends left out: the model adds its own)."""
    items: list[str | TokenIds]
    if isinstance(value, str):
        items = [value]
    elif value and all(isinstance(v, int) for v in value):
        items = [value]  # type: ignore[list-item]  # one list of ids
    else:
        items = list(value)  # type: ignore[arg-type]
    batched = not isinstance(value, str) and items != [value]
    note_batch(batched)
    check_count(len(items), field, settings.limits)
    # A list of inputs names each by its index, even a list of one: the client sent input[0], not input.
    names = [f"{field}[{i}]" if batched or field == "inputs" else field for i in range(len(items))]
    out: list[str | Ids] = [check_text(item, name, settings.limits, cut) if isinstance(item, str) else
                            _ids(item, name, predictor) for item, name in zip(items, names)]
    if prompt_name is not None and any(isinstance(item, Ids) for item in out):
        raise FieldError(422, "invalid_input", "prompt_name goes before a text; send the inputs as text, or leave "
                         "prompt_name out for token ids", "prompt_name")
    return out


def _ids(ids: TokenIds, name: str, predictor: Predictor) -> Ids:
    if not ids:
        raise RequestError(400, "empty", f"`{name}` cannot be empty; send some token ids")
    size = predictor.tokenizer.vocab_size
    bad = next((i for i, token in enumerate(ids) if not 0 <= token < size), None)
    if bad is not None:
        raise FieldError(422, "invalid_token_id", f"'{name}' holds token id {ids[bad]} at position {bad}, outside "
                         f"this model's vocabulary of {size}; send this model's ids (POST /tokenize) or text. "
                         "LangChain's OpenAIEmbeddings sends OpenAI's tiktoken ids unless created with "
                         "check_embedding_ctx_length=False", name.split("[")[0])
    start = 1 if ids[0] == predictor.tokenizer.cls_token_id else 0
    stop = len(ids) - 1 if len(ids) > start and ids[-1] == predictor.tokenizer.sep_token_id else len(ids)
    return Ids(ids[start:stop])


def check_prompt(predictor: Predictor, prompt_name: str | None) -> None:
    """422 unless `prompt_name` is None or one of the directory's named prompts."""
    if prompt_name is not None and prompt_name not in predictor.prompt_names:
        raise FieldError(422, "invalid_prompt_name", f"prompt_name {prompt_name!r} is not one of this model's "
                         f"prompts ({', '.join(predictor.prompt_names) or 'it has none'})", "prompt_name")


# --- routes (bertkit.serve.routes declares them) ------------------------------------------------------

async def embeddings(body: EmbeddingsRequest, server: Server = Depends(serving)) -> dict[str, Any]:
    predictor, settings = server.predictor, server.settings
    cut = body.direction if body.cuts(settings) else None
    texts = read_inputs(body.input, "input", predictor, settings, cut)
    _, _, width = predictor.embedding_spec()
    normalize = True if settings.normalize else None
    if body.dimensions is not None and body.dimensions > width:
        raise FieldError(422, "invalid_dimensions", f"'dimensions' is {body.dimensions} but this model's vectors "
                         f"have {width} values; send at most {width}", "dimensions")
    results = await server.submit((normalize, cut is not None, body.direction, None), texts, "input")
    unit = predictor.embedding_spec(normalize=normalize)[1]
    data = [{"object": "embedding", "index": i,
             "embedding": cut_vector(vector, body.dimensions, unit, body.encoding_format)}
            for i, (vector, _) in enumerate(results)]
    tokens = sum(count for _, count in results)
    return {"object": "list", "data": data, "model": body.model or predictor.model_id,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


async def rerank(body: RerankRequest, server: Server = Depends(serving)) -> list[dict[str, Any]]:
    note_batch(True)
    limits = server.settings.limits
    cut = body.direction if body.cuts(server.settings) else None
    query = check_text(body.query, "query", limits, cut)
    texts = check_texts(body.texts, "texts", limits, cut)
    scores = await server.submit((cut is not None, body.direction, body.raw_scores),
                                 [(query, text) for text in texts], "texts", " with the query")
    return ranked(scores, body.texts if body.return_text else None, body.top_n)


def rerank_refusal(predictor: Predictor) -> str:
    """Why a classifier without a relevance score has no /rerank (the start of its 404 message)."""
    if "classify" not in predictor.endpoints:
        return ""
    return (f"/rerank needs a classifier with one output or two labels (this one has {len(predictor.labels or [])} "
            "labels, none a relevance score); ")


async def tokenize(body: TokenizeRequest, server: Server = Depends(serving)) -> list[list[dict[str, Any]]]:
    """Every token of each input, bounded: at most --max-tokenize-tokens tokens a request (counted before the table
    is built), and the JSON made on a worker thread, so a large answer never holds the event loop."""
    predictor = server.predictor
    texts = [body.inputs] if isinstance(body.inputs, str) else body.inputs
    texts = check_texts(texts, "inputs", server.settings.limits, truncatable=False)
    check_prompt(predictor, body.prompt_name)
    if predictor.sentence is not None:  # the prompt the model reads, as TEI tokenizes it (offsets include it)
        sentence = predictor.sentence
        prompt = dict(sentence.prompts)[body.prompt_name] if body.prompt_name else sentence.prompt
        texts = [prompt + text for text in texts]
    # counted, not bounded by the characters: lowercasing splits a Hangul syllable into 2-3 letters, each a piece
    tokens = (2 * len(texts) if body.add_special_tokens else 0) + sum(
        map(len, await asyncio.to_thread(predictor.tokenizer.encode_ids, texts)))
    most = server.settings.limits.max_tokenize_tokens
    if tokens > most:
        raise FieldError(422, "too_many_tokens_listed", f"`inputs` hold {tokens:,} tokens; /tokenize answers at most "
                         f"{most:,} a request (--max-tokenize-tokens): send fewer or shorter inputs", "inputs")
    tables = await server.submit((body.add_special_tokens,), texts, "inputs")
    return Response(await asyncio.to_thread(json_bytes, tables),  # type: ignore[return-value]
                    media_type="application/json")


def json_bytes(value: Any) -> bytes:
    """`value` as compact JSON (what FastAPI would answer, made where the caller runs it)."""
    return json.dumps(value, separators=(",", ":"), allow_nan=False, ensure_ascii=False).encode()


async def decode(body: DecodeRequest, server: Server = Depends(serving)) -> list[str]:
    tokenizer = server.predictor.tokenizer
    ids = cast(list[list[int]], body.ids if body.ids and isinstance(body.ids[0], list) else [body.ids])
    if not body.ids:
        raise RequestError(400, "empty", "`ids` cannot be empty; send some token ids")
    check_count(len(ids), "ids", server.settings.limits)
    for i, one in enumerate(ids):
        if not one:
            raise RequestError(400, "empty", f"`ids[{i}]` cannot be empty; send some token ids")
        if not all(0 <= token < tokenizer.vocab_size for token in one):
            raise FieldError(422, "invalid_token_id", f"'ids[{i}]' holds a token id outside this model's "
                             f"vocabulary of {tokenizer.vocab_size}", "ids")
    return [tokenizer.decode(one, skip_special_tokens=body.skip_special_tokens) for one in ids]


async def info(server: Server = Depends(serving)) -> dict[str, Any]:
    return server_info(server.predictor, server.settings, paths(server.routes))


def cut_vector(values: Sequence[float], dimensions: int | None, normalize: bool, encoding: str) -> list[float] | str:
    """One embedding as OpenAI answers it: cut to `dimensions` (unit length again if the vectors are, as
    OpenAI's shortened embeddings are), as JSON numbers or base64 of little-endian float32."""
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


def tei_model_type(predictor: Predictor) -> dict[str, Any]:
    """TEI's `model_type`: {"reranker": ...} for a classifier with one output (TEI's rule), {"classifier": ...}
    for another classifier, else {"embedding": {"pooling": ...}} (TEI's name of the directory's pooling)."""
    labels = predictor.labels
    if "classify" in predictor.endpoints:
        names = labels or ["LABEL_0"]
        table = {"id2label": {str(i): name for i, name in enumerate(names)},
                 "label2id": {name: i for i, name in enumerate(names)}}
        return {"reranker": table} if labels is None else {"classifier": table}
    modes, _, _ = predictor.embedding_spec()
    return {"embedding": {"pooling": "+".join(modes)}}


def server_info(predictor: Predictor, settings: ServerSettings, endpoints: list[str]) -> dict[str, Any]:
    """GET /info: TEI's keys first (what its clients read), then what bertkit adds: the model
    (predictor.describe; its own `model_type` as `task`), what is served (`endpoints`), and the limits."""
    limits = settings.limits
    described = predictor.describe()
    task = described.pop("model_type")
    tei = {"model_id": predictor.model_id, "model_sha": None,
           "model_dtype": {"bf16": "bfloat16", "fp16": "float16", "int8": "int8"}.get(predictor.precision, "float32"),
           "served_model_name": predictor.model_id, "model_type": tei_model_type(predictor),
           "max_concurrent_requests": settings.max_queue, "max_input_length": predictor.max_seq_length,
           "max_batch_tokens": settings.max_batch_tokens, "max_batch_requests": settings.max_batch_size,
           "max_client_batch_size": limits.max_inputs, "auto_truncate": settings.auto_truncate,
           "tokenization_workers": 1, "version": bertkit.__version__, "sha": None, "docker_label": None}
    return {**tei, **{k: v for k, v in described.items() if k not in tei}, "task": task,
            "endpoints": endpoints,
            "truncate_default": settings.auto_truncate, "truncation_direction_default": "right",
            "normalize_default": settings.normalize,
            "limits": {"max_batch_size": settings.max_batch_size, "max_batch_tokens": settings.max_batch_tokens,
                       "max_wait_ms": settings.max_wait_ms, "max_queue": settings.max_queue,
                       "timeout_s": settings.timeout_s, "max_client_batch_size": limits.max_inputs,
                       "max_input_chars": limits.max_input_chars, "max_body_bytes": limits.max_body_bytes}}
