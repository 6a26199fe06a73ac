"""Part 2, the CUDA tests: `pytest -m cuda` over the test modules that hold one, from source, read back test by
test.

Design decision: results come from pytest's junit XML, with its `-v` lines as the fallback when pytest
is killed at the part's timeout (no XML is written then; the last test without an outcome is the one
that hung). The modules are found by reading them (`@pytest.mark.cuda` or a `pytestmark` naming it), not by
importing the whole tree, so a module that has nothing to do with the GPU (a server test that needs fastapi)
is never imported here; and a module that holds CUDA tests and fails to import fails this part, naming the
error: its tests did not run, whatever pytest's exit code says.
"""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from gpu_check.environment import ROOT

PER_TEST_TIMEOUT_S = 90
COMPILE_TEST = "tests/cuda/test_compile_smoke.py"
OUTCOMES = ("passed", "failed", "error", "skipped")
VERBOSE_LINE = re.compile(r"^(\S+::\S.*?) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b")
STARTED_LINE = re.compile(r"^\S+::\S+\s*$")  # -v prints the test id, then its outcome when it ends


CUDA_MARK = re.compile(r"pytest\.mark\.cuda\b")


def cuda_test_modules(root: Path = ROOT) -> list[str]:
    """The test modules (relative paths) that mark a test `cuda`, found by reading their text."""
    return sorted(str(path.relative_to(root)) for path in (root / "tests").rglob("test_*.py")
                  if CUDA_MARK.search(path.read_text(encoding="utf-8", errors="replace")))


def command(selection: str, dry_run: bool, junit: Path) -> list[str]:
    paths = [COMPILE_TEST] if selection == "compile" else [m for m in cuda_test_modules() if m != COMPILE_TEST]
    cmd = [sys.executable, "-m", "pytest", "-m", "cuda", *paths, "-v", "-rA", "-p", "no:cacheprovider",
           f"--junitxml={junit}", "--continue-on-collection-errors"]
    if importlib.util.find_spec("pytest_timeout") is not None:
        cmd.append(f"--timeout={300 if selection == 'compile' else PER_TEST_TIMEOUT_S}")
    return cmd


def run(options: dict[str, Any]) -> tuple[str, dict[str, Any], str | None]:
    selection, dry_run = options["selection"], options["dry_run"]
    junit = Path(options["out"]) / ("junit.xml" if selection == "main" else "junit-compile.xml")
    junit.unlink(missing_ok=True)
    transcript = Path(options["work"]) / f"pytest-{selection}.txt"
    cmd = command(selection, dry_run, junit)
    print("$ " + " ".join(cmd), flush=True)
    timeout = max(5.0, options["timeout_s"] - 15)  # leave time to read and report what ran
    timed_out = False
    with open(transcript, "w") as handle:
        process = subprocess.Popen(cmd, cwd=ROOT, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True,
                                   env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            returncode = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(process.pid, signal.SIGKILL)
            returncode = process.wait()
    text = transcript.read_text(errors="replace")
    print(text, flush=True)
    tests = read_junit(junit) if junit.is_file() and not timed_out else read_verbose(text)
    details: dict[str, Any] = {"command": " ".join(cmd), "returncode": returncode, "timed_out": timed_out,
                               "junit": str(junit) if junit.is_file() else None,
                               "counts": {o: sum(t["outcome"] == o for t in tests) for o in OUTCOMES},
                               "tests": tests}
    details["summary_line"] = next((line.strip("= ") for line in reversed(text.splitlines())
                                    if re.search(r"\b(passed|failed|skipped|deselected|error|no tests ran)\b", line)),
                                   None)
    bad = [t for t in tests if t["outcome"] in ("failed", "error")]
    if timed_out:
        running = tests[-1]["name"] if tests and tests[-1]["outcome"] == "running" else "unknown"
        return "timeout", details, f"pytest killed after {timeout:.0f} s; the test running then: {running}"
    if bad:
        return "failed", details, f"{len(bad)} failed: " + "; ".join(t["name"] for t in bad[:10])
    if not tests:
        return "failed", details, f"pytest ran no test (exit code {returncode}); see the log"
    if not dry_run and not details["counts"]["passed"]:
        return "failed", details, "every CUDA test was skipped on a machine that should run them"
    return "passed", details, None


def read_junit(path: Path) -> list[dict[str, Any]]:
    """One record per test case: name, outcome, seconds, message (failures: the end of the report)."""
    tests = []
    for case in ET.parse(path).getroot().iter("testcase"):
        classname, name = case.get("classname", ""), case.get("name", "")
        record: dict[str, Any] = {"name": f"{classname}::{name}" if classname else name, "outcome": "passed",
                  "seconds": round(float(case.get("time") or 0.0), 2), "message": None}
        for tag in ("failure", "error", "skipped"):
            found = case.find(tag)
            if found is not None:
                text = (found.get("message") or "") + "\n" + (found.text or "")
                record["outcome"] = {"failure": "failed"}.get(tag, tag)
                record["message"] = text.strip()[-2000:] if tag != "skipped" else (found.get("message") or "")[:300]
                break
        if record["outcome"] == "error" and not classname:  # a module pytest could not import: its tests never ran
            record["message"] = f"not collected (the module failed to import): {import_error(record['message'] or '')}"
        tests.append(record)
    return tests


def import_error(message: str) -> str:
    """The line of a collection failure that says why (the last 'E   ...' line), or its first line."""
    errors = [line[1:].strip() for line in message.splitlines() if line.startswith("E ")]
    return (errors[-1] if errors else message.strip().splitlines()[0] if message.strip() else "no message")[:300]


def read_verbose(text: str) -> list[dict[str, Any]]:
    """Outcomes from `pytest -v` lines when there is no XML; a test started but not finished is 'running'."""
    tests = []
    for line in text.splitlines():
        found = VERBOSE_LINE.match(line)
        if found:
            outcome = {"XFAIL": "skipped", "XPASS": "passed"}.get(found.group(2), found.group(2).lower())
            tests.append({"name": found.group(1), "outcome": outcome, "seconds": None, "message": None})
        elif STARTED_LINE.match(line):
            tests.append({"name": line.strip(), "outcome": "running", "seconds": None, "message": None})
    return tests
