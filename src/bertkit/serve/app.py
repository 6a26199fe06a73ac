"""The HTTP layer: a FastAPI app over one predictor, and `run_server` (uvicorn with draining on SIGTERM).

`create_app(predictor, settings, routes=ROUTES)` registers the entries of the route table (bertkit.serve.routes)
that the model serves: task endpoints only for what the checkpoint can do (`Route.needs` against
`predictor.endpoints`), text-embeddings-inference's routes (tei.py), /v1/embeddings, /tokenize, /decode and /info
(compat.py), the probes and /metrics for every model; any other path answers 404 with the list of paths this
model serves. Every response, errors included, is JSON that never
carries a path, a traceback or the request's text; errors have TEI's shape with bertkit's code beside it,
{"error": message, "error_type", "code"} (limits.error_body), except under /v1/, where they take OpenAI's,
{"error": {"message", "type", "param", "code"}}, for OpenAI's clients.

Status codes: 200 ok; 400 an empty input (TEI's Empty), invalid JSON (or HTTP); 401 missing/wrong API key;
404 unknown path; 405 wrong method; 408 request not sent in time; 413 body too large; 415 a body sent with
another Content-Type than JSON (curl's -d without -H 'Content-Type: application/json'); 422 request well-formed
JSON but invalid (types, limits, an input over the model's maximum length sent with "truncate": false, no
[MASK], ...); 429 queue full (Retry-After); 431 headers too large; 500 a server bug (logged; the message says
nothing more); 503 not ready to take it (shutting down, or every connection slot busy); 504 the request's
time limit passed before its result was ready.

The API description is `/openapi.json`; `/docs` (Swagger UI) and `/redoc` read it with scripts and styles
served by this app (DOCS_ASSETS, from the fastapi-offline package), never from a CDN, so they work on a
machine without internet access.

Design decision: the layer is thin. The routes are data (routes.py), the batcher runs each request under the
call its route declares (routing.py); limits are checked before tokenizing (limits.py); slow or
too many connections are handled below the app, in uvicorn's protocol (connections.py); requests are
batched by one worker (microbatch.py); all inference is the predictor's. Requests are plain JSON
validated by pydantic models: nothing from a request is ever unpickled, imported or used as a path.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import hmac
import logging
import signal
import socket
from collections.abc import AsyncIterator, Mapping
from typing import Any, cast

import torch
import uvicorn
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from fastapi_offline import FastAPIOffline
from starlette.exceptions import HTTPException as StarletteHTTPException

from bertkit.errors import BertkitError, ModelFault
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
    HeadAsGet,
    RequestError,
    error_body,
    non_json_body,
    openai_error,
)
from bertkit.serve.microbatch import MicroBatcher
from bertkit.serve.observability import install_observability, note_error
from bertkit.serve.predictor import Predictor
from bertkit.serve.routes import ROUTES
from bertkit.serve.routing import Route, Server, calls, paths, served
from bertkit.settings import ServerSettings, ServeSettings

log = logging.getLogger(__name__)

BODY_PARSE_FAILURE = "There was an error parsing the body"
"""FastAPI's 400 for a body its json.loads failed on other than with a JSONDecodeError (those are 422s)."""
DOCS_ASSETS = "/docs-assets"
"""Where /docs and /redoc load Swagger UI's and ReDoc's scripts, styles and icon from: this app."""


