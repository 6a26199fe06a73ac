"""Requests whose client has gone are not computed and do not hold the queue (issue 50: 8 expensive /embed
requests sent and abandoned within 0.4 s made a tiny live request time out with 504 after 30 s, and were counted
200 or 504). Over real sockets against the production server: the abandoned requests' queued inputs are dropped,
the live request behind them is answered in time, and each abandoned request is counted 499."""

from __future__ import annotations

import json
import socket
import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from .conftest import LiveServer
from .slow_server import slow_app

DELAY_S = 1.0
ABANDONED = 8


def _send_and_leave(port: int) -> socket.socket:
    """POST /embed over a raw socket, the whole request sent; the caller closes it without reading."""
    body = json.dumps({"inputs": ["the cat sat on the mat"] * 4}).encode()
    connection = socket.create_connection(("127.0.0.1", port))
    connection.sendall(b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                       + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    return connection


def _status_count(url: str, status: str) -> float:
    text = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == "bertkit_requests_total" and sample.labels.get("endpoint") == "/embed"
               and sample.labels.get("status") == status)


def test_abandoned_requests_are_dropped_and_a_live_one_is_answered_in_time(classifier_dir):
    app = slow_app(str(classifier_dir), DELAY_S, max_queue=32, timeout_s=30.0)
    predictor = app.state.slow_predictor
    with LiveServer(app) as url:
        port = int(url.rsplit(":", 1)[1])
        connections = [_send_and_leave(port) for _ in range(ABANDONED)]
        time.sleep(0.2)
        for connection in connections:
            connection.close()
        time.sleep(0.2)
        started = time.monotonic()
        request = urllib.request.Request(f"{url}/embed", data=json.dumps({"inputs": "a dog"}).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as answer:
            assert answer.status == 200 and len(json.loads(answer.read())) == 1
        waited = time.monotonic() - started
        # At most the batch already running when the clients left, then its own: not the 8 abandoned ones.
        assert waited < 3 * DELAY_S + 1.0, waited
        assert predictor.calls <= 3, predictor.calls  # the live request's, and at most two that had started
        deadline = time.monotonic() + 10
        while _status_count(url, "499") < ABANDONED - 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _status_count(url, "499") >= ABANDONED - 2  # those that had started may finish (their answer is lost)
        assert _status_count(url, "504") == 0
