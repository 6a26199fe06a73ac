"""Connection limits of the HTTP server: header and body read timeouts, a header size limit, a stall
timeout for clients that stop reading their response, a cap on open connections, an open-file limit
that fits the cap, and accept errors (and uvicorn's warnings about malformed requests) logged at most
once per interval.

uvicorn times out idle keep-alive connections but not a client that sends its request slowly, and it
accepts connections until the process runs out of file descriptors; asyncio then logs a traceback for
every failed accept() (up to `backlog` of them per event-loop turn: ~250k log lines in 8 s measured). A
few hundred clients sending a byte at a time thus held the server and stopped it answering /health.

Design decision: a subclass of uvicorn's h11 protocol. After every event it reads h11's state of the
client: while the client owes a request's headers (IDLE) or body (SEND_BODY) one timer runs for that
phase; when it fires the client gets 408 (if it had started the request) and the connection is closed.
While the client does not read our response (the transport's write buffer is full) the body timeout
runs too. The cap is applied when a connection is made: at the cap, the open connection that has waited
longest for its request is closed to make room, so slow clients cannot lock out a prompt one (a prompt
client's request is complete microseconds after it connects); only when every open connection holds a
complete request being answered does the new one get 503 at once. Rejected: uvicorn's
`limit_concurrency` (it answers 503 only once the headers are in, so a slow client still holds its
socket, and it refuses the /health probe too); pausing accept() at the cap (new clients, probes
included, would wait in the kernel's backlog behind the slow ones). Before serving, the soft
RLIMIT_NOFILE is raised to fit the cap (or the cap lowered to fit the hard limit, with a warning). The
cost per request is a timer per phase (benchmarks/serve_load.py: throughput unchanged within noise).
"""

from __future__ import annotations

import asyncio
import collections
import errno
import json
import logging
import os
import time
from http import HTTPStatus
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from bertkit.serve.limits import Limits, error_body

log = logging.getLogger(__name__)

FD_RESERVE = 64
"""File descriptors kept free beyond the cap and the files open at start (logs, model, accept bursts)."""
LOG_INTERVAL_S = 10.0
REFUSE_LINGER_S = 0.5
"""How long a refused connection waits for its request before closing (closing with unread data resets it)."""
ACCEPT_ERRNOS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


