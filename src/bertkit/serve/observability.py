"""What the server tells its operators: Prometheus metrics at /metrics, a request id on every response,
and opt-in JSON access logs (`--json-access-log`).

`install_observability(app, settings, batcher, routes)` adds all three to an app (bertkit.serve.app.create_app):

- `GET /metrics` (`metrics_page`, an entry of bertkit.serve.routes), Prometheus' text format from a registry of
  the app's own (`app.state.metrics`), so several apps in one process (the tests) keep separate counts:
  requests and their latency by route template, method and status; for each predictor call (label `call`:
  the route table's call names, embed, classify, fill-mask, tag, answer, ...) the queue time, batch size in
  inputs and in tokens, tokens run and inference time; the queue
  depth; and the process, platform and garbage-collector collectors of prometheus-client.
  docs/_serve_operations_draft.md lists every metric with its meaning.
- `X-Request-ID` on every response: the request's own header when it is 1-128 visible ASCII characters
  (so it is safe to echo and to log), else a new random id.
- With `json_access_log`, one JSON object per request on the `bertkit.access` logger: time, request_id,
  method, path, status, duration_ms, inputs and tokens queued for the model, client, trace_id; uvicorn's
  own plain-text access lines are then off, so stdout carries JSON lines only.
- text-embeddings-inference's (TEI 1.9) names beside bertkit's, so its dashboards and alerts work unchanged:
  the counters te_request_count{method}, te_request_success{method}, te_request_failure{err} (of the routes the
  table marks `counted`, the ones that run the model; written as TEI's exporter writes them, without
  prometheus_client's `_total`), the histograms te_request_duration,
  te_request_tokenization_duration, te_request_queue_duration, te_request_inference_duration,
  te_request_input_length, te_batch_next_size, te_batch_next_tokens, the gauge te_queue_size; and on every
  answer that ran the model TEI's headers x-compute-type, x-compute-time, x-compute-characters,
  x-compute-tokens, x-total-time, x-tokenization-time, x-queue-time, x-inference-time (milliseconds).
- A valid W3C `traceparent` header is honoured: the answer carries a `traceparent` of the same trace with
  this server's span id, and the access log line its trace_id (an invalid one is ignored, as the spec says).

Design decisions:

- One ASGI wrapper around the whole app, outside even Starlette's error middleware (which answers 500s),
  so every response is counted, timed, logged and carries its id: the 413s of the body limit and the 500s
  of bugs too. A response never started (the client left) counts as status 499, nginx's "client closed".
- Labels are the route template (`/embed`), never the raw path: a scanner trying a million paths adds one
  `unmatched` series, not a million; raw paths appear only in the access log.
- /metrics needs no API key, as TEI's and most exporters' do: it shows counts and timings, never request
  text; keep it off the public network with the server's address (`--host`) or a proxy.
- Inputs and tokens reach the access log through a context variable set for each request: the batcher
  reports each submitted request in the context of the request that submitted it.
"""

from __future__ import annotations

import collections
import contextvars
import json
import logging
import re
import secrets
import sys
import time
import uuid
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import ClassVar

from fastapi import FastAPI, Request, Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from bertkit.serve.limits import CLIENT_CLOSED
from bertkit.serve.microbatch import BatchRecord, MicroBatcher, RequestTiming
from bertkit.serve.routing import Route, calls
from bertkit.settings import ServerSettings

ACCESS_LOG = "bertkit.access"
REQUEST_ID_HEADER = "X-Request-ID"
_VALID_REQUEST_ID = re.compile(r"[\x21-\x7e]{1,128}")  # visible ASCII: no spaces, no control characters
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")  # W3C Trace Context

SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
INPUTS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
TOKENS = (16, 64, 256, 1024, 2048, 4096, 8192, 16384, 32768, 65536)


@dataclass
class _Exchange:
    """What one request queued for the model, filled in by the batcher's `submitted`."""

    inputs: int = 0
    tokens: int = 0
    timing: RequestTiming | None = None
    """Where its time went (summed over its predictor calls); None for a request that ran no model."""
    error: str | None = None
    """The code of the error it was answered (app.py's handlers, through `note_error`)."""
    batch: bool | None = None
    """Whether its body held a list of inputs (TEI's method="batch"), as the route read it (`note_batch`);
    None: more than one input queued."""


def note_batch(batch: bool) -> None:
    """Record whether the current request's body held a list of inputs (its te_request_* method label)."""
    exchange = _exchange.get()
    if exchange is not None:
        exchange.batch = batch


