"""Client side of `bertkit serve`: wait until a server that was just started answers /ready.

Design decision: scripts, benchmarks and tests that start the server as a process all need the same
wait (poll /ready until 200, give up when the process exits or a deadline passes), so it lives here
once. It uses the standard library's HTTP client, so it works without the `serve` extra.
"""

from __future__ import annotations

import subprocess
import time
import urllib.error
import urllib.request

from bertkit.errors import BertkitError


def wait_until_ready(url: str, process: subprocess.Popen | None = None, timeout_s: float = 60.0,
                     poll_s: float = 0.05) -> None:
    """Return once GET `url`/ready answers 200; raise BertkitError when `process` (the server, if given)
    exits first or `timeout_s` passes (the message says which, with the exit code)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise BertkitError(f"the server at {url} exited with code {process.returncode} before it was ready")
        try:
            with urllib.request.urlopen(f"{url}/ready", timeout=1) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass  # not listening yet, or 503 while the model loads
        time.sleep(poll_s)
    raise BertkitError(f"the server at {url} was not ready after {timeout_s:g} s")