class EventLog:
    """Counts connection events (timeouts, evictions, refusals, accept errors) and logs them at most
    once per `interval_s`: the first of a quiet period at once, the rest as one line of counts."""

    def __init__(self, interval_s: float = LOG_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self.counts: collections.Counter[str] = collections.Counter()
        self.window_end = float("-inf")
        self._flush: asyncio.TimerHandle | None = None

    def note(self, event: str) -> None:
        now = time.monotonic()
        if now >= self.window_end and not self.counts:
            log.warning("%s (further connection events are counted and logged every %g s)", event, self.interval_s)
            self.window_end = now + self.interval_s
            return
        self.counts[event] += 1
        if self._flush is None:
            self._flush = asyncio.get_running_loop().call_later(max(self.window_end - now, 0), self.flush)

    def flush(self) -> None:
        self._flush = None
        if self.counts:
            summary = ", ".join(f"{event}: {n}" for event, n in self.counts.most_common())
            log.warning("in the last %g s: %s", self.interval_s, summary)
            self.counts.clear()
            self.window_end = time.monotonic() + self.interval_s


class ConnectionGuard:
    """The open connections of one server and those still waiting for their request, oldest first."""

    def __init__(self, limits: Limits, max_connections: int, events: EventLog | None = None) -> None:
        self.limits, self.max_connections = limits, max_connections
        self.events = events or EventLog()
        self.open: set[GuardedH11Protocol] = set()
        self.waiting: collections.OrderedDict[GuardedH11Protocol, None] = collections.OrderedDict()

    def timeout_s(self, phase: str) -> float:
        return self.limits.header_timeout_s if phase == "headers" else self.limits.body_timeout_s

    def admit(self, connection: GuardedH11Protocol) -> bool:
        """Make room at the cap by closing the longest-waiting unfinished request, else refuse (503)."""
        if len(self.open) >= self.max_connections:
            if not self.waiting:
                self.events.note(f"refused a connection: {self.max_connections} open, all being answered")
                connection.refuse(f"the server holds {self.max_connections} connections that are all being "
                                  "answered; retry shortly")
                return False
            self.events.note(f"closed the slowest unfinished request at the cap of {self.max_connections} "
                             "connections")
            next(iter(self.waiting)).drop(503, "too_many_connections", "closed to make room for a new connection")
        self.open.add(connection)
        return True

    def set_waiting(self, connection: GuardedH11Protocol, waiting: bool) -> None:
        if waiting:
            self.waiting[connection] = None
            self.waiting.move_to_end(connection)
        else:
            self.waiting.pop(connection, None)

    def release(self, connection: GuardedH11Protocol) -> None:
        self.open.discard(connection)
        self.waiting.pop(connection, None)


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with the header/body timers and the cap of a `ConnectionGuard`."""

    def __init__(self, guard: ConnectionGuard, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.guard = guard
        self.phase: str | None = None  # "headers" or "body" while the client owes (part of) a request
        self.timer: asyncio.TimerHandle | None = None
        self.stall: asyncio.TimerHandle | None = None  # runs while the client does not read our response
        self.refused = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if self.guard.admit(self):
            self._watch()

    def data_received(self, data: bytes) -> None:
        if self.refused:  # the 503 is written; closing once the request is read sends the client no reset
            self.transport.close()
            return
        limit = self.guard.limits.max_header_bytes
        if self.phase == "headers" and not _head_ends_within(self.conn.trailing_data[0] + data, limit):
            self.drop(431, "headers_too_large", f"the request line and headers exceed {limit} bytes", started=True)
            return
        super().data_received(data)
        self._watch()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._watch()

    def connection_lost(self, exc: Exception | None) -> None:
        self._enter(None)
        self._unstall()
        self.guard.release(self)
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        """The client stopped reading our response (the write buffer is full): it has the body timeout."""
        super().pause_writing()
        self._unstall()
        seconds = self.guard.limits.body_timeout_s
        self.stall = self.loop.call_later(seconds, self._stalled, seconds)

    def resume_writing(self) -> None:
        super().resume_writing()
        self._unstall()

    def refuse(self, message: str) -> None:
        """Answer 503 at once; close when the request arrives, at the latest after REFUSE_LINGER_S."""
        self.refused = True
        self.transport.write(_raw_response(503, "too_many_connections", message))
        self.timer = self.loop.call_later(REFUSE_LINGER_S, self.transport.close)

    def drop(self, status: int, error: str, message: str, started: bool = False) -> None:
        """Close now; answer `status` first if the client had started a request that has no answer yet."""
        started = started or self.phase == "body" or bool(self.conn.trailing_data[0])
        unanswered = self.phase == "headers" or self.cycle is None or not self.cycle.response_started
        self._enter(None)
        self.guard.release(self)
        if self.transport.is_closing():
            return
        if started and unanswered:
            self.transport.write(_raw_response(status, error, message))
        self.transport.close()

    def _watch(self) -> None:
        """Start the phase timer when h11 says the client owes headers or a body; stop it otherwise."""
        if self.transport.is_closing():
            return
        state = self.conn.their_state
        phase = "headers" if state is h11.IDLE else "body" if state is h11.SEND_BODY else None
        if phase != self.phase:
            self._enter(phase)

    def _enter(self, phase: str | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.guard.set_waiting(self, phase is not None)
        if phase is not None:
            self.timer = self.loop.call_later(self.guard.timeout_s(phase), self._expire, phase)
        self.phase = phase

    def _unstall(self) -> None:
        if self.stall is not None:
            self.stall.cancel()
            self.stall = None

    def _stalled(self, seconds: float) -> None:
        self.guard.events.note(f"closed a connection that read none of its response for {seconds:g} s")
        self.stall = None
        self.guard.release(self)
        self.transport.abort()  # close() would wait for the unread response to be sent

    def _expire(self, phase: str) -> None:
        seconds = self.guard.timeout_s(phase)
        self.guard.events.note(f"closed a connection that sent no complete request {phase} within {seconds:g} s")
        self.drop(408, "request_timeout", f"the request {phase} did not arrive within {seconds:g} s")


def _head_ends_within(received: bytes, limit: int) -> bool:
    """Whether the request line and headers at the start of `received` end (blank line) within `limit`
    bytes, or may still do so; h11's own limit misses headers that arrive whole in one read."""
    return len(received) <= limit or received.find(b"\r\n\r\n", 0, limit) >= 0


def _raw_response(status: int, error: str, message: str) -> bytes:
    """A complete HTTP/1.1 response that closes the connection, written outside the ASGI app."""
    body = json.dumps(error_body(error, message, status)).encode()
    retry = "retry-after: 1\r\n" if status == 503 else ""
    head = (f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n{retry}\r\n")
    return head.encode("ascii") + body


def handle_accept_errors(loop: asyncio.AbstractEventLoop, events: EventLog) -> None:
    """Route accept() failures for lack of resources (EMFILE, ...) through `events`; asyncio already
    retries accepting a second later, but logs a traceback for every failed call."""

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if isinstance(exc, OSError) and exc.errno in ACCEPT_ERRNOS and "accept" in context.get("message", ""):
            events.note(f"accept() failed: {exc.strerror}; retrying in a second")
            return
        loop.default_exception_handler(context)

    loop.set_exception_handler(handler)


class CountRequestWarnings(logging.Filter):
    """A filter for the "uvicorn.error" logger: its one-line-per-request warnings about malformed HTTP
    requests and unsupported upgrades go to `events` (counted) instead of one log line each."""

    PREFIXES = ("Invalid HTTP request received", "Unsupported upgrade request", "No supported WebSocket library")

    def __init__(self, events: EventLog) -> None:
        super().__init__()
        self.events = events

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if not message.startswith(self.PREFIXES):
            return True
        self.events.note(f"uvicorn: {message.split('.')[0].lower()}")
        return False


def fit_file_limit(max_connections: int) -> int:
    """Raise the soft open-file limit so `max_connections` sockets fit beside the files open now (plus
    FD_RESERVE); where the hard limit forbids it, return a cap that fits and say so. POSIX only."""
    try:
        import resource
    except ImportError:  # Windows: no RLIMIT_NOFILE; sockets are not file descriptors there
        return max_connections
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    in_use = len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else 32
    need = max_connections + in_use + FD_RESERVE
    if soft == resource.RLIM_INFINITY or soft >= need:
        return max_connections
    target = need if hard == resource.RLIM_INFINITY else min(need, hard)
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    if target >= need:
        return max_connections
    cap = max(1, target - in_use - FD_RESERVE)
    log.warning("the open-file limit is %d (hard limit; `ulimit -n`), room for %d connections: serving at most "
                "%d instead of --max-connections %d", target, cap, cap, max_connections)
    return cap