def note_error(code: str) -> None:
    """Record the error code the current request is answered with (its te_request_failure label)."""
    exchange = _exchange.get()
    if exchange is not None:
        exchange.error = code


_exchange: contextvars.ContextVar[_Exchange | None] = contextvars.ContextVar("bertkit_exchange", default=None)


def install_observability(app: FastAPI, settings: ServerSettings, batcher: MicroBatcher,
                          routes: Iterable[Route]) -> None:
    """Add the metrics that /metrics shows (of `routes`, the app's), X-Request-ID and (with
    `settings.json_access_log`) access logs to `app`; call it after the routes are added, before the app starts."""
    registry = CollectorRegistry()
    for collector in (ProcessCollector, PlatformCollector, GCCollector):
        collector(registry=registry)
    routes = tuple(routes)
    metrics = _Metrics(registry, batcher, {route.path for route in routes if route.counted},
                       {name for name, call in calls(routes).items() if not call.runs_model})
    batcher.observers.append(metrics)
    app.state.metrics = metrics

    access_log = _access_logger() if settings.json_access_log else None
    build = app.build_middleware_stack
    # Starlette builds its middleware stack at the first request; wrapping what it builds puts the
    # observer outside the error middleware, so 500s get an id and are counted (app.add_middleware is inside).
    compute_type = "gpu" if getattr(app.state, "device", "cpu") == "cuda" else "cpu"  # TEI's x-compute-type
    app.build_middleware_stack = lambda: _Observer(build(), app, metrics, access_log,  # type: ignore[method-assign]
                                                   compute_type)


async def metrics_page(request: Request) -> Response:
    """GET /metrics: the app's registry and TEI's counters, in Prometheus' text format."""
    metrics: _Metrics = request.app.state.metrics
    return Response(generate_latest(metrics.registry) + metrics.tei_counters.render(), media_type=CONTENT_TYPE_LATEST)


