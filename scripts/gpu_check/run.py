"""The runner: each part in a child process with its own timeout, under one time budget, results written
after every part.

Design decision: a part that hangs (a CUDA kernel, an NCCL rendezvous, a compilation) or crashes the
interpreter must not take the check with it, so every part runs as `python -m gpu_check --child MODULE`
in a process session of its own: on timeout the whole session (its pytest, its compile workers) is
killed, the part is recorded as timed out with the end of its output, and the next part starts. The
parent imports no torch. The required parts' timeouts add up to less than the budget (7.5 minutes on a
GPU), so the run ends inside 8 minutes whatever hangs; optional parts run only when their whole timeout
still fits.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpu_check import report
from gpu_check.environment import ROOT

RESULTS_JSON, RESULTS_MD, LOG = "results.json", "results.md", "gpu_check.log"
SCHEMA = 1
STATUSES = ("passed", "failed", "timeout", "skipped")
DESELECTED = "not selected (--parts)"


@dataclass(frozen=True)
class Part:
    """One step of the check: `gpu_check.<module>.run(options) -> (status, details, error)` (a dotted
    `module` is imported as it is named)."""

    name: str
    title: str
    module: str
    timeout_s: int
    """On a GPU; the dry run's timeout is `dry_timeout_s`."""
    needs: tuple[str, ...]
    """Required modules; without one the part is skipped and says which."""
    optional: bool = False
    """On a GPU, runs only when its whole timeout fits in what is left of the budget (a dry run runs every part)."""
    options: dict[str, Any] = field(default_factory=dict)
    dry_timeout_s: int = 90


