"""The HTTP layer: a FastAPI app over one predictor, and `run_server` (uvicorn with draining on SIGTERM).

Task endpoints exist only for what the checkpoint can do (`predictor.endpoints`); text-embeddings-inference's
routes (tei.py), /v1/embeddings, /tokenize, /decode and /info (compat.py) for every model; any other path
answers 404 with the list of endpoints this model serves. Every response, errors included, is JSON that never
carries a path, a traceback or the request's text; errors have TEI's shape with bertkit's code beside it,
{"error": message, "error_type", "code"} (limits.error_body), except under /v1/, where they take OpenAI's,
{"error": {"message", "type", "param", "code"}}, for OpenAI's clients.

Status codes: 200 ok; 400 an empty input (TEI's Empty), invalid JSON (or HTTP); 401 missing/wrong API key;
404 unknown path; 405 wrong method; 408 request not sent in time; 413 body too large; 422 request well-formed
JSON but invalid (types, limits, an input over the model's maximum length sent with "truncate": false, no
[MASK], ...); 429 queue full (Retry-After); 431 headers too large; 500 a server bug (logged; the message says
nothing more); 503 not ready to take it (shutting down, or every connection slot busy); 504 the request's
time limit passed before its result was ready.

The API description is `/openapi.json`; `/docs` (Swagger UI) and `/redoc` read it with scripts and styles
served by this app (DOCS_ASSETS, from the fastapi-offline package), never from a CDN, so they work on a
machine without internet access.

Design decision: the layer is thin. Limits are checked here, before tokenizing (limits.py); slow or
too many connections are handled below the app, in uvicorn's protocol (connections.py); requests are
batched by one worker (microbatch.py); all inference is the predictor's. Requests are plain JSON
validated by pydantic models: nothing from a request is ever unpickled, imported or used as a path.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import logging
import signal
from collections.abc import AsyncIterator, Hashable, Mapping
from typing import Any, cast

import torch
import uvicorn
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from fastapi_offline import FastAPIOffline
from pydantic import ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from bertkit.errors import BertkitError
from bertkit.serve.compat import FieldError, RequestBody, Submit, Truncation, add_routes, served_endpoints
from bertkit.serve.connections import (
    ConnectionGuard,
    CountRequestWarnings,
    EventLog,
    GuardedH11Protocol,
    fit_file_limit,
    handle_accept_errors,
)
from bertkit.serve.cost import token_cost
from bertkit.serve.limits import (
    OPENAI_PREFIX,
    BodySizeLimit,
    RequestError,
    check_count,
    check_text,
    check_texts,
    error_body,
    openai_error,
)
from bertkit.serve.microbatch import MicroBatcher, NotRunningError, QueueFullError
from bertkit.serve.observability import install_observability, note_error
from bertkit.serve.predictor import MAX_TOP_K, InputTooLongError, Predictor
from bertkit.serve.tei import add_tei_routes
from bertkit.settings import ServerSettings

log = logging.getLogger(__name__)

DOCS_ASSETS = "/docs-assets"
"""Where /docs and /redoc load Swagger UI's and ReDoc's scripts, styles and icon from: this app."""


# --- request bodies -------------------------------------------------------------------------------

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


# --- the app ----------------------------------------------------------------------------------------

def create_app(predictor: Predictor, settings: ServerSettings | None = None) -> FastAPI:
    """The ASGI app serving `predictor`; `app.state.ready` turns true after a real warm-up forward pass."""
    settings = settings or ServerSettings()
    batcher = MicroBatcher(lambda key, items: _run(predictor, key, items), settings.max_batch_size,
                           settings.max_wait_ms / 1000, settings.max_queue, settings.max_batch_tokens,
                           token_cost(predictor))

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        batcher.start()
        warmup = asyncio.create_task(_warm_up(app, batcher, predictor))
        yield
        app.state.ready = False
        warmup.cancel()
        await batcher.stop()

    app = FastAPIOffline(title="bertkit", summary=f"BERT {type(predictor).__name__}: "
                         f"{', '.join(predictor.endpoints)}", lifespan=lifespan, static_url=DOCS_ASSETS,
                         swagger_ui_parameters={"validatorUrl": None})  # no badge from swagger.io either
    app.state.ready = False
    app.state.batcher = batcher
    app.state.settings = settings
    app.state.device = next(predictor.model.parameters(), torch.empty(0)).device.type
    app.add_middleware(BodySizeLimit, max_bytes=settings.limits.max_body_bytes)
    _add_error_handlers(app, predictor)
    _add_probes(app)
    _add_task_routes(app, predictor, settings, batcher)
    install_observability(app, settings, batcher)
    return app


async def _warm_up(app: FastAPI, batcher: MicroBatcher, predictor: Predictor) -> None:
    await batcher.call(predictor.warmup)
    app.state.ready = True
    log.info("model warmed up; ready")


def _run(predictor: Any, key: Hashable, items: list[Any]) -> list[Any]:
    """One predictor call for a group of requests with equal key (endpoint + options)."""
    endpoint, *options = cast(tuple[Any, ...], key)  # the routes submit (endpoint, *options) tuples
    if endpoint == "fill-mask":
        return predictor.fill_mask(items, top_k=options[0])
    if endpoint == "classify":
        has_pairs, truncate, direction = options
        pairs = [pair for _, pair in items] if has_pairs else None
        return predictor.classify([text for text, _ in items], pairs, truncate=truncate,
                                  truncation_direction=direction)
    if endpoint == "rerank":
        truncate, direction, raw_scores = options
        return predictor.rerank([q for q, _ in items], [t for _, t in items], truncate=truncate,
                                truncation_direction=direction, raw_scores=raw_scores)
    if endpoint == "tag":
        return predictor.tag(items)
    if endpoint == "answer":
        return predictor.answer([q for q, _ in items], [c for _, c in items])
    if endpoint == "tokenize":
        return predictor.tokenize(items, add_special_tokens=options[0])
    if endpoint == "embed_all":
        truncate, direction, prompt_name = options
        return [v.tolist() for v in predictor.token_vectors(items, truncate, direction, prompt_name)]
    if endpoint == "embeddings":  # /v1/embeddings: also each text's tokens for `usage`
        normalize, truncate, direction, prompt_name = options
        vectors, counts = predictor.embed_with_counts(items, "auto", normalize, truncate, direction, prompt_name)
        return list(zip(vectors.tolist(), counts))
    pooling, normalize, truncate, direction, prompt_name = options
    return predictor.embed(items, pooling=pooling, normalize=normalize, truncate=truncate,
                           truncation_direction=direction, prompt_name=prompt_name).tolist()


def _add_probes(app: FastAPI) -> None:
    @app.get("/health", summary="Liveness: the process answers.")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/ready", summary="Readiness: model loaded and a real forward pass done (else 503).")
    async def ready() -> JSONResponse:
        if app.state.ready:
            return JSONResponse({"status": "ready"})
        return JSONResponse(error_body("not_ready", "the model is warming up or shutting down", 503),
                            status_code=503)

    # TEI answers its health check at GET / too, and SageMaker asks GET /ping whether to send traffic.
    app.get("/", summary="Readiness, as /ready (TEI's health check at the root).", operation_id="root_get")(ready)
    app.get("/ping", summary="Readiness, as /ready (SageMaker's health check).")(ready)


def _auth(settings: ServerSettings) -> Any:
    api_key_header = APIKeyHeader(name="X-API-Key", auto_error=False)
    bearer = HTTPBearer(auto_error=False)

    async def check(key: str | None = Depends(api_key_header),
                    token: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:
        if settings.api_key is None:
            return
        given = key or (token.credentials if token is not None else "")
        if not hmac.compare_digest(given.encode("utf-8", "replace"), settings.api_key.encode("utf-8")):
            raise RequestError(401, "unauthorized", "missing or wrong API key; send it as X-API-Key or "
                               "Authorization: Bearer")

    return check


def _submitter(settings: ServerSettings, batcher: MicroBatcher) -> Submit:
    """`submit(key, items, field, paired, names)`: the items' results from the batcher, its refusals as HTTP
    errors. `field` and `paired` name an item in the message of an input over the maximum length: 'texts[3]'
    and " with the query" (`paired` may name the index, "{i}"); or `names` gives each item's name."""
    async def submit(key: tuple, items: list[Any], field: str = "inputs", paired: str = "",
                     names: list[str] | None = None) -> list[Any]:
        try:
            return await batcher.submit(key, items, settings.timeout_s)
        except QueueFullError:
            raise RequestError(429, "queue_full", f"{settings.max_queue} requests are waiting; retry shortly") \
                from None
        except NotRunningError:
            raise RequestError(503, "shutting_down", "the server is shutting down") from None
        except TimeoutError:
            raise RequestError(504, "timeout", f"no result within {settings.timeout_s:g} s; retry with fewer or "
                               "shorter inputs") from None
        except InputTooLongError as exc:  # sent with "truncate": false
            name = names[exc.index] if names else f"'{field}[{exc.index}]'{paired.format(i=exc.index)}"
            raise FieldError(422, "too_many_tokens", f"`{field}` must have less than {exc.maximum} tokens: {name} has "
                             f"{exc.tokens}; shorten it, or send \"truncate\": true to cut it",
                             field) from None

    return submit