class _Metrics:
    """The server's Prometheus metrics, and the batcher's observer that feeds the batch ones."""

    def __init__(self, registry: CollectorRegistry, batcher: MicroBatcher, counted: set[str],
                 model_free: set[str]) -> None:
        self.registry = registry
        self.counted = counted
        """The route templates of requests that run the model: TEI's te_request_* count these."""
        self.model_free = model_free
        """The calls that run no model (the tokenizer's): no te_request_input_length, no TEI timing."""
        http = ("endpoint", "method", "status")
        self.requests = Counter("bertkit_requests", "HTTP requests answered, by route template, method and status.",
                                http, registry=registry)
        self.latency = Histogram("bertkit_request_duration_seconds", "Seconds from a request's arrival to the end "
                                 "of its response.", http, buckets=SECONDS, registry=registry)
        self.queue = Histogram("bertkit_queue_seconds", "Seconds a request waited from its submission to the start "
                               "of its first batch.", ("call",), buckets=SECONDS, registry=registry)
        self.inputs = Histogram("bertkit_batch_inputs", "Inputs in one predictor call.", ("call",), buckets=INPUTS,
                                registry=registry)
        self.batch_tokens = Histogram("bertkit_batch_tokens", "Tokens in one predictor call (the sum over its "
                                      "inputs).", ("call",), buckets=TOKENS, registry=registry)
        self.tokens = Counter("bertkit_tokens", "Tokens run through the model.", ("call",), registry=registry)
        self.inference = Histogram("bertkit_batch_inference_seconds", "Seconds of one predictor call (tokenizing, "
                                   "the model, decoding).", ("call",), buckets=SECONDS, registry=registry)
        depth = Gauge("bertkit_queue_depth", "Requests waiting for the model.", registry=registry)
        depth.set_function(lambda: batcher.queued)
        self.tei_counters = _Counters()
        self.tei = {name: Histogram(name, text, buckets=buckets, registry=registry) for name, text, buckets in (
            ("te_request_duration", "TEI: seconds of a request that ran the model.", SECONDS),
            ("te_request_tokenization_duration", "TEI: seconds counting a request's tokens.", SECONDS),
            ("te_request_queue_duration", "TEI: seconds a request waited for its first batch.", SECONDS),
            ("te_request_inference_duration", "TEI: seconds from a request's first batch to its last result.",
             SECONDS),
            ("te_request_input_length", "TEI: tokens of each input.", TOKENS),
            ("te_batch_next_size", "TEI: inputs in one predictor call.", INPUTS),
            ("te_batch_next_tokens", "TEI: tokens in one predictor call.", TOKENS))}
        queue_size = Gauge("te_queue_size", "TEI: requests waiting for the model.", registry=registry)
        queue_size.set_function(lambda: batcher.queued)

    def submitted(self, key: Hashable, costs: Sequence[int]) -> None:
        exchange = _exchange.get()
        if exchange is not None:
            exchange.inputs += len(costs)
            exchange.tokens += sum(costs)
        if self._runs_model(key):
            for cost in costs:
                self.tei["te_request_input_length"].observe(cost)

    def completed(self, key: Hashable, timing: RequestTiming) -> None:
        exchange = _exchange.get()
        if exchange is not None and self._runs_model(key):
            before = exchange.timing or RequestTiming(0.0, 0.0, 0.0, 0)
            exchange.timing = RequestTiming(before.tokenization + timing.tokenization, before.queue + timing.queue,
                                            before.inference + timing.inference, before.characters + timing.characters)

    def _runs_model(self, key: Hashable) -> bool:
        """Whether a batcher key's calls run the model (/tokenize's only tokenize)."""
        return not (isinstance(key, tuple) and key and key[0] in self.model_free)

    def ran(self, batch: BatchRecord) -> None:
        call = str(batch.key[0] if isinstance(batch.key, tuple) and batch.key else batch.key)
        for wait in batch.queue_waits:
            self.queue.labels(call).observe(wait)
        self.inputs.labels(call).observe(batch.inputs)
        self.batch_tokens.labels(call).observe(batch.tokens)
        self.tokens.labels(call).inc(batch.tokens)
        self.inference.labels(call).observe(batch.seconds)
        self.tei["te_batch_next_size"].observe(batch.inputs)
        self.tei["te_batch_next_tokens"].observe(batch.tokens)

    def answered(self, endpoint: str, method: str, status: int, seconds: float, exchange: _Exchange) -> None:
        labels = (endpoint, method, str(status))
        self.requests.labels(*labels).inc()
        self.latency.labels(*labels).observe(seconds)
        if endpoint not in self.counted or method != "POST" or status in (401, 404, 405):
            return  # TEI counts the requests its handlers take: not probes, wrong methods or refused keys
        batch = exchange.batch if exchange.batch is not None else exchange.inputs > 1
        kind = "batch" if batch else "single"
        self.tei_counters.inc("te_request_count", method=kind)
        if status == 200:
            self.tei_counters.inc("te_request_success", method=kind)
            self.tei["te_request_duration"].observe(seconds)
            if exchange.timing is not None:
                self.tei["te_request_tokenization_duration"].observe(exchange.timing.tokenization)
                self.tei["te_request_queue_duration"].observe(exchange.timing.queue)
                self.tei["te_request_inference_duration"].observe(exchange.timing.inference)
        else:
            self.tei_counters.inc("te_request_failure", err=_failure_label(status, exchange.error))


def _failure_label(status: int, code: str | None) -> str:
    """TEI's `err` label of a failed request: batch_size, tokenization (an input over the maximum length),
    overloaded, inference (5xx) or validation."""
    if code == "too_many_inputs":
        return "batch_size"
    if code == "too_many_tokens":
        return "tokenization"
    if status in (429, 503):
        return "overloaded"
    return "inference" if status >= 500 else "validation"


class _Counters:
    """Counters written as TEI's exporter (metrics-exporter-prometheus) writes them: `name{labels} value`, no
    `_total` suffix (prometheus_client would add one, and TEI's dashboards query the bare name)."""

    HELP: ClassVar[dict[str, str]] = {"te_request_count": "TEI: requests that run the model.",
                                      "te_request_success": "TEI: such requests answered 200.",
                                      "te_request_failure": "TEI: such requests refused or failed, by cause."}

    def __init__(self) -> None:
        self.values: collections.Counter[tuple[str, tuple[tuple[str, str], ...]]] = collections.Counter()

    def inc(self, name: str, **labels: str) -> None:
        self.values[(name, tuple(sorted(labels.items())))] += 1

    def render(self) -> bytes:
        lines = []
        for name, text in self.HELP.items():
            samples = sorted((labels, value) for (metric, labels), value in list(self.values.items()) if metric == name)
            if samples:
                lines += [f"# HELP {name} {text}", f"# TYPE {name} counter"]
                lines += [f'{name}{{{",".join(f"{k}={json.dumps(v)}" for k, v in labels)}}} {value}'
                          for labels, value in samples]
        return ("\n".join(lines) + "\n").encode() if lines else b""