CORE = ("torch", "numpy", "safetensors", "tokenizers")
PARTS = (
    Part("environment", "Environment", "environment", 45, ()),
    Part("cuda_tests", "CUDA tests (pytest -m cuda)", "cuda_tests", 150, (*CORE, "pytest", "transformers"),
         options={"selection": "main"}),
    Part("process_group", "One-rank process group through fit (the eager step, then the compiled static step)",
         "process_group", 120, (*CORE, "tqdm", "tensorboard", "matplotlib")),
    Part("ladder", "Lever ladder, bert-base 128 tokens: every lever on the same batches, numerics, profile",
         "ladder", 330, (*CORE, "transformers"), options={"shape": "ladder"}, dry_timeout_s=150),
    Part("phase2", "bert-base 512 tokens: the fastest variant on full rows and on real padded phase-2 data",
         "ladder", 180, CORE, options={"shape": "phase2"}, dry_timeout_s=120),
    Part("large", "bert-large 128 tokens: the fastest variant", "ladder", 180, CORE, options={"shape": "large"},
         dry_timeout_s=120),
    Part("compile_smoke", "--compile smoke test (optional)", "cuda_tests", 150, (*CORE, "pytest"), optional=True,
         options={"selection": "compile"}),
    Part("throughput_tf32", "Pre-training throughput and MFU, fp32 with TF32 (optional)", "throughput", 90,
         (*CORE, "transformers"), optional=True, options={"precision": "tf32"}),
    Part("checkpointing", "--gradient-checkpointing at 512 tokens: time and memory (optional)", "checkpointing", 150,
         CORE, optional=True),
)
GPU_BUDGET_S = 560.0
"""The default budget on a GPU: under the device tool's 10 minutes a call. The required parts' timeouts add up to
more (the compilations of three shapes), so a run that must fit one call names fewer parts (`--parts`) and a
second call runs the rest; every part is cut to what is left of the budget."""
DRY_BUDGET_S = 420.0
def default_out() -> Path:
    return Path(os.environ.get("GPU_CHECK_OUT") or os.environ.get("OUT") or "gpu_check_out")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="gpu_check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true",
                        help="the same code paths on CPU with a tiny model (CUDA tests collected and skipped, "
                             "gloo instead of NCCL); well under a minute")
    parser.add_argument("--out", type=Path, default=None,
                        help="folder for results.json, results.md, junit.xml and gpu_check.log "
                             "(default: $GPU_CHECK_OUT, else $OUT, else ./gpu_check_out)")
    parser.add_argument("--budget", type=float, default=None,
                        help=f"seconds for the whole run (default {GPU_BUDGET_S:.0f} on a GPU, {DRY_BUDGET_S:.0f} "
                             "in a dry run)")
    parser.add_argument("--parts", default=None,
                        help=f"comma-separated subset of: {', '.join(p.name for p in PARTS)} "
                             "(the environment always runs)")
    parser.add_argument("--best-levers", default=None,
                        help="for the large and phase2 parts run without the ladder in the same run: the levers of "
                             "the variant to run, comma-separated from compile,cuda_graphs,norm,gelu,loss (default: "
                             "the ladder's fastest, else compile,norm,gelu,loss)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--options", help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        return child(args.child, json.loads(args.options), args.result)
    out = (args.out or default_out()).resolve()
    selected = None if args.parts is None else {name.strip() for name in args.parts.split(",") if name.strip()}
    unknown = (selected or set()) - {p.name for p in PARTS}
    if unknown:
        print(f"gpu_check: unknown part(s) {', '.join(sorted(unknown))}; choose from "
              f"{', '.join(p.name for p in PARTS)}", file=sys.stderr)
        return 2
    budget = args.budget or (DRY_BUDGET_S if args.dry_run else GPU_BUDGET_S)
    runner = Runner(out, args.dry_run, budget, selected)
    if args.best_levers:
        names = {name.strip() for name in args.best_levers.split(",") if name.strip()}
        known = {"compile", "cuda_graphs", "norm", "gelu", "loss"}
        if names - known:
            print(f"gpu_check: --best-levers {args.best_levers!r}: choose from {', '.join(sorted(known))}",
                  file=sys.stderr)
            return 2
        runner.given_levers = {"static": True, **{name: name in names for name in known}}
    results = runner.run()
    return 0 if results["ok"] else 1


class Runner:
    def __init__(self, out: Path, dry_run: bool, budget_s: float, selected: set[str] | None) -> None:
        self.out, self.dry_run, self.budget_s, self.selected = out, dry_run, budget_s, selected
        self.given_levers: dict[str, bool] | None = None
        self.started = time.monotonic()
        self.results: dict[str, Any] = {
            "schema": SCHEMA, "dry_run": dry_run,
            "started_utc": datetime.now(UTC).isoformat(timespec="seconds"),
            "budget_s": budget_s, "total_s": 0.0, "out": str(out), "command": " ".join(sys.argv),
            "environment": {}, "parts": {}, "ok": False}

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def run(self) -> dict[str, Any]:
        self.out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="gpu_check-") as work, open(self.out / LOG, "w") as log:
            for part in PARTS:
                record = self.run_part(part, Path(work), log)
                found = report.one_line(part.name, record)
                self.results["parts"][part.name] = record
                if part.name == "environment":  # the environment is the results' own section
                    self.results["environment"], record["details"] = record["details"], {}
                note = f" - {record['error']}" if record.get("error") else ""
                print(f"[{self.elapsed():6.1f}s] {part.name}: {record['status']} ({record['seconds']:.1f} s)"
                      f"{found}{note[:300]}", flush=True)
                self.write()
        self.write(final=True)
        print(f"results: {self.out / RESULTS_MD} and {self.out / RESULTS_JSON}")
        return self.results

    def skip_reason(self, part: Part) -> str | None:
        if part.name == "environment":
            return None
        if self.selected is not None and part.name not in self.selected:
            return DESELECTED
        env = self.results["environment"]
        missing = [m for m in part.needs if m in env.get("missing_required", ())]
        if missing:
            return "missing required module(s): " + ", ".join(missing)
        if not self.dry_run and env and not env.get("device", {}).get("cuda_available", False):
            return "no CUDA device (see environment)"
        left = self.budget_s - self.elapsed()
        timeout = self.timeout(part)
        if part.optional and left < timeout:
            return f"optional part needs {timeout} s, {left:.0f} s of the budget left"
        if left < 10:
            return f"budget spent ({self.budget_s:.0f} s)"
        return None

    def timeout(self, part: Part) -> int:
        return part.dry_timeout_s if self.dry_run else part.timeout_s

    def run_part(self, part: Part, work: Path, log) -> dict[str, Any]:
        record: dict[str, Any] = {"title": part.title, "optional": part.optional, "status": "skipped",
                                  "seconds": 0.0, "timeout_s": None, "error": None, "details": {}}
        reason = self.skip_reason(part)
        if reason:
            record["error"] = reason
            return record
        timeout = min(self.timeout(part), max(1.0, self.budget_s - self.elapsed()))
        result_file = work / f"{part.name}.result.json"
        options = {**part.options, "dry_run": self.dry_run, "out": str(self.out), "timeout_s": timeout,
                   "work": str(work), "result": str(result_file), **self.handed_on(part)}
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if self.dry_run:  # tiny models on a CPU: a second thread only waits for the first on a busy machine
            env.setdefault("OMP_NUM_THREADS", "1")
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT / "scripts"),
                                             *filter(None, [os.environ.get("PYTHONPATH")])])
        if part.module == "process_group":  # what torchrun would set for a job of one process
            env.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(free_port()))
        result_file.unlink(missing_ok=True)
        command = [sys.executable, "-m", "gpu_check", "--child", part.module, "--options", json.dumps(options),
                   "--result", str(result_file)]
        log.write(f"\n===== {part.name}: {part.title} (timeout {timeout:.0f} s) =====\n")
        log.flush()
        offset = log.tell()
        started = time.monotonic()
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                                   start_new_session=True)
        timed_out = False
        try:
            returncode = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            kill_session(process)
            returncode = process.wait()
        record.update(seconds=round(time.monotonic() - started, 1), timeout_s=round(timeout), returncode=returncode)
        tail = output_tail(self.out / LOG, offset)
        if result_file.is_file():  # the part's result, or what it wrote so far (`ladder.write_partial`)
            reported = json.loads(result_file.read_text())
            record.update(status=reported["status"], error=reported["error"], details=reported["details"])
        if timed_out:
            record["status"] = "timeout"
            record["error"] = f"no result within {timeout:.0f} s; killed (results so far kept). Last output:\n{tail}"
        elif not result_file.is_file():
            record["status"] = "failed"
            record["error"] = f"the part's process exited with {returncode} without a result. Last output:\n{tail}"
        return record

    def handed_on(self, part: Part) -> dict[str, Any]:
        """What a later part takes from an earlier one: the TF32 run starts its batch search at the batch the
        bf16 ladder used (fp32 activations need more memory); the bert-large and 512-token parts run the
        ladder's fastest variant (its levers)."""
        ladder = self.results["parts"].get("ladder", {}).get("details", {})
        if part.name == "throughput_tf32" and ladder.get("batch"):
            return {"max_batch": ladder["batch"]}
        if part.name in ("large", "phase2") and ladder.get("best"):
            return {"best_levers": ladder["best"]["levers"], "best_name": ladder["best"]["name"]}
        if part.name in ("large", "phase2") and self.given_levers:
            return {"best_levers": self.given_levers, "best_name": "the levers given with --best-levers"}
        return {}

    def write(self, final: bool = False) -> None:
        self.results["total_s"] = round(self.elapsed(), 1)
        parts = self.results["parts"]
        self.results["summary"] = {status: sorted(n for n, r in parts.items() if r["status"] == status)
                                   for status in STATUSES}
        # ok: nothing failed or timed out, and every required part that was asked for passed
        self.results["ok"] = final and not [
            name for name, r in parts.items() if r["status"] in ("failed", "timeout")
            or (r["status"] == "skipped" and not r["optional"] and r["error"] != DESELECTED)]
        self.results["complete"] = final
        write_atomic(self.out / RESULTS_JSON, json.dumps(self.results, indent=2, default=str) + "\n")
        write_atomic(self.out / RESULTS_MD, report.markdown(self.results, PARTS))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def kill_session(process: subprocess.Popen) -> None:
    """SIGKILL the part's whole process session (it was started with start_new_session)."""
    with contextlib.suppress(ProcessLookupError):  # already gone
        os.killpg(process.pid, signal.SIGKILL)


def output_tail(path: Path, offset: int, chars: int = 3000) -> str:
    with open(path, errors="replace") as handle:
        handle.seek(offset)
        return handle.read()[-chars:].strip()


def write_atomic(path: Path, text: str) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, path)


def child(module: str, options: dict[str, Any], result: Path) -> int:
    """Run one part in this (child) process and write {status, details, error} to `result`."""
    try:
        part = importlib.import_module(module if "." in module else f"gpu_check.{module}")
        status, details, error = part.run(options)
    except Exception:  # noqa: BLE001 - whatever a part raises is its result
        status, details, error = "failed", {}, traceback.format_exc()[-4000:]
    assert status in STATUSES, status
    write_atomic(result, json.dumps({"status": status, "details": details, "error": error}, default=str))
    sys.stdout.flush()
    return 0

