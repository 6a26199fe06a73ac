"""The real server on 127.0.0.1: 429 from the bounded queue, 504 past the time limit, SIGTERM drain.

A slowed-down model (slow_server.py) makes requests overlap deterministically. The drain test runs
uvicorn in a subprocess, sends requests, sends SIGTERM while they are in flight, and checks that all of
them complete with 200 and that the process exits 0.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from bertkit.serve.client import wait_until_ready

from .conftest import LiveServer, free_port
from .slow_server import slow_app

HERE = Path(__file__).parent


def _post_many(url: str, count: int, stagger_s: float = 0.02) -> list[httpx.Response]:
    def post(i: int) -> httpx.Response:
        time.sleep(i * stagger_s)  # arrive in order
        return httpx.post(f"{url}/embed", json={"inputs": [f"text {i}"]}, timeout=30)

    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(post, range(count)))


def test_full_queue_answers_429_and_the_rest_complete(mlm_dir):
    # One request runs (0.5 s), one waits in the queue of size 1; the others find it full.
    with LiveServer(slow_app(str(mlm_dir), delay_s=0.5, max_queue=1, timeout_s=30)) as url:
        responses = _post_many(url, 5)
    codes = [r.status_code for r in responses]
    # Counts, not positions: on a busy machine two requests may swap places in the staggered arrival.
    assert sorted(codes) == [200, 200, 429, 429, 429], codes
    refused = next(r for r in responses if r.status_code == 429)
    assert refused.json()["code"] == "queue_full" and refused.headers["retry-after"] == "1"


def test_request_past_its_time_limit_answers_504(mlm_dir):
    with LiveServer(slow_app(str(mlm_dir), delay_s=0.6, max_queue=8, timeout_s=0.2)) as url:
        response = httpx.post(f"{url}/embed", json={"inputs": ["a"]}, timeout=30)
        assert response.status_code == 504 and response.json()["code"] == "timeout"
        time.sleep(0.6)  # the worker finishes the abandoned batch and serves the next request
        assert httpx.get(f"{url}/health").status_code == 200


def test_shutdown_drains_in_flight_requests(mlm_dir):
    """Fast variant in-process: what uvicorn's SIGTERM handler does (should_exit) while requests run."""
    app = slow_app(str(mlm_dir), delay_s=0.4, max_queue=16, timeout_s=30)
    server = LiveServer(app)
    with server as url, ThreadPoolExecutor(1) as pool:
        pending = pool.submit(_post_many, url, 4, 0.0)
        deadline = time.monotonic() + 30  # a busy machine may take long to connect all four
        while app.state.slow_predictor.calls + app.state.batcher.queued < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        server.server.should_exit = True  # all four have arrived; at least one is still in flight
        assert [r.status_code for r in pending.result(timeout=60)] == [200] * 4
    assert not server.thread.is_alive()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_sigterm_drains_in_flight_requests_and_exits_0(mlm_dir):
    port = free_port()
    process = subprocess.Popen([sys.executable, str(HERE / "slow_server.py"), str(mlm_dir), str(port), "0.3", "16",
                                "30"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(url)
        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(_post_many, url, 4, 0.0)
            time.sleep(0.3)  # all four are in flight: one running, three queued (~1.2 s of work)
            process.send_signal(signal.SIGTERM)
            responses = pending.result(timeout=60)
        assert [r.status_code for r in responses] == [200] * 4
        assert process.wait(timeout=60) == 0, process.stdout.read().decode()
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{url}/health", timeout=1)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