class _Observer:
    """ASGI wrapper: request id in and out, metrics and the access log of every HTTP request."""

    def __init__(self, inner: ASGIApp, app: FastAPI, metrics: _Metrics, access_log: logging.Logger | None,
                 compute_type: str = "cpu") -> None:
        self.inner, self.app, self.metrics, self.access_log = inner, app, metrics, access_log
        self.compute_type = compute_type

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.inner(scope, receive, send)
            return
        arrived, began = time.time(), time.perf_counter()
        request_id = _request_id(scope)
        trace = _trace(scope)
        endpoint = _route_template(self.app, scope)
        exchange, status = _Exchange(), CLIENT_CLOSED
        token = _exchange.set(exchange)

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"x-request-id"]
                headers += [(b"x-request-id", request_id.encode("ascii")), *self._tei_headers(exchange, began)]
                if trace is not None:
                    headers.append((b"traceparent", trace.encode("ascii")))
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.inner(scope, receive, send_with_id)
        finally:
            _exchange.reset(token)
            seconds = time.perf_counter() - began
            self.metrics.answered(endpoint, scope["method"], status, seconds, exchange)
            if self.access_log is not None:
                trace_id = trace.split("-")[1] if trace is not None else None
                self.access_log.info(_access_line(scope, request_id, status, arrived, seconds, exchange, trace_id))

    def _tei_headers(self, exchange: _Exchange, began: float) -> list[tuple[bytes, bytes]]:
        """TEI's x-* headers (times in whole milliseconds) for an answer that ran the model."""
        timing = exchange.timing
        if timing is None:
            return []
        total = str(int((time.perf_counter() - began) * 1000)).encode()
        values = {"x-compute-type": self.compute_type.encode(), "x-compute-time": total,
                  "x-compute-characters": str(timing.characters).encode(),
                  "x-compute-tokens": str(exchange.tokens).encode(),
                  "x-total-time": total, "x-tokenization-time": str(int(timing.tokenization * 1000)).encode(),
                  "x-queue-time": str(int(timing.queue * 1000)).encode(),
                  "x-inference-time": str(int(timing.inference * 1000)).encode()}
        return [(name.encode(), value) for name, value in values.items()]


def _trace(scope: Scope) -> str | None:
    """The traceparent to answer: the request's trace and flags with a new span id of this server, or None
    without a valid traceparent (version 00 format; trace and parent ids not all zeros)."""
    for name, value in scope["headers"]:
        if name.lower() == b"traceparent":
            match = _TRACEPARENT.fullmatch(value.decode("latin-1").strip())  # lowercase hex only, as the spec says
            if match is None or match[1] == "ff" or set(match[2]) == {"0"} or set(match[3]) == {"0"} \
                    or (match[1] == "00" and match[5]):  # version 00 has exactly four fields; later ones may add
                return None
            return f"00-{match[2]}-{secrets.token_hex(8)}-{match[4]}"
    return None


def _request_id(scope: Scope) -> str:
    """The client's X-Request-ID when it is valid, else a new one."""
    for name, value in scope["headers"]:
        if name.lower() == b"x-request-id":
            given = value.decode("latin-1")
            return given if _VALID_REQUEST_ID.fullmatch(given) else uuid.uuid4().hex
    return uuid.uuid4().hex


def _route_template(app: FastAPI, scope: Scope) -> str:
    """The path of the route that serves `scope` (`/embed`, `/docs-assets`), or `unmatched`."""
    partial = None
    for route in app.router.routes:
        match, _ = route.matches(scope)
        if match == Match.FULL:
            return str(getattr(route, "path", "unmatched"))
        if match == Match.PARTIAL and partial is None:  # the path exists, not with this method (405)
            partial = str(getattr(route, "path", "unmatched"))
    return partial or "unmatched"


def _access_line(scope: Scope, request_id: str, status: int, arrived: float, seconds: float,
                 exchange: _Exchange, trace_id: str | None = None) -> str:
    client = scope.get("client")
    return json.dumps({
        "time": datetime.fromtimestamp(arrived, UTC).isoformat(timespec="milliseconds"),
        "request_id": request_id, "method": scope["method"], "path": scope["path"], "status": status,
        "duration_ms": round(seconds * 1000, 3), "inputs": exchange.inputs, "tokens": exchange.tokens,
        "client": client[0] if client else None, "trace_id": trace_id,
    }, ensure_ascii=True)


def _access_logger() -> logging.Logger:
    """The `bertkit.access` logger at INFO; without handlers of its own it prints bare JSON lines to stdout
    (not through the root logger, whose format would prefix them)."""
    logger = logging.getLogger(ACCESS_LOG)
    logger.setLevel(logging.INFO)
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
        logger.propagate = False
    return logger