def create_app(predictor: Predictor, settings: ServerSettings | None = None,
               routes: tuple[Route, ...] = ROUTES) -> FastAPI:
    """The ASGI app serving `predictor` at the entries of `routes` it serves; `app.state.ready` turns true after
    a real warm-up forward pass."""
    settings = settings or ServerSettings()
    answered = tuple(served(routes, predictor))
    dispatch = calls(answered)

    def run(key: Any, items: list[Any]) -> list[Any]:  # one predictor call for a group of requests of equal key
        name, *options = cast(tuple[Any, ...], key)  # Server.submit queues (call name, *options) tuples
        return dispatch[name].run(predictor, tuple(options), items)

    batcher = MicroBatcher(run, settings.max_batch_size, settings.max_wait_ms / 1000, settings.max_queue,
                           settings.max_batch_tokens, token_cost(predictor, dispatch))

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
                         swagger_ui_parameters={"validatorUrl": None},  # no badge from swagger.io either
                         redirect_slashes=False)  # /embed/ is a 404 listing the routes: a 307 named the Host sent
    app.state.ready = False
    app.state.failure = None
    app.state.batcher = batcher
    app.state.settings = settings
    app.state.server = Server(predictor, settings, batcher, answered)
    app.state.device = next(predictor.model.parameters(), torch.empty(0)).device.type
    app.add_middleware(BodySizeLimit, max_bytes=settings.limits.max_body_bytes)
    app.add_middleware(HeadAsGet, paths=frozenset(route.path for route in answered if route.method == "GET"))
    _add_error_handlers(app, predictor, routes, answered)
    secured = [Depends(_auth(settings))]
    for route in answered:
        app.add_api_route(route.path, route.handler, methods=[route.method], summary=route.summary,
                          dependencies=secured if route.secured else None, operation_id=route.operation_id)
    install_observability(app, settings, batcher, answered)
    return app


async def _warm_up(app: FastAPI, batcher: MicroBatcher, predictor: Predictor) -> None:
    """A real forward pass through every endpoint; ready only if it answers (a model that computes NaN, or fails
    outright, stays not ready and /ready says why)."""
    try:
        await batcher.call(predictor.warmup)
    except Exception as exc:  # noqa: BLE001 - whatever stops the warm-up keeps the server out of rotation
        app.state.failure = str(exc) if isinstance(exc, (ModelFault, BertkitError)) else repr(exc)
        log.error("the warm-up pass failed, so the server is not ready: %s", app.state.failure)
        return
    app.state.ready = True
    log.info("model warmed up; ready")


