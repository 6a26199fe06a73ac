"""The settings of `bertkit serve`: per-connection and per-request limits, how the app batches and queues, and
what is served where."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from bertkit.errors import BertkitError
from bertkit.settings.fields import InferencePrecision, Settings, TorchThreads

# --- serving (bertkit serve) ---------------------------------------------------------------------------

LOG_LEVELS = ("debug", "info", "warning", "error")
"""The values of `bertkit serve --log-level`."""


@dataclass(frozen=True)
class Limits(Settings):
    """Per-connection and per-request limits of the server (each one is a `bertkit serve` flag;
    enforced by bertkit.serve.limits and bertkit.serve.connections)."""

    max_body_bytes: int = dataclasses.field(default=1_048_576, metadata={"min": 64})
    """Largest request body accepted (413 above it)."""
    max_inputs: int = dataclasses.field(default=64, metadata={"min": 1})
    """Most texts (or question/context pairs) in one request (422 above it)."""
    max_input_chars: int = dataclasses.field(default=20_000, metadata={"min": 1})
    """Most characters in one text, question or context (422 above it)."""
    max_connections: int = dataclasses.field(default=1000, metadata={"min": 1})
    """Most open connections; past it a new one replaces the slowest unfinished request, else gets 503."""
    header_timeout_s: float = dataclasses.field(default=10.0, metadata={"min": 0.01, "flag": "--header-timeout"})
    """Seconds a client has to send a request's headers, from connecting or from its previous response (408
    past it)."""
    body_timeout_s: float = dataclasses.field(default=30.0, metadata={"min": 0.01, "flag": "--body-timeout"})
    """Seconds a client has to send a request's body once its headers are in (408 past it)."""
    keep_alive_timeout_s: float = dataclasses.field(default=5.0, metadata={"min": 0.01,
                                                                           "flag": "--keep-alive-timeout"})
    """Seconds an idle keep-alive connection stays open between requests."""
    max_header_bytes: int = dataclasses.field(default=16_384, metadata={"min": 1024})
    """Largest request line + headers (431 above it)."""
    max_token_vectors: int = dataclasses.field(default=4096, metadata={"min": 1})
    """Most token vectors one /embed_all request is answered (its inputs' tokens as the model reads them, specials
    included; 422 above it): each is hidden-size numbers of JSON, so this bounds the answer a request can make the
    server build (4,096 at bert-base's width: about 30 MB)."""
    max_tokenize_tokens: int = dataclasses.field(default=131_072, metadata={"min": 1})
    """Most tokens one /tokenize request is answered (its inputs' pieces, specials included; 422 above it): each is
    an object of about 100 bytes of JSON, so this bounds the answer (131,072: about 13 MB)."""


@dataclass(frozen=True)
class ServerSettings(Settings):
    """How the server batches, queues and limits requests (each field is a `bertkit serve` flag;
    bertkit.serve.app.create_app)."""

    limits: Limits = dataclasses.field(default_factory=Limits)
    max_batch_size: int = dataclasses.field(default=32, metadata={"min": 1})
    """Most inputs in one predictor call."""
    max_wait_ms: float = dataclasses.field(default=5.0, metadata={"min": 0})
    """How long the worker waits for more requests to gather into one batch."""
    max_queue: int = dataclasses.field(default=256, metadata={"min": 1})
    """Most requests waiting for the model; more are answered 429."""
    timeout_s: float = dataclasses.field(default=30.0, metadata={"min": 0.01, "flag": "--timeout"})
    """Per-request time limit in seconds, from arrival to result (504 past it)."""
    api_key: str | None = None
    """Require this key (X-API-Key or Authorization: Bearer) on task endpoints (else 401)."""
    max_batch_tokens: int = dataclasses.field(default=16_384, metadata={"min": 1})
    """Most tokens in one predictor call, the sum of its inputs' tokens (an input over it runs alone)."""
    auto_truncate: bool = True
    """Cut an input longer than the model's maximum (and a text over --max-input-chars) when a request does
    not say `truncate`, as text-embeddings-inference 1.9 does; --no-auto-truncate refuses it (422)."""
    normalize: bool = True
    """Unit-length vectors from /embed when a request does not say `normalize`, and from /v1/embeddings, as
    text-embeddings-inference; --no-normalize: the directory's own (a sentence-transformers Normalize module,
    else raw)."""
    json_access_log: bool = False
    """Log one JSON object per request on the `bertkit.access` logger (to stdout unless that logger has
    handlers of its own)."""

    def check(self) -> None:
        if self.api_key is not None and not self.api_key.strip():
            # An empty key would match requests that send none: authentication silently off.
            raise BertkitError("--api-key (or BERTKIT_API_KEY) is empty; give a non-empty key, or leave it "
                               "unset to serve without one")


@dataclass
class ServeSettings(InferencePrecision, TorchThreads):
    """What `bertkit serve` serves and where, beside the ServerSettings of the app
    (bertkit.serve.predictor.load_predictor, bertkit.serve.app.run_server)."""

    model: Path = dataclasses.field(metadata={"path": "any"})  # checked by check_model_directory
    """Checkpoint directory; endpoints follow from bertkit_task.json / config.json."""
    tokenizer: Path | None = dataclasses.field(default=None, metadata={"path": "dir", "exists": True})
    """Tokenizer directory to use instead of the model's (the model's own vocabulary, no more tokens than
    its vocab_size)."""
    host: str = "127.0.0.1"
    """Interface to bind; 0.0.0.0 exposes the server to the network."""
    port: int = dataclasses.field(default=8000, metadata={"min": 0, "max": 65535})
    """TCP port."""
    drain_timeout_s: float = dataclasses.field(default=30.0, metadata={"min": 0, "flag": "--drain-timeout"})
    """Seconds to finish in-flight requests after SIGTERM/SIGINT."""
    log_level: str = dataclasses.field(default="info", metadata={"choices": LOG_LEVELS})
    """Server log level."""

