"""bertkit's task endpoints: `/fill-mask`, `/classify`, `/tag` and `/answer`, each served where the model's
head does it (`Route.needs`, bertkit.serve.routes), with their request bodies.

Design decision: a handler checks its request against the limits (limits.py) and hands the checked items to
`server.submit`, which queues them under the call its route declares; the answer is `{"results": [...]}`, one
result per input, in the input's order (a single /answer question gets its result alone).
"""

from __future__ import annotations

from typing import Any

from fastapi import Depends
from pydantic import ConfigDict, Field

from bertkit.serve.compat import RequestBody, Truncation
from bertkit.serve.limits import RequestError, check_count, check_text, check_texts
from bertkit.serve.predictor import MAX_TOP_K
from bertkit.serve.routing import Server, serving

Texts = str | list[str]


class FillMaskRequest(RequestBody):
    inputs: Texts = Field(description="Text(s) with one or more [MASK] tokens.")
    top_k: int = Field(5, ge=1, le=MAX_TOP_K, description="Candidates per [MASK].")


class ClassifyRequest(Truncation):
    inputs: Texts = Field(description="Text(s) to classify (the first sentence of pairs).")
    text_pairs: Texts | None = Field(None, description="Second sentence of each pair, one per input.")


class TagRequest(RequestBody):
    inputs: Texts = Field(description="Text(s) to tag.")


class _OneShape(RequestBody):
    """A body told apart from another shape by its fields: unknown fields are refused (422), so a body with
    both shapes' fields is never read as one of them."""

    model_config = ConfigDict(extra="forbid", strict=True)


class AnswerRequest(_OneShape):
    question: str
    context: str = Field(description="Any length up to the character limit; read in doc-stride windows.")


class AnswerBatchRequest(_OneShape):
    inputs: list[AnswerRequest] = Field(description="Question/context pairs, each answered as the single form.")


def _as_list(texts: Texts) -> list[str]:
    return [texts] if isinstance(texts, str) else texts


async def fill_mask(body: FillMaskRequest, server: Server = Depends(serving)) -> dict[str, Any]:
    texts = _as_list(body.inputs)
    check_texts(texts, "inputs", server.settings.limits, truncatable=False)
    missing = [i for i, t in enumerate(texts) if "[MASK]" not in t]
    if missing:
        raise RequestError(422, "no_mask", f"inputs[{missing[0]}] has no [MASK]; mark the token to predict")
    return {"results": await server.submit((body.top_k,), texts)}


async def classify(body: ClassifyRequest, server: Server = Depends(serving)) -> dict[str, Any]:
    limits = server.settings.limits
    cut = body.direction if body.cuts(server.settings) else None
    texts = check_texts(_as_list(body.inputs), "inputs", limits, cut)
    pairs = _as_list(body.text_pairs) if body.text_pairs is not None else None
    if pairs is not None:
        pairs = check_texts(pairs, "text_pairs", limits, cut)
        if len(pairs) != len(texts):
            raise RequestError(422, "invalid_input", f"{len(texts)} inputs but {len(pairs)} text_pairs; "
                               "send one pair per input")
    second: list[str | None] = list(pairs) if pairs is not None else [None] * len(texts)
    options = (pairs is not None, cut is not None, body.direction)
    return {"results": await server.submit(options, list(zip(texts, second)), "inputs",
                                           "" if pairs is None else " with text_pairs[{i}]")}


async def tag(body: TagRequest, server: Server = Depends(serving)) -> dict[str, Any]:
    texts = _as_list(body.inputs)
    check_texts(texts, "inputs", server.settings.limits, truncatable=False)
    return {"results": await server.submit((), texts)}


async def answer(body: AnswerRequest | AnswerBatchRequest, server: Server = Depends(serving)) -> dict[str, Any]:
    limits = server.settings.limits
    if isinstance(body, AnswerRequest):
        check_text(body.question, "question", limits, truncatable=False)
        check_text(body.context, "context", limits, truncatable=False)
        [result] = await server.submit((), [(body.question, body.context)])
        return result
    check_count(len(body.inputs), "inputs", limits)
    for i, pair in enumerate(body.inputs):
        check_text(pair.question, f"inputs[{i}].question", limits, truncatable=False)
        check_text(pair.context, f"inputs[{i}].context", limits, truncatable=False)
    return {"results": await server.submit((), [(p.question, p.context) for p in body.inputs])}
