"""bertkit.serve.client.wait_until_ready: returns once /ready answers 200, names the exit code of a server
that died first, and gives up at its deadline."""

from __future__ import annotations

import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from bertkit.errors import BertkitError
from bertkit.serve.client import wait_until_ready


class _Ready(BaseHTTPRequestHandler):
    calls = 0

    def do_GET(self) -> None:  # the name http.server calls
        type(self).calls += 1
        self.send_response(200 if type(self).calls >= 3 else 503)  # 503 twice, as while a model loads
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


def test_waits_through_503_until_ready():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Ready)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        wait_until_ready(f"http://127.0.0.1:{server.server_address[1]}", timeout_s=10, poll_s=0.01)
        assert _Ready.calls == 3
    finally:
        server.shutdown()


def test_a_server_that_exits_is_reported_with_its_code():
    process = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    process.wait()
    with pytest.raises(BertkitError, match="exited with code 3 before it was ready"):
        wait_until_ready("http://127.0.0.1:9", process, timeout_s=10)


def test_gives_up_at_the_deadline():
    with pytest.raises(BertkitError, match="not ready after 0.2 s"):
        wait_until_ready("http://127.0.0.1:9", timeout_s=0.2)
