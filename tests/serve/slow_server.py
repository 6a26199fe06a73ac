"""A real `bertkit.serve` server whose model is slowed down, for queue, timeout and drain tests.

Run as `python slow_server.py MODEL_DIR PORT DELAY_S MAX_QUEUE TIMEOUT_S` (a subprocess, so SIGTERM
reaches a real uvicorn main thread), or use `SlowPredictor` in-process. The delay makes requests
overlap deterministically; everything else is the production code path (`create_app`, `run_server`).
"""

from __future__ import annotations

import sys
import time

from bertkit.serve.app import create_app, run_server
from bertkit.serve.predictor import load_predictor
from bertkit.settings import Limits, ServerSettings, ServeSettings


class SlowPredictor:
    """A predictor whose embed() takes `delay_s` longer; warm-up stays fast."""

    def __init__(self, inner, delay_s: float) -> None:
        self.inner, self.delay_s = inner, delay_s
        self.calls = 0
        """embed() calls started (the warm-up is not counted)."""
        self.endpoints = inner.endpoints

    def __getattr__(self, name: str):  # tokenizer, max_seq_length, ...: the real predictor's
        return getattr(self.inner, name)

    def warmup(self) -> None:
        self.inner.warmup()

    def embed(self, *args, **kwargs):
        self.calls += 1
        time.sleep(self.delay_s)
        return self.inner.embed(*args, **kwargs)


def slow_app(model_dir: str, delay_s: float, max_queue: int, timeout_s: float, limits: Limits | None = None):
    predictor = SlowPredictor(load_predictor(model_dir), delay_s)
    settings = ServerSettings(limits=limits or Limits(), max_batch_size=1, max_wait_ms=1, max_queue=max_queue,
                              timeout_s=timeout_s)
    app = create_app(predictor, settings)
    app.state.slow_predictor = predictor  # tests count the requests that reached the model
    return app


if __name__ == "__main__":
    directory, port, delay, queue, timeout = sys.argv[1:6]
    run_server(slow_app(directory, float(delay), int(queue), float(timeout)),
               ServeSettings(directory, port=int(port), log_level="warning"))