def _add_task_routes(app: FastAPI, predictor: Predictor, settings: ServerSettings, batcher: MicroBatcher) -> None:
    limits = settings.limits
    secured = [Depends(_auth(settings))]
    submit = _submitter(settings, batcher)

    if "fill-mask" in predictor.endpoints:
        @app.post("/fill-mask", dependencies=secured, summary="Top-k tokens for every [MASK].")
        async def fill_mask(body: FillMaskRequest) -> dict[str, Any]:
            texts = _as_list(body.inputs)
            check_texts(texts, "inputs", limits)
            missing = [i for i, t in enumerate(texts) if "[MASK]" not in t]
            if missing:
                raise RequestError(422, "no_mask", f"inputs[{missing[0]}] has no [MASK]; mark the token to predict")
            return {"results": await submit(("fill-mask", body.top_k), texts)}

    if "classify" in predictor.endpoints:
        @app.post("/classify", dependencies=secured, summary="Label and probabilities (or a regression score).")
        async def classify(body: ClassifyRequest) -> dict[str, Any]:
            cut = body.direction if body.cuts(settings) else None
            texts = check_texts(_as_list(body.inputs), "inputs", limits, cut)
            pairs = _as_list(body.text_pairs) if body.text_pairs is not None else None
            if pairs is not None:
                pairs = check_texts(pairs, "text_pairs", limits, cut)
                if len(pairs) != len(texts):
                    raise RequestError(422, "invalid_input", f"{len(texts)} inputs but {len(pairs)} text_pairs; "
                                       "send one pair per input")
            second: list[str | None] = list(pairs) if pairs is not None else [None] * len(texts)
            items = list(zip(texts, second))
            key = ("classify", pairs is not None, cut is not None, body.direction)
            return {"results": await submit(key, items, "inputs", "" if pairs is None else " with text_pairs[{i}]")}

    if "tag" in predictor.endpoints:
        @app.post("/tag", dependencies=secured, summary="Entities with character spans.")
        async def tag(body: TagRequest) -> dict[str, Any]:
            texts = _as_list(body.inputs)
            check_texts(texts, "inputs", limits)
            return {"results": await submit(("tag",), texts)}

    if "answer" in predictor.endpoints:
        @app.post("/answer", dependencies=secured, summary="Answer span in the context (or no answer, v2.0); "
                  "a list under `inputs` gets a list of answers under `results`.")
        async def answer(body: AnswerRequest | AnswerBatchRequest) -> dict[str, Any]:
            if isinstance(body, AnswerRequest):
                check_text(body.question, "question", limits)
                check_text(body.context, "context", limits)
                [result] = await submit(("answer",), [(body.question, body.context)])
                return result
            check_count(len(body.inputs), "inputs", limits)
            for i, pair in enumerate(body.inputs):
                check_text(pair.question, f"inputs[{i}].question", limits)
                check_text(pair.context, f"inputs[{i}].context", limits)
            return {"results": await submit(("answer",), [(p.question, p.context) for p in body.inputs])}

    rerank = add_routes(app, predictor, settings, submit, secured)
    add_tei_routes(app, predictor, settings, submit, secured, rerank)


