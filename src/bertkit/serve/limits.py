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


class FieldError(RequestError):
    """A refused request that names the request field at fault (OpenAI's `param`)."""

    def __init__(self, status: int, error: str, message: str, param: str) -> None:
        super().__init__(status, error, message)
        self.param = param


def check_count(count: int, field: str, limits: Limits) -> None:
    """400 (TEI's Empty) for no entries, 422 for more than max_inputs."""
    if not count:
        raise RequestError(400, "empty", f"`{field}` cannot be empty; send at least one input")
    if count > limits.max_inputs:
        raise RequestError(422, "too_many_inputs", f"batch size {count} > maximum allowed batch size "
                           f"{limits.max_inputs}: '{field}' has {count} inputs (split the request)")


def check_texts(texts: Sequence[str], field: str, limits: Limits, cut: str | None = None,
                truncatable: bool = True) -> list[str]:
    """The texts, each checked by `check_text` (cut to max_input_chars from the `cut` end, right or left, when
    the request truncates); 400 for none, 422 for more than max_inputs."""
    check_count(len(texts), field, limits)
    return [check_text(text, f"{field}[{i}]" if len(texts) > 1 or field == "inputs" else field, limits, cut,
                       truncatable) for i, text in enumerate(texts)]


def check_text(text: str, field: str, limits: Limits, cut: str | None = None, truncatable: bool = True) -> str:
    """`text` if it is 1..max_input_chars characters of valid Unicode: 400 (TEI's Empty) for "", 422 for a
    lone surrogate, and for a longer text 422, or with `cut` its first (right) or last (left) max_input_chars
    characters, as TEI's auto-truncation cuts a text before tokenizing it. Cutting changes no kept token: a
    piece is at least one character, so max_input_chars characters hold more than a model's maximum tokens.
    `truncatable`: the request has a `truncate` field, so the 422 names it as a fix."""
    if not text:
        raise RequestError(400, "empty", f"`{field}` cannot be empty; send some text")
    if len(text) > limits.max_input_chars:
        if cut is None:
            fix = 'shorten or split it, or send "truncate": true' if truncatable else "shorten or split it"
            raise RequestError(422, "input_too_long", f"'{field}' has {len(text)} characters; the limit is "
                               f"{limits.max_input_chars} ({fix})")
        text = text[:limits.max_input_chars] if cut == "right" else text[-limits.max_input_chars:]
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise RequestError(422, "invalid_text", f"'{field}' contains a lone surrogate (\\ud800-\\udfff) "
                           "that is not valid Unicode text; send UTF-8 text") from None
    return text


def non_json_body(content_type: str | None) -> RequestError | None:
    """The 415 for a body sent without the JSON Content-Type (application/json, application/*+json), e.g. by
    curl's -d, which says application/x-www-form-urlencoded: FastAPI does not read such a body as JSON, so its
    request would fail the schema for no reason it says; None for JSON."""
    media = (content_type or "").split(";")[0].strip().lower()
    if media == "application/json" or (media.startswith("application/") and media.endswith("+json")):
        return None
    sent = f"as {media}" if media else "without a Content-Type"
    return RequestError(415, "unsupported_media_type", f"the body was sent {sent}; send JSON with the header "
                        "Content-Type: application/json (curl: -H 'Content-Type: application/json')")


OPENAI_PREFIX = "/v1/"
"""Under this prefix errors take OpenAI's shape (`openai_error`), which OpenAI's clients read."""


def openai_error(status: int, code: str, message: str, param: str | None = None) -> dict[str, Any]:
    """OpenAI's error body, {"error": {message, type, param, code}}: the `openai` client raises it as the
    APIStatusError subclass of the status, with these four fields as attributes."""
    kind = "server_error" if status >= 500 else "invalid_request_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


TEI_ERROR_TYPES = {400: "Validation", 413: "Validation", 422: "Validation", 424: "Backend", 429: "Overloaded",
                   500: "Backend", 503: "Unhealthy", 504: "Backend"}
"""text-embeddings-inference's `error_type` of each status (router/src/lib.rs ErrorType; Empty is 400's for an
empty input, below); a status TEI never answers (401, 404, 405, 408, 431) is Validation: the request's fault."""


CLIENT_CLOSED = 499
"""nginx's "client closed request": the status counted for a request whose client left before its answer (a
response never started, or its queued inputs dropped)."""


def error_body(error: str, message: str, status: int = 422, **extra: Any) -> dict[str, Any]:
    """The one JSON error shape of the server, TEI's with bertkit's code beside it:
    {"error": message, "error_type": TEI's class, "code": bertkit's code, ...}."""
    kind = "Empty" if error == "empty" else TEI_ERROR_TYPES.get(status, "Validation")
    return {"error": message, "error_type": kind, "code": error, **extra}


class HeadAsGet:
    """ASGI middleware: HEAD on a GET route (/health, /ready, /info, /metrics, /) is answered as GET, without the
    body (the HTTP server drops it for HEAD): a monitor that checks with HEAD sees what GET says, not a 405."""

    def __init__(self, app: ASGIApp, paths: frozenset[str]) -> None:
        self.app, self.paths = app, paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "HEAD" and scope["path"] in self.paths:
            scope = {**scope, "method": "GET"}

            async def headers_only(message: Message) -> None:
                if message["type"] == "http.response.body":
                    message = {**message, "body": b""}
                await send(message)
            await self.app(scope, receive, headers_only)
            return
        await self.app(scope, receive, send)


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
        message = f"the request body exceeds the limit of {self.max_bytes} bytes"
        body = openai_error(413, "body_too_large", message) if scope["path"].startswith(OPENAI_PREFIX) else \
            error_body("body_too_large", message, 413)
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
