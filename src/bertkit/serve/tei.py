"""text-embeddings-inference's (TEI 1.9) model routes, so a TEI deployment's clients, gateways and health checks
work unchanged: `/embed`, `/embed_all`, `/similarity`, `/predict`, and `POST /` with SageMaker's
`POST /invocations` (what `huggingface_hub.InferenceClient` calls at a server's root); `GET /` and `GET /ping`
answer as health checks. Shapes are TEI's: /embed answers a bare list of vectors, /predict a list of
{score, label} best first, /similarity a list of cosine similarities.

Design decisions:

- `POST /` reads the body to choose, where TEI chooses by model type at start-up: a body with `query` and
  `texts` is a rerank, `inputs` holding `source_sentence` a similarity, `inputs` to a classifier a predict,
  anything else an embed. So one server answers `feature_extraction`, `sentence_similarity` and
  `text_classification` at its root, where TEI needs `TASK=sentence-similarity` for the second.
- Defaults are TEI's: vectors are unit length unless `normalize` is false (`--no-normalize` makes the
  directory's own the default), and long inputs are cut unless `truncate` is false (`--no-auto-truncate`).
  docs/inference.md has the table of every difference from TEI.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any, Literal

from fastapi import Depends, Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, Field, ValidationError

from bertkit.serve.compat import (
    Inputs,
    RequestBody,
    RerankRequest,
    Truncation,
    check_prompt,
    cut_vector,
    json_bytes,
    read_inputs,
    rerank,
)
from bertkit.serve.limits import FieldError, RequestError, check_count, check_text, check_texts, non_json_body
from bertkit.serve.observability import note_batch
from bertkit.serve.routing import Server, serving


class EmbedRequest(Truncation):
    inputs: Inputs = Field(description="A text, a list of texts, or token ids (one list or a list of lists).")
    normalize: bool | None = Field(None, description="Unit-length vectors; null or absent: the server's "
                                   "--normalize (on, as TEI), else the directory's own.")
    dimensions: int | None = Field(None, ge=1, description="Keep the first N values of each vector (then "
                                   "normalised, as TEI).")
    prompt_name: str | None = Field(None, description="Put this named prompt of the directory before each text.")
    pooling: Literal["auto", "cls", "mean", "max", "mean_sqrt_len_tokens"] = Field(
        "auto", description="A bertkit extra: auto is the directory's sentence-transformers pooling, else [CLS].")


class EmbedAllRequest(Truncation):
    inputs: Inputs
    prompt_name: str | None = None


class SimilarityInput(RequestBody):
    source_sentence: str
    sentences: list[str]


class SimilarityParameters(Truncation):
    prompt_name: str | None = None


class SimilarityRequest(RequestBody):
    inputs: SimilarityInput
    parameters: SimilarityParameters | None = None


class PredictRequest(Truncation):
    inputs: str | list[str] | list[list[str]] = Field(
        description="A text, a pair [text, text], or a batch of [text] and [text, text] lists.")
    raw_scores: bool = Field(False, description="Logits instead of probabilities (TEI); refused here (422).")


async def embed(body: EmbedRequest, server: Server = Depends(serving)) -> list[list[float]]:
    predictor, settings = server.predictor, server.settings
    check_prompt(predictor, body.prompt_name)
    cut = body.direction if body.cuts(settings) else None
    texts = read_inputs(body.inputs, "inputs", predictor, settings, cut, body.prompt_name)
    normalize = body.normalize if body.normalize is not None else (True if settings.normalize else None)
    _, unit, width = predictor.embedding_spec(body.pooling, normalize)
    if body.dimensions is not None and body.dimensions > width:
        raise FieldError(422, "invalid_dimensions", f"'dimensions' is {body.dimensions} but this model's vectors "
                         f"have {width} values; send at most {width}", "dimensions")
    vectors = await server.submit((body.pooling, normalize, cut is not None, body.direction, body.prompt_name),
                                  texts)
    if body.dimensions is None:
        return vectors
    return [cut_vector(v, body.dimensions, unit, "float") for v in vectors]  # type: ignore[misc]


async def embed_all(body: EmbedAllRequest, server: Server = Depends(serving)) -> list[list[list[float]]]:
    """Every token's vector, bounded: at most --max-token-vectors tokens a request (counted before the model runs),
    and the JSON made on a worker thread, so a large answer never holds the event loop (/health, other routes)."""
    check_prompt(server.predictor, body.prompt_name)
    cut = body.direction if body.cuts(server.settings) else None
    texts = read_inputs(body.inputs, "inputs", server.predictor, server.settings, cut, body.prompt_name)
    options = (cut is not None, body.direction, body.prompt_name)
    tokens = sum(server.count(options, texts))
    most = server.settings.limits.max_token_vectors
    if tokens > most:
        raise FieldError(422, "too_many_token_vectors", f"`inputs` read {tokens:,} tokens; /embed_all answers at most "
                         f"{most:,} token vectors a request (--max-token-vectors): send fewer or shorter inputs",
                         "inputs")
    vectors = await server.submit(options, texts)
    answer = await asyncio.to_thread(json_bytes, vectors)
    return Response(answer, media_type="application/json")  # type: ignore[return-value]


async def similarity(body: SimilarityRequest, server: Server = Depends(serving)) -> list[float]:
    note_batch(True)  # TEI embeds the source and the sentences as one batch
    limits = server.settings.limits
    parameters = body.parameters or SimilarityParameters.model_validate({})
    check_prompt(server.predictor, parameters.prompt_name)
    cut = parameters.direction if parameters.cuts(server.settings) else None
    if not body.inputs.sentences:
        raise RequestError(400, "empty", "`inputs.sentences` cannot be empty")
    check_count(len(body.inputs.sentences) + 1, "inputs.sentences (with the source sentence)", limits)
    source = check_text(body.inputs.source_sentence, "inputs.source_sentence", limits, cut)
    sentences = check_texts(body.inputs.sentences, "inputs.sentences", limits, cut)
    options = ("auto", True, cut is not None, parameters.direction, parameters.prompt_name)  # /embed's, unit length
    names = ["'inputs.source_sentence'", *(f"'inputs.sentences[{i}]'" for i in range(len(sentences)))]
    source_vector, *vectors = await server.submit(options, [source, *sentences], names=names)  # dot = cosine
    return [min(max(float(sum(a * b for a, b in zip(source_vector, vector))), -1.0), 1.0) for vector in vectors]


async def predict(body: PredictRequest, server: Server = Depends(serving)) -> list[Any]:
    predictor, limits = server.predictor, server.settings.limits
    if body.raw_scores and predictor.labels is not None:
        raise FieldError(422, "raw_scores_not_supported", "raw_scores is for a model with one output here; "
                         "a classifier's /predict answers probabilities (/rerank has raw_scores for pairs)",
                         "raw_scores")
    single, items = _predict_items(body.inputs)
    note_batch(not single)
    cut = body.direction if body.cuts(server.settings) else None
    check_count(len(items), "inputs", limits)
    items = [tuple(check_text(text, f"inputs[{i}]", limits, cut) for text in item) for i, item in enumerate(items)]
    results: list[Any] = [None] * len(items)
    groups = [[i for i, item in enumerate(items) if len(item) == size] for size in (1, 2)]

    async def run(indices: list[int], pairs: bool) -> None:
        answers = await server.submit((pairs, cut is not None, body.direction),
                                      [(items[i][0], items[i][1] if pairs else None) for i in indices],
                                      names=[f"'inputs[{i}]'" for i in indices])
        sigmoid = getattr(predictor, "sigmoid_scores", False) and not body.raw_scores
        for i, answer in zip(indices, answers):
            results[i] = _labels_best_first(answer, sigmoid)

    await asyncio.gather(*(run(indices, size == 2) for size, indices in zip((1, 2), groups) if indices))
    return results[0] if single else results


async def root(request: Request, server: Server = Depends(serving)) -> Any:
    """POST / and /invocations: the route the body's shape names, as TEI's model type would (see above)."""
    body = await _json_object(request)
    reranking = server.at("/rerank")
    if isinstance(body.get("query"), str) and "texts" in body and reranking is not None:
        return await rerank(_validate(RerankRequest, body), reranking)
    inputs = body.get("inputs")
    if isinstance(inputs, dict) and "source_sentence" in inputs:
        return await similarity(_validate(SimilarityRequest, body), _at(server, "/similarity"))
    predicting = server.at("/predict")
    if predicting is not None:
        return await predict(_validate(PredictRequest, body), predicting)
    return await embed(_validate(EmbedRequest, body), _at(server, "/embed"))


def _at(server: Server, path: str) -> Server:
    """The server as the handler of `path`, a route every model serves."""
    routed = server.at(path)
    if routed is None:
        raise TypeError(f"{path} is missing from the route table")  # every model serves it: a bug
    return routed


def _predict_items(inputs: str | list[str] | list[list[str]]) -> tuple[bool, list[tuple[str, ...]]]:
    """(single, inputs as 1- or 2-tuples), read as TEI reads /predict's `inputs`: a string or a list of one or
    two strings is one input; a list of such lists is a batch."""
    if isinstance(inputs, str):
        return True, [(inputs,)]
    if inputs and all(isinstance(item, str) for item in inputs):
        if len(inputs) > 2:
            raise FieldError(422, "invalid_input", f"'inputs' is a list of {len(inputs)} strings; send a text, a "
                             "pair [text, text], or a batch [[text], [text, text], ...]", "inputs")
        return True, [tuple(inputs)]  # type: ignore[arg-type]
    batch = [tuple(item) for item in inputs]
    bad = next((i for i, item in enumerate(batch) if len(item) not in (1, 2)), None)
    if bad is not None:
        raise FieldError(422, "invalid_input", f"'inputs[{bad}]' has {len(batch[bad])} strings; each input of a "
                         "batch is [text] or [text, text]", "inputs")
    return False, batch


def _labels_best_first(answer: dict[str, Any], sigmoid: bool) -> list[dict[str, Any]]:
    """A /classify answer as TEI's predictions: [{score, label}] best first; a model with one output: its value,
    through a sigmoid where the directory says so (a CrossEncoder's), as /rerank scores it."""
    if "probabilities" not in answer:
        value = answer["score"]
        return [{"score": 1 / (1 + math.exp(-value)) if sigmoid else value, "label": "LABEL_0"}]
    pairs = sorted(answer["probabilities"].items(), key=lambda item: -item[1])
    return [{"score": score, "label": label} for label, score in pairs]


async def _json_object(request: Request) -> dict[str, Any]:
    refused = non_json_body(request.headers.get("content-type"))
    if refused is not None:
        raise refused
    try:
        body = await request.json()
    except (ValueError, RecursionError):  # RecursionError: nesting deeper than the parser goes
        raise RequestError(400, "invalid_json", "the body is not valid JSON") from None
    if not isinstance(body, dict):
        raise RequestError(422, "invalid_request", "the body must be a JSON object (see /docs)")
    return body


def _validate(model: type[BaseModel], body: dict[str, Any]) -> Any:
    """`body` as a `model`, or the 422 the route itself would answer."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]) from None