def _error(request: Request, status: int, code: str, message: str, headers: Mapping[str, str] | None = None,
           param: str | None = None, **extra: Any) -> JSONResponse:
    """An error answer in the server's shape, or in OpenAI's under /v1/ (what OpenAI's clients read)."""
    if request.url.path.startswith(OPENAI_PREFIX):
        note_error(code)
        return JSONResponse(openai_error(status, code, message, param), status_code=status, headers=headers)
    note_error(code)
    return JSONResponse(error_body(code, message, status, **extra), status_code=status, headers=headers)


def _add_error_handlers(app: FastAPI, predictor: Predictor) -> None:
    served = served_endpoints(predictor)

    @app.exception_handler(RequestError)
    async def request_error(request: Request, exc: RequestError) -> JSONResponse:
        headers = {"Retry-After": "1"} if exc.status == 429 else None
        if exc.status == 401:
            headers = {"WWW-Authenticate": "Bearer"}
        return _error(request, exc.status, exc.error, exc.message, headers, getattr(exc, "param", None))

    @app.exception_handler(BertkitError)
    async def bertkit_error(request: Request, exc: BertkitError) -> JSONResponse:
        return _error(request, 422, "invalid_input", str(exc))

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        if any(e.get("type") == "json_invalid" for e in errors):
            return _error(request, 400, "invalid_json", "the body is not valid JSON")
        # loc and msg only: pydantic's "input" would echo (possibly huge) request text back.
        details = [{"loc": [str(p) for p in e.get("loc", ())], "msg": str(e.get("msg", ""))} for e in errors[:20]]
        message = "the request does not match the schema (see /docs)"
        where = details[0]["loc"][1:] if details else []  # ["body", field, ...]: the field first
        if request.url.path.startswith(OPENAI_PREFIX) and details:  # OpenAI's shape has no details: say the first
            message += f"; {'.'.join(where) or 'body'}: {details[0]['msg']}"
        return _error(request, 422, "invalid_request", message, param=where[0] if where else None, details=details)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 404:
            why = ""
            if request.url.path == "/rerank" and "classify" in predictor.endpoints:  # a classifier without scores
                why = (f"/rerank needs a classifier with one output or two labels (this one has "
                       f"{len(predictor.labels or [])} labels, none a relevance score); ")
            return _error(request, 404, "not_found", f"{why}this model serves {', '.join(served)}", endpoints=served)
        message = exc.detail if isinstance(exc.detail, str) else "request refused"
        code = "method_not_allowed" if exc.status_code == 405 else "http_error"
        return _error(request, exc.status_code, code, message, exc.headers)

    @app.exception_handler(Exception)
    async def bug(request: Request, exc: Exception) -> JSONResponse:
        log.error("unhandled error on %s", request.url.path, exc_info=exc)
        return _error(request, 500, "internal_error", "internal server error; see the server log")


