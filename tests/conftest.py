"""Fixed hardware measurements for the whole test suite.

Design decision: `--precision auto` and the CPU kernel choices come from a probe that times this
machine (bertkit.hardware). Under tests they read BERTKIT_PROBE_FILE instead, set here before any test
runs and inherited by the commands tests start in subprocesses, so every test is fast and gets the same
choices on any machine: those of the 2-core AMD EPYC the kernels were tuned on
(tests/assets/probe/amd-epyc.json). The probe cache goes to a temporary directory, never the user's.
tests/test_hardware.py runs the real probe once.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

PROBE_FILE = Path(__file__).parent / "assets" / "probe" / "amd-epyc.json"
_cache_dir: str | None = None


def pytest_configure(config) -> None:
    global _cache_dir
    _cache_dir = tempfile.mkdtemp(prefix="bertkit-test-cache-")
    os.environ["BERTKIT_PROBE_FILE"] = str(PROBE_FILE)
    os.environ["BERTKIT_CACHE_DIR"] = _cache_dir


def pytest_unconfigure(config) -> None:
    if _cache_dir is not None:
        shutil.rmtree(_cache_dir, ignore_errors=True)
