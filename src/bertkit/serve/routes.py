"""Every route of the server in one table (`ROUTES`), and the predictor calls their requests are batched under.

A model-running route is one entry: its path, handler, summary, the `Call` it queues under, what the model must
do for it to exist, and whether text-embeddings-inference counts it as a model request. `create_app` registers
the served entries in table order; the micro-batcher's dispatch and token cost (`calls`), the 404 body's and
/info's list of paths (`served_paths`), the OpenAPI description (FastAPI's, from the registered routes) and
the routes the te_request_* metrics count all come from this table. The table's order is the order those lists
give: the task endpoints, the embedding endpoints, then the service routes.

Design decision: TEI's `Router` block (router/src/http/server.rs) as data; handlers live with their request
bodies (task_routes.py: bertkit's tasks; tei.py: TEI's embedding routes; compat.py: OpenAI's and TEI's other
routes; observability.py: /metrics) and never name their batch key, which is the entry's `call`.
"""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from bertkit.serve import compat, cost, task_routes, tei
from bertkit.serve.limits import error_body
from bertkit.serve.observability import metrics_page
from bertkit.serve.predictor import Predictor
from bertkit.serve.routing import Call, Route, calls, paths, served

# --- the predictor calls: `run(predictor, options, items)` for items queued with equal options --------------

def _classify(p: Any, options: tuple[Any, ...], items: list[Any]) -> list[Any]:
    has_pairs, truncate, direction = options
    return p.classify([text for text, _ in items], [pair for _, pair in items] if has_pairs else None,
                      truncate=truncate, truncation_direction=direction)


def _rerank(p: Any, options: tuple[Any, ...], items: list[Any]) -> list[Any]:
    truncate, direction, raw_scores = options
    return p.rerank([query for query, _ in items], [text for _, text in items], truncate=truncate,
                    truncation_direction=direction, raw_scores=raw_scores)


def _embed(p: Any, options: tuple[Any, ...], items: list[Any]) -> list[Any]:
    pooling, normalize, truncate, direction, prompt_name = options
    return p.embed(items, pooling=pooling, normalize=normalize, truncate=truncate, truncation_direction=direction,
                   prompt_name=prompt_name).tolist()


def _embeddings(p: Any, options: tuple[Any, ...], items: list[Any]) -> list[Any]:
    """Each vector with the tokens it read (OpenAI's `usage`)."""
    normalize, truncate, direction, prompt_name = options
    vectors, counts = p.embed_with_counts(items, "auto", normalize, truncate, direction, prompt_name)
    return list(zip(vectors.tolist(), counts))


FILL_MASK = Call("fill-mask", lambda p, o, items: p.fill_mask(items, top_k=o[0]), cost.fill_mask_costs)
CLASSIFY = Call("classify", _classify, cost.classify_costs)
RERANK = Call("rerank", _rerank)
TAG = Call("tag", lambda p, o, items: p.tag(items), cost.tag_costs)
ANSWER = Call("answer", lambda p, o, items: p.answer([q for q, _ in items], [c for _, c in items]),
              cost.answer_costs)
EMBED = Call("embed", _embed, cost.prompted_costs)
EMBED_ALL = Call("embed_all", lambda p, o, items: [v.tolist() for v in p.token_vectors(items, *o)],
                 cost.prompted_costs)  # options: truncate, direction, prompt_name
EMBEDDINGS = Call("embeddings", _embeddings, cost.prompted_costs)
TOKENIZE = Call("tokenize", lambda p, o, items: p.tokenize(items, add_special_tokens=o[0]), cost.no_cost,
                runs_model=False)


# --- the probes ---------------------------------------------------------------------------------------------

async def health() -> dict[str, str]:
    return {"status": "ok"}


async def ready(request: Request) -> JSONResponse:
    if request.app.state.ready:
        return JSONResponse({"status": "ready"})
    failure = getattr(request.app.state, "failure", None)
    if failure:
        return JSONResponse(error_body("warm_up_failed", f"the warm-up pass failed: {failure}", 503), status_code=503)
    return JSONResponse(error_body("not_ready", "the model is warming up or shutting down", 503), status_code=503)


