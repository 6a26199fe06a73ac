"""Connection limits of the real server on 127.0.0.1 (connections.py): header and body timeouts, the cap
on open connections, stalled responses, accept errors logged at most once per interval, and the
open-file limit fitted to the cap.

Raw sockets play the slow clients, so every byte and every pause is explicit; each test bounds its
own waiting, and timeouts are set to fractions of a second.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from bertkit.serve import connections
from bertkit.serve.connections import EventLog, fit_file_limit, handle_accept_errors
from bertkit.settings import Limits

from .conftest import LiveServer
from .slow_server import slow_app

FAST = Limits(header_timeout_s=0.5, body_timeout_s=0.5)


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=10)


def _read_to_close(sock: socket.socket, limit_s: float = 5.0) -> tuple[bytes, float]:
    """Everything the server sends until it closes the connection, and how long that took."""
    start, chunks = time.monotonic(), []
    sock.settimeout(limit_s)
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks), time.monotonic() - start


def _status_and_error(response: bytes) -> tuple[int, str]:
    head, _, body = response.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)["code"]


def _is_open(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(1) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        sock.setblocking(True)


@pytest.fixture(scope="module")
def fast_server(mlm_dir):
    with LiveServer(slow_app(str(mlm_dir), delay_s=0.8, max_queue=8, timeout_s=30, limits=FAST)) as url:
        yield url


def test_headers_sent_a_byte_at_a_time_get_408_at_the_header_timeout(fast_server):
    sock = _connect(fast_server)
    start = time.monotonic()
    for byte in b"POST /embed HTTP/1.1\r\nHost: x\r\n":  # a byte every 0.05 s never resets the timer
        try:
            sock.sendall(bytes([byte]))
        except OSError:
            break
        time.sleep(0.05)
    response, _ = _read_to_close(sock)
    assert 0.4 < time.monotonic() - start < 3.0
    assert _status_and_error(response) == (408, "request_timeout")


def test_a_silent_connection_is_closed_at_the_header_timeout(fast_server):
    response, elapsed = _read_to_close(_connect(fast_server))
    assert response == b"" and 0.4 < elapsed < 3.0  # nothing was asked, so nothing is answered


def test_a_slow_body_gets_408_at_the_body_timeout(fast_server):
    sock = _connect(fast_server)
    sock.sendall(b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
    response, elapsed = _read_to_close(sock)
    assert _status_and_error(response) == (408, "request_timeout") and 0.4 < elapsed < 3.0


@pytest.mark.parametrize("pieces", [1, 40], ids=["whole", "in-pieces"])
def test_headers_over_the_limit_get_431(fast_server, pieces):
    request = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 20_000 + b"\r\n\r\n"  # limit: 16,384
    if pieces > 1:
        request = request[:17_000]  # nothing sent after the server closes, so no reset loses its answer
    sock = _connect(fast_server)
    size = -(-len(request) // pieces)
    for start in range(0, len(request), size):
        sock.sendall(request[start:start + size])
        time.sleep(0.005)
    response, _ = _read_to_close(sock)
    assert _status_and_error(response) == (431, "headers_too_large")
    assert httpx.get(f"{fast_server}/health", headers={"X-Pad": "a" * 16_000}).status_code == 200


def test_timers_run_only_while_a_request_arrives(fast_server):
    """A request answered after 0.8 s (past both timeouts), then another on the same keep-alive
    connection after a pause shorter than the header timeout: all 200."""
    with httpx.Client(base_url=fast_server, timeout=30) as client:
        for _ in range(2):
            assert client.post("/embed", json={"inputs": ["the cat"]}).status_code == 200
            time.sleep(0.3)
        assert client.get("/health").status_code == 200


def test_at_the_cap_a_new_connection_replaces_the_longest_waiting_one(mlm_dir):
    limits = Limits(max_connections=3, header_timeout_s=30, body_timeout_s=30)
    with LiveServer(slow_app(str(mlm_dir), delay_s=0, max_queue=8, timeout_s=30, limits=limits)) as url:
        idle = []
        for _ in range(3):
            idle.append(_connect(url))
            time.sleep(0.1)  # admitted in this order
        idle[1].sendall(b"GET /hea")  # a partial request: waiting, but younger than idle[0]
        start = time.monotonic()
        assert httpx.get(f"{url}/health", timeout=5).status_code == 200
        assert time.monotonic() - start < 1.0
        assert _read_to_close(idle[0])[0] == b""  # the oldest, silent: closed without an answer
        assert _is_open(idle[1]) and _is_open(idle[2])
        idle.append(_connect(url))  # the cap again: idle[1], idle[2], idle[3]
        time.sleep(0.1)
        assert httpx.get(f"{url}/health", timeout=5).status_code == 200
        response, _ = _read_to_close(idle[1])  # next oldest, with a partial request: told why
        assert _status_and_error(response) == (503, "too_many_connections")


def test_at_the_cap_with_every_connection_being_answered_a_new_one_gets_503_at_once(mlm_dir):
    limits = Limits(max_connections=2)
    with LiveServer(slow_app(str(mlm_dir), delay_s=0.8, max_queue=8, timeout_s=30, limits=limits)) as url:
        with ThreadPoolExecutor(2) as pool:
            busy = [pool.submit(httpx.post, f"{url}/embed", json={"inputs": ["a"]}, timeout=30) for _ in range(2)]
            time.sleep(0.4)  # both requests are in; they hold their connections for 0.8 and 1.6 s
            start = time.monotonic()
            refused = httpx.get(f"{url}/health", timeout=5)
            assert time.monotonic() - start < 0.5
            assert refused.status_code == 503 and refused.json()["code"] == "too_many_connections"
            assert refused.headers["retry-after"] == "1"
            assert [f.result().status_code for f in busy] == [200, 200]
        assert httpx.get(f"{url}/health", timeout=5).status_code == 200


def test_a_client_that_stops_reading_its_response_is_closed(fast_server):
    """Pipelined requests whose answers (~7 MB, more than the kernel buffers) the client does not read
    fill the write buffer; after the body timeout the connection is aborted."""
    host, port = fast_server.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: a small window
    sock.connect((host, int(port)))
    answers = 2000
    sock.sendall(b"GET /openapi.json HTTP/1.1\r\nHost: x\r\n\r\n" * answers)
    time.sleep(3.0)  # the server writes until its buffers are full, then the stall timer (0.5 s) fires
    assert httpx.get(f"{fast_server}/health", timeout=5).status_code == 200
    received, _ = _read_to_close(sock)
    one = len(httpx.get(f"{fast_server}/openapi.json").content)
    assert len(received) < answers * one / 2  # cut off long before all answers


def test_event_log_logs_the_first_event_then_one_line_of_counts(caplog):
    async def burst() -> None:
        events = EventLog(interval_s=0.2)
        for _ in range(10_000):
            events.note("test accept() failed")
        events.note("test closed a slow connection")
        await asyncio.sleep(0.4)

    with caplog.at_level(logging.WARNING, logger="bertkit.serve.connections"):
        asyncio.run(burst())
    lines = [r.getMessage() for r in caplog.records if "test " in r.getMessage()]  # not other servers' events
    assert len(lines) == 2, lines
    assert lines[0].startswith("test accept() failed (further connection events are counted")
    assert "test accept() failed: 9999" in lines[1] and "test closed a slow connection: 1" in lines[1]


def test_accept_errors_go_through_the_event_log_and_other_errors_do_not(caplog):
    async def errors() -> None:
        loop = asyncio.get_running_loop()
        handle_accept_errors(loop, EventLog(interval_s=60))
        for _ in range(2048):  # what asyncio's accept loop reports in one turn at EMFILE
            loop.call_exception_handler({"message": "socket.accept() out of system resource",
                                         "exception": OSError(errno.EMFILE, "Too many open files")})
        loop.call_exception_handler({"message": "something else", "exception": ValueError("other")})

    with caplog.at_level(logging.WARNING):
        asyncio.run(errors())
    messages = [r.getMessage() for r in caplog.records]
    assert sum("Too many open files" in m for m in messages) == 1
    assert any("something else" in m for m in messages)


def test_malformed_requests_are_counted_not_logged_one_line_each(fast_server):
    """uvicorn logs a warning per malformed request; the server's filter turns them into counts."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("uvicorn.error").addHandler(handler)
    try:
        for _ in range(50):
            sock = _connect(fast_server)
            sock.sendall(b"\x16\x03\x01 not http\r\n\r\n")
            response, _ = _read_to_close(sock)
            assert response.startswith(b"HTTP/1.1 400 ")
    finally:
        logging.getLogger("uvicorn.error").removeHandler(handler)
    assert not [r for r in records if "Invalid HTTP request" in r.getMessage()]
    assert httpx.get(f"{fast_server}/health").status_code == 200


def test_the_open_file_limit_is_raised_to_fit_the_cap_or_the_cap_lowered(monkeypatch, caplog):
    resource = pytest.importorskip("resource")
    limits = {"soft": 256, "hard": 100_000}
    monkeypatch.setattr(resource, "getrlimit", lambda _: (limits["soft"], limits["hard"]))
    monkeypatch.setattr(resource, "setrlimit", lambda _, value: limits.update(soft=value[0]))
    assert fit_file_limit(1000) == 1000 and limits["soft"] >= 1000 + connections.FD_RESERVE
    limits.update(soft=256, hard=256)
    with caplog.at_level(logging.WARNING, logger="bertkit.serve.connections"):
        cap = fit_file_limit(1000)
    assert 0 < cap <= 256 - connections.FD_RESERVE
    assert "--max-connections 1000" in caplog.text and f"at most {cap}" in caplog.text