# --- running ---------------------------------------------------------------------------------------------

def build_server(app: FastAPI, host: str = "127.0.0.1", port: int = 8000, drain_timeout_s: float = 30.0,
                 log_level: str = "info") -> uvicorn.Server:
    """A uvicorn server for `app` with the connection limits of `app.state.settings` (connections.py)."""
    limits = app.state.settings.limits
    events = EventLog()
    guard = ConnectionGuard(limits, fit_file_limit(limits.max_connections), events)
    # uvicorn's hints say int for the drain timeout (it is used as a float by asyncio.wait_for) and a class for
    # http (it calls it with the protocol's arguments, which the partial adds the guard to).
    # With JSON access logs, uvicorn's plain-text access lines would share stdout with them: one format only.
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level,
                            access_log=not app.state.settings.json_access_log,
                            timeout_graceful_shutdown=drain_timeout_s,  # type: ignore[arg-type]
                            server_header=False,
                            http=functools.partial(GuardedH11Protocol, guard),  # type: ignore[arg-type]
                            timeout_keep_alive=limits.keep_alive_timeout_s,
                            h11_max_incomplete_event_size=limits.max_header_bytes)
    return _Server(config, events)


class _Server(uvicorn.Server):
    """uvicorn's server with accept() errors (EMFILE, ...) and per-request protocol warnings logged
    through the rate-limited event log."""

    def __init__(self, config: uvicorn.Config, events: EventLog) -> None:
        super().__init__(config)
        self.events = events
        self.warnings = CountRequestWarnings(events)

    async def startup(self, sockets: list | None = None) -> None:
        handle_accept_errors(asyncio.get_running_loop(), self.events)
        logging.getLogger("uvicorn.error").addFilter(self.warnings)
        await super().startup(sockets)

    async def shutdown(self, sockets: list | None = None) -> None:
        await super().shutdown(sockets)
        logging.getLogger("uvicorn.error").removeFilter(self.warnings)
        self.events.flush()  # the counts of the last interval


def run_server(app: FastAPI, host: str = "127.0.0.1", port: int = 8000, drain_timeout_s: float = 30.0,
               log_level: str = "info") -> None:
    """Serve until SIGINT/SIGTERM; then stop accepting, finish in-flight requests (up to
    `drain_timeout_s`), and return normally so the process exits 0."""
    server = build_server(app, host, port, drain_timeout_s, log_level)
    # uvicorn re-raises the stop signal once drained, into the handler that was installed before it:
    # a no-op one here, because SIGTERM is this server's normal way to stop, not a crash.
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    try:
        server.run()
    finally:
        signal.signal(signal.SIGTERM, previous)