# --- the table ----------------------------------------------------------------------------------------------

ROOT = "By the body, as TEI by the model: rerank (query, texts), similarity (inputs.source_sentence), predict (a " \
       "classifier), else embed; what huggingface_hub's InferenceClient calls."
EMBEDDINGS_SUMMARY = "Sentence vectors in OpenAI's format (the directory's pooling; unit length unless --no-normalize)."

ROUTES: tuple[Route, ...] = (
    Route("/fill-mask", task_routes.fill_mask, "Top-k tokens for every [MASK].", call=FILL_MASK, needs="fill-mask",
          counted=True),
    Route("/classify", task_routes.classify, "Label and probabilities (or a regression score).", call=CLASSIFY,
          needs="classify", counted=True),
    Route("/rerank", compat.rerank, "Texts scored against a query by the pair classifier, best first (TEI's "
          "shape).", call=RERANK, needs="rerank", counted=True, refusal=compat.rerank_refusal),
    Route("/tag", task_routes.tag, "Entities with character spans.", call=TAG, needs="tag", counted=True),
    Route("/answer", task_routes.answer, "Answer span in the context (or no answer, v2.0); a list under `inputs` "
          "gets a list of answers under `results`.", call=ANSWER, needs="answer", counted=True),
    Route("/embed", tei.embed, "Sentence vectors, a list of lists (TEI's shape); unit length unless normalize is "
          "false.", call=EMBED, counted=True),
    Route("/predict", tei.predict, "Every label's probability, best first (TEI's shape; a batch gets one list per "
          "input).", call=CLASSIFY, needs="classify", counted=True),
    Route("/embed_all", tei.embed_all, "The last layer's vector of every token read, per input (TEI's shape: a "
          "list of lists of vectors).", call=EMBED_ALL, counted=True),
    Route("/similarity", tei.similarity, "Cosine similarity of the source sentence to each sentence (TEI's "
          "shape).", call=EMBED, counted=True),
    Route("/v1/embeddings", compat.embeddings, EMBEDDINGS_SUMMARY, call=EMBEDDINGS, counted=True),
    Route("/embeddings", compat.embeddings, EMBEDDINGS_SUMMARY + " TEI's alias of /v1/embeddings.",
          call=EMBEDDINGS, counted=True, operation_id="embeddings_alias"),
    Route("/tokenize", compat.tokenize, "Tokens as the model reads them, never truncated (TEI's shape: one list "
          "per input; start/stop in bytes, char_start/char_stop in characters).", call=TOKENIZE),
    Route("/decode", compat.decode, "Token ids back to text (TEI's shape: one string per id list)."),
    Route("/info", compat.info, "The model, its maximum input length, labels and precision, and the server's "
          "limits (TEI's keys, then bertkit's).", method="GET"),
    Route("/metrics", metrics_page, "Prometheus metrics (text format); no API key.", method="GET", secured=False),
    Route("/ready", ready, "Readiness: model loaded and a real forward pass done (else 503).", method="GET",
          secured=False),
    Route("/health", health, "Liveness: the process answers.", method="GET", secured=False),
    Route("/ping", ready, "Readiness, as /ready (SageMaker's health check).", method="GET", secured=False),
    Route("/", ready, "Readiness, as /ready (TEI's health check at the root).", method="GET", secured=False,
          operation_id="root_get"),
    Route("/", tei.root, ROOT, counted=True, operation_id="root_post"),
    Route("/invocations", tei.root, ROOT, counted=True, operation_id="root_invocations"),
)

CALLS = calls(ROUTES)
"""The calls of the table by name (what `token_cost` and the batcher dispatch on)."""


def served_paths(predictor: Predictor, routes: tuple[Route, ...] = ROUTES) -> list[str]:
    """Every path `predictor` is served at, in table order, and /docs."""
    return paths(served(routes, predictor))
