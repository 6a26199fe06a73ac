"""What a run reports: metrics.jsonl, TensorBoard events, a tqdm progress bar, and the final PNG.

Design decision: `metrics.jsonl` is the record of truth (one JSON object per optimizer step, kind
"train", one per evaluation, kind "eval", and one per resume, kind "resume", with the settings that
changed); TensorBoard and the plot are views of the same numbers.
On resume the file is cut back to the checkpoint's step, so a resumed run's file reads exactly like an
uninterrupted one. Only rank 0 reports.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from bertkit.io.atomic import write_text_atomic

METRICS_FILE = "metrics.jsonl"
PLOT_FILE = "curves.png"


MAX_RECORD_BYTES = 1 << 20
"""Longest metrics.jsonl line read (a record is a few hundred bytes)."""


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """All records of a metrics.jsonl file, read a line at a time: a line that is not a JSON object with an integer
    step (a torn last line from a killed run, an edit, bytes that are not UTF-8, a line longer than any record) is
    skipped."""
    if not path.is_file():
        return []
    records = []
    with open(path, "rb") as lines:
        while line := lines.readline(MAX_RECORD_BYTES + 1):
            if len(line) > MAX_RECORD_BYTES and not line.endswith(b"\n"):
                while (rest := lines.readline(MAX_RECORD_BYTES)) and not rest.endswith(b"\n"):
                    pass  # the remainder of an overlong line
                continue
            try:
                record = json.loads(line)
            except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
                continue
            step = record.get("step", 0) if isinstance(record, dict) else None
            if isinstance(step, int) and not isinstance(step, bool):  # a record bertkit wrote has an integer step
                records.append(record)
    return records


def truncate_metrics(path: Path, step: int) -> None:
    """Keep only records up to and including `step` (the resumed checkpoint's step)."""
    kept = [r for r in read_metrics(path) if r.get("step", 0) <= step]
    write_text_atomic(path, "".join(json.dumps(r) + "\n" for r in kept))  # a crash here keeps the old log


class Reporter:
    """metrics.jsonl + TensorBoard + progress bar of rank 0; a silent stand-in on other ranks."""

    def __init__(self, run_dir: Path, enabled: bool, total_steps: int | None, start_step: int,
                 max_time_s: float | None = None) -> None:
        self.enabled = enabled
        self.run_dir, self.max_time_s = run_dir, max_time_s
        if not enabled:
            return
        from torch.utils.tensorboard import SummaryWriter

        run_dir.mkdir(parents=True, exist_ok=True)
        truncate_metrics(run_dir / METRICS_FILE, start_step)
        self.jsonl = open(run_dir / METRICS_FILE, "a", encoding="utf-8")  # noqa: SIM115 - open for the whole run
        self.writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"), purge_step=start_step + 1)
        self.bar = tqdm(total=total_steps, initial=start_step, desc="train", unit="step", dynamic_ncols=True)
        self.window_tokens, self.window_start = 0, time.perf_counter()

    def train_step(self, record: dict[str, Any], tokens: int, show: bool) -> None:
        """Log one optimizer step; when `show`, refresh the bar's loss / lr / tokens per second (and the
        time left under a time budget; under a step budget tqdm shows the ETA)."""
        if not self.enabled:
            return
        self.window_tokens += tokens
        self.jsonl.write(json.dumps(record) + "\n")
        self.jsonl.flush()
        for key, value in record.items():
            if key not in ("step", "kind", "elapsed_s") and isinstance(value, (int, float)) and math.isfinite(value):
                self.writer.add_scalar(f"train/{key}", value, record["step"])
        self.bar.update(1)
        if show:
            elapsed = max(time.perf_counter() - self.window_start, 1e-9)
            postfix = dict(loss=f"{record['loss']:.4f}", lr=f"{record['lr']:.2e}",
                           tok_s=f"{self.window_tokens / elapsed:,.0f}")
            if self.max_time_s is not None:  # the bar's own ETA counts steps; a time budget ends by the clock
                postfix["time_left"] = f"{max(0.0, self.max_time_s - record['elapsed_s']) / 60:.1f}min"
            self.bar.set_postfix(postfix)
            self.window_tokens, self.window_start = 0, time.perf_counter()

    def record(self, record: dict[str, Any]) -> None:
        """Write one other record (e.g. kind "resume") to metrics.jsonl."""
        if self.enabled:
            self.jsonl.write(json.dumps(record) + "\n")
            self.jsonl.flush()

    def eval_step(self, step: int, metrics: dict[str, float]) -> None:
        if not self.enabled:
            return
        self.jsonl.write(json.dumps({"kind": "eval", "step": step, **metrics}) + "\n")
        self.jsonl.flush()
        for key, value in metrics.items():
            self.writer.add_scalar(f"eval/{key}", value, step)
        self.bar.write(f"step {step} eval: " + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()))

    def message(self, text: str) -> None:
        if self.enabled:
            self.bar.write(text)

    def close(self) -> None:
        if not self.enabled:
            return
        self.bar.close()
        self.writer.close()
        self.jsonl.close()
        plot_metrics(self.run_dir / METRICS_FILE, self.run_dir / PLOT_FILE)


def plot_metrics(metrics_path: Path, png_path: Path) -> Path | None:
    """Losses and the held-out context gain, both in nats (left), and accuracies (right) against step, train and
    eval, into one PNG."""
    records = read_metrics(metrics_path)
    if not records:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (loss_axis, accuracy_axis) = plt.subplots(1, 2, figsize=(11, 4))
    keys = sorted({k for r in records for k in r if k.endswith(("loss", "accuracy", "context_gain"))})
    colors = {key: f"C{i}" for i, key in enumerate(keys)}  # a metric keeps its colour in train and eval
    for kind, style in (("train", "-"), ("eval", "o--")):
        rows = [r for r in records if r.get("kind") == kind]
        for key in keys:
            points = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
            if not points:
                continue
            axis = accuracy_axis if key.endswith("accuracy") else loss_axis
            axis.plot(*zip(*points), style, color=colors[key], label=f"{kind} {key}", markersize=4,
                      alpha=0.4 if kind == "train" else 1.0)
    gain = any(key.endswith("context_gain") for key in keys)  # pre-training's, in nats as its losses
    for axis, title in ((loss_axis, "loss, context gain (nats)" if gain else "loss"), (accuracy_axis, "accuracy")):
        axis.set_xlabel("optimizer step")
        axis.set_title(title)
        if axis.lines:
            axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(png_path, dpi=110)
    plt.close(figure)
    return png_path