def _auth(settings: ServerSettings) -> Any:
    api_key_header = APIKeyHeader(name="X-API-Key", auto_error=False)
    bearer = HTTPBearer(auto_error=False)

    async def check(key: str | None = Depends(api_key_header),
                    token: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:
        if settings.api_key is None:
            return
        given = key or (token.credentials if token is not None else "")
        if not _key_matches(settings, given):
            raise _unauthorized()

    return check


def _unauthorized() -> RequestError:
    """A new 401 each time (a shared exception instance would collect every raise's traceback)."""
    return RequestError(401, "unauthorized", "missing or wrong API key; send it as X-API-Key or "
                        "Authorization: Bearer")


def _key_matches(settings: ServerSettings, given: str) -> bool:
    """Whether `given` is --api-key (compared in constant time), or no key is required."""
    return settings.api_key is None or hmac.compare_digest(given.encode("utf-8", "replace"),
                                                           settings.api_key.encode("utf-8"))


def _refused_key(request: Request, secured: set[str]) -> bool:
    """Whether `request`, to a route behind --api-key, lacks the key (read from the headers as the route's own
    check reads them: X-API-Key, else Authorization: Bearer): for a body refused before that check runs (FastAPI
    parses the body first), so a client without the key learns no more than 401."""
    route = request.scope.get("route")
    if getattr(route, "path", request.url.path) not in secured:
        return False
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    given = request.headers.get("x-api-key") or (token.strip() if scheme.lower() == "bearer" else "")
    return not _key_matches(request.app.state.settings, given)


def _error(request: Request, status: int, code: str, message: str, headers: Mapping[str, str] | None = None,
           param: str | None = None, **extra: Any) -> JSONResponse:
    """An error answer in the server's shape, or in OpenAI's under /v1/ (what OpenAI's clients read)."""
    if request.url.path.startswith(OPENAI_PREFIX):
        note_error(code)
        return JSONResponse(openai_error(status, code, message, param), status_code=status, headers=headers)
    note_error(code)
    return JSONResponse(error_body(code, message, status, **extra), status_code=status, headers=headers)


def _add_error_handlers(app: FastAPI, predictor: Predictor, routes: tuple[Route, ...],
                        answered: tuple[Route, ...]) -> None:
    served_paths = paths(answered)
    refusals = {route.path: route.refusal for route in routes if route.refusal and route not in answered}
    secured = {route.path for route in answered if route.secured}

    @app.exception_handler(RequestError)
    async def request_error(request: Request, exc: RequestError) -> JSONResponse:
        headers = {"Retry-After": "1"} if exc.status == 429 else None
        if exc.status == 401:
            headers = {"WWW-Authenticate": "Bearer"}
        return _error(request, exc.status, exc.error, exc.message, headers, getattr(exc, "param", None))

    @app.exception_handler(ModelFault)
    async def model_fault(request: Request, exc: ModelFault) -> JSONResponse:
        return _error(request, 500, "non_finite_output", str(exc))

    @app.exception_handler(BertkitError)
    async def bertkit_error(request: Request, exc: BertkitError) -> JSONResponse:
        return _error(request, 422, "invalid_input", str(exc))

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        if _refused_key(request, secured):
            return await request_error(request, _unauthorized())
        if not await request.body():  # pydantic would say "body: Field required", which reads as a missing field,
            # and with no Content-Type the refusal below would blame the header of a body never sent
            return _error(request, 400, "invalid_json", "the body is empty; send a JSON object (see /docs for this "
                          "route's fields), with its Content-Length or chunked")
        refused = non_json_body(request.headers.get("content-type"))  # then the body was not read as JSON at all
        if refused is not None:
            return _error(request, refused.status, refused.error, refused.message)
        errors = exc.errors()
        if any(e.get("type") == "json_invalid" for e in errors):
            return _error(request, 400, "invalid_json", "the body is not valid JSON")
        # loc and msg only: pydantic's "input" would echo (possibly huge) request text back.
        fields = [[str(p) for p in e.get("loc", ())] for e in errors[:20]]
        reasons = [str(e.get("msg", "")) for e in errors[:20]]
        details = [{"loc": loc, "msg": msg} for loc, msg in zip(fields, reasons)]
        message = "the request does not match the schema (see /docs)"
        where = _field(fields[0]) if fields else []
        if fields:  # the first field in the message too: OpenAI's shape has no details, TEI's clients show `error`
            why = dict.fromkeys(msg for loc, msg in zip(fields, reasons) if _field(loc) == where)  # each union member
            message += f"; {'.'.join(where) or 'body'}: {' / '.join(why)}"
        return _error(request, 422, "invalid_request", message, param=where[0] if where else None, details=details)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 404:
            refusal = refusals.get(request.url.path)
            why = refusal(predictor) if refusal is not None else ""
            return _error(request, 404, "not_found", f"{why}this model serves {', '.join(served_paths)}",
                          endpoints=served_paths)
        if exc.status_code == 400 and exc.detail == BODY_PARSE_FAILURE and _refused_key(request, secured):
            return await request_error(request, _unauthorized())
        if exc.status_code == 400 and exc.detail == BODY_PARSE_FAILURE:  # json.loads failed with other than a
            # JSONDecodeError: a number past Python's digit limit, nesting past its recursion, bytes not UTF-8
            return _error(request, 400, "invalid_json", f"the body is not valid JSON{_parse_failure(exc.__cause__)}")
        message = exc.detail if isinstance(exc.detail, str) else "request refused"
        code = "method_not_allowed" if exc.status_code == 405 else "http_error"
        return _error(request, exc.status_code, code, message, exc.headers)

    @app.exception_handler(Exception)
    async def bug(request: Request, exc: Exception) -> JSONResponse:
        log.error("unhandled error on %s", request.url.path, exc_info=exc)
        return _error(request, 500, "internal_error", "internal server error; see the server log")


def _field(loc: list[str]) -> list[str]:
    """The request field of a validation error's location ["body", field, ...], without the union member pydantic
    appends ("str", "list[int]")."""
    parts = loc[1:]
    for i, part in enumerate(parts):
        if "[" in part or part in ("str", "int", "float", "bool", "list", "dict", "none"):
            return parts[:i]
    return parts


def _parse_failure(cause: BaseException | None) -> str:
    """Why json.loads failed other than with a JSONDecodeError, in the client's terms (not Python's advice)."""
    if isinstance(cause, RecursionError):
        return " (it is nested too deeply)"
    if isinstance(cause, UnicodeDecodeError):
        return " (its bytes are not UTF-8 text)"
    if isinstance(cause, ValueError) and "digits" in str(cause):
        return " (a number in it has too many digits; send it as a string or a float)"
    return f" ({type(cause).__name__})" if cause is not None else ""


# --- running ---------------------------------------------------------------------------------------------

def build_server(app: FastAPI, settings: ServeSettings) -> uvicorn.Server:
    """A uvicorn server for `app` at `settings.host`/`port` with the connection limits of `app.state.settings`
    (connections.py)."""
    limits = app.state.settings.limits
    events = EventLog()
    guard = ConnectionGuard(limits, fit_file_limit(limits.max_connections), events)
    # uvicorn's hints say int for the drain timeout (it is used as a float by asyncio.wait_for) and a class for
    # http (it calls it with the protocol's arguments, which the partial adds the guard to).
    # With JSON access logs, uvicorn's plain-text access lines would share stdout with them: one format only.
    config = uvicorn.Config(app, host=settings.host, port=settings.port, log_level=settings.log_level,
                            access_log=not app.state.settings.json_access_log,
                            timeout_graceful_shutdown=settings.drain_timeout_s,  # type: ignore[arg-type]
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


def run_server(app: FastAPI, settings: ServeSettings) -> None:
    """Serve at `settings.host`/`port` until SIGINT/SIGTERM; then stop accepting, finish in-flight requests (up
    to `settings.drain_timeout_s`), and return normally so the process exits 0."""
    server = build_server(app, settings)
    # uvicorn re-raises the stop signal once drained, into the handler that was installed before it:
    # a no-op one here, because SIGTERM is this server's normal way to stop, not a crash.
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    try:
        server.run()
    finally:
        signal.signal(signal.SIGTERM, previous)


def check_port_free(host: str, port: int) -> None:
    """A one-line BertkitError naming --port (or --host) when the server could not listen at `host`:`port`
    (another server holds it, a privileged port, a host that names no address here): said before the model loads,
    where uvicorn would say it after the "serving ... on" line. Every address is bound as asyncio's create_server
    (uvicorn's) binds it - SO_REUSEADDR, IPv6 sockets IPv6-only, "" every interface, an address family this
    machine lacks skipped - then released; port 0 (any free port) is not checked."""
    if port == 0:
        return
    try:
        addresses = dict.fromkeys((family, kind, proto, address) for family, kind, proto, _, address in
                                  socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                                     flags=socket.AI_PASSIVE))
    except socket.gaierror as exc:
        raise BertkitError(f"--host {host}: not an address to listen on ({exc.strerror}); e.g. 127.0.0.1 or "
                           "0.0.0.0") from None
    for family, kind, proto, address in addresses:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                probe.bind(address)
            except OSError as exc:
                if exc.errno == errno.EADDRNOTAVAIL:
                    continue  # (asyncio skips it too: that family is not enabled here)
                raise _port_refusal(host, port, exc) from None


def _port_refusal(host: str, port: int, exc: OSError) -> BertkitError:
    if exc.errno == errno.EADDRINUSE:
        return BertkitError(f"--port {port}: {host}:{port} is in use (another server?); stop it or choose another "
                            "--port")
    if exc.errno == errno.EACCES:
        return BertkitError(f"--port {port}: not allowed to listen on {host}:{port} (ports below 1024 need "
                            "privileges); choose another --port")
    return BertkitError(f"--host {host} --port {port}: cannot listen there ({exc.strerror})")
