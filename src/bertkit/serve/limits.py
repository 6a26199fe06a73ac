"""Limits of the server: per connection (enforced by connections.py) and per request, checked before any
tokenizing: body size (413) and inputs (422).

Design decision: the body limit is an ASGI middleware that reads at most `max_body_bytes + 1` bytes
(trusting neither Content-Length nor chunked encoding) before the framework parses anything, so a
huge body costs no JSON parsing and no memory beyond the limit. Input checks (how many, how long,
valid Unicode) run on the parsed request before the predictor sees it; a text with a lone surrogate
is refused here because it could not be written back as UTF-8 JSON. The `Limits` themselves are settings
(bertkit.settings, each a `bertkit serve` flag), so the command line reads them without starlette.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from bertkit.settings import Limits


class RequestError(Exception):
    """A request the server refuses: HTTP status, a short error code and a message for the client."""

    def __init__(self, status: int, error: str, message: str) -> None:
        super().__init__(message)
        self.status, self.error, self.message = status, error, message


def check_count(count: int, field: str, limits: Limits) -> None:
    """422 unless a request's list `field` has 1..max_inputs entries."""
    if not count:
        raise RequestError(422, "invalid_input", f"'{field}' is empty; send at least one input")
    if count > limits.max_inputs:
        raise RequestError(422, "too_many_inputs", f"'{field}' has {count} inputs; the limit is "
                           f"{limits.max_inputs} per request (split the request)")


def check_texts(texts: Sequence[str], field: str, limits: Limits) -> None:
    """422 unless there are 1..max_inputs texts, each at most max_input_chars, each valid Unicode."""
    check_count(len(texts), field, limits)
    for i, text in enumerate(texts):
        check_text(text, f"{field}[{i}]" if len(texts) > 1 or field == "inputs" else field, limits)


def check_text(text: str, field: str, limits: Limits) -> None:
    if len(text) > limits.max_input_chars:
        raise RequestError(422, "input_too_long", f"'{field}' has {len(text)} characters; the limit is "
                           f"{limits.max_input_chars} (shorten or split it)")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise RequestError(422, "invalid_text", f"'{field}' contains a lone surrogate (\\ud800-\\udfff) "
                           "that is not valid Unicode text; send UTF-8 text") from None


def error_body(error: str, message: str, **extra: Any) -> dict[str, Any]:
    """The one JSON error shape of the server: {"error": code, "message": text, ...}."""
    return {"error": error, "message": message, **extra}


class BodySizeLimit:
    """ASGI middleware: answer 413 to a body over `max_bytes` before the app reads or parses it."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes):
            await self._too_large(scope, receive, send)
            return
        chunks, total = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client left; nothing to answer
            chunk = message.get("body", b"")
            total += len(chunk)
            if total > self.max_bytes:
                await self._too_large(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        await self.app(scope, _replay(b"".join(chunks), receive), send)

    async def _too_large(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = error_body("body_too_large", f"the request body exceeds the limit of {self.max_bytes} bytes")
        await JSONResponse(body, status_code=413, headers={"Connection": "close"})(scope, receive, send)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive() that yields the buffered body once, then defers to the real one (disconnects)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
