"""Benchmark: time to the first batch and peak added memory of an epoch's plan (`EpochBatches`), fresh and
resumed at mid-epoch, against the list-based plan it replaced (issue 23, item 9).

The dataset is a length and an identity `__getitem__` (items are their indices), so what is measured is
the plan: the epoch's permutation and the micro-batch index lists, nothing read from disk. The reference
is the previous algorithm, copied below (`ListPlan`): `rng.permutation(n)` (int64), every step's index
lists built as Python lists before the first batch, flattened into the DataLoader's batch_sampler. Both
give the same order (tests/train/test_epoch_order.py proves it against the same reference).

Each measurement runs in a fresh process, so their memory does not mix: peak added memory is the peak
RSS while making the first batch (Linux: VmHWM, reset through /proc/self/clear_refs) minus the RSS just
before, after the dataset and the lengths exist. The reference is slow and big at scale (~55 bytes and
~0.9 us an example): give it fewer examples with --reference-examples and its figures are also shown
scaled linearly to --examples, marked as extrapolated.

Usage (one run is a few minutes at the defaults; keep runs short on shared machines):

    python benchmarks/epoch_order.py --examples 100000000 --reference-examples 5000000
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from pretraining_data import in_fresh_process  # a spawned child per measurement

ROOT = Path(__file__).resolve().parents[1]
GROUPING_WINDOW_BATCHES = 50  # as bertkit.train.batches


class TinyItems:
    """n examples whose items are their indices: measures the plan only."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        return index


# ---- the reference: the list-based plan before issue 23 (bertkit.train.batches at b448aeb) ----

def list_group_by_length(order: np.ndarray, lengths: np.ndarray, batch_size: int, rng: np.random.Generator):
    window = batch_size * GROUPING_WINDOW_BATCHES
    batches = []
    for start in range(0, len(order), window):
        chunk = order[start:start + window]
        chunk = chunk[np.argsort(-lengths[chunk], kind="stable")]
        batches += [chunk[i:i + batch_size] for i in range(0, len(chunk), batch_size)]
    tail = [batches.pop()] if len(batches[-1]) < batch_size else []
    shuffled = [batches[i] for i in rng.permutation(len(batches))]
    return np.concatenate(shuffled + tail)


class ListPlan:
    """The previous EpochBatches' plan and iteration (the parts that cost per example)."""

    def __init__(self, dataset, collate_fn, *, micro_batch_size, accumulation, rank, world_size, seed,
                 lengths=None):
        self.dataset, self.collate_fn, self.lengths = dataset, collate_fn, lengths
        self.micro_batch_size, self.accumulation = micro_batch_size, accumulation
        self.rank, self.world_size, self.seed = rank, world_size, seed
        self.num_examples = len(dataset)
        self.global_batch_size = micro_batch_size * accumulation * world_size
        self.epoch, self.samples_in_epoch = 0, 0

    def restore(self, position):
        self.epoch, self.samples_in_epoch = position["epoch"], position["samples_in_epoch"]

    def permutation(self, epoch):
        rng = np.random.default_rng([self.seed, epoch])
        order = rng.permutation(self.num_examples)
        if self.lengths is None:
            return order
        return list_group_by_length(order, self.lengths, self.global_batch_size, rng)

    def _plan(self, order, start):
        parts = self.accumulation * self.world_size
        for offset in range(start, len(order), self.global_batch_size):
            global_batch = order[offset:offset + self.global_batch_size]
            if len(global_batch) < parts:
                break
            pieces = np.array_split(global_batch, parts)
            mine = pieces[self.rank * self.accumulation:(self.rank + 1) * self.accumulation]
            yield [piece.tolist() for piece in mine], len(global_batch)

    def __iter__(self):
        import torch
        from torch.utils.data import DataLoader

        plan = list(self._plan(self.permutation(self.epoch), self.samples_in_epoch))
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        loader = iter(DataLoader(self.dataset, batch_sampler=[ids for step, _ in plan for ids in step],
                                 collate_fn=self.collate_fn, generator=generator))
        for step_ids, global_size in plan:
            yield [next(loader) for _ in step_ids], global_size


# ---- measuring ----

def _status_kib(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def _reset_peak_rss() -> bool:
    """Linux: writing 5 to clear_refs resets VmHWM (the peak RSS) to the current RSS."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def measure(implementation: str, examples: int, resume: bool, options: dict[str, Any], queue) -> None:
    """Time and peak added RSS from creating the iterator to holding the first step's batches."""
    sys.path.insert(0, str(ROOT / "src"))
    from bertkit.train.batches import EpochBatches, count_steps_per_epoch

    lengths = None
    if options["group_by_length"]:
        lengths = np.random.default_rng(0).integers(1, 513, size=examples, dtype=np.int16)
    kind = EpochBatches if implementation == "bertkit" else ListPlan
    batches = kind(TinyItems(examples), list, micro_batch_size=options["micro_batch_size"],
                   accumulation=options["accumulation"], rank=0, world_size=options["world_size"], seed=0,
                   lengths=lengths)
    global_batch = batches.global_batch_size
    steps = count_steps_per_epoch(examples, global_batch, options["accumulation"] * options["world_size"])
    if resume:
        batches.restore({"epoch": 0, "samples_in_epoch": steps // 2 * global_batch,
                         "global_batch_size": global_batch, "skipped_samples": 0})
    gc.collect()
    exact_peak = _reset_peak_rss()
    before_kib = _status_kib("VmRSS") if exact_peak else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    next(iter(batches))
    seconds = time.perf_counter() - start
    peak_kib = (_status_kib("VmHWM") if exact_peak else None) or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    queue.put({"seconds": seconds, "added_mib": (peak_kib - before_kib) / 1024, "exact_peak": exact_peak})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=100_000_000, help="examples in the epoch (bertkit)")
    parser.add_argument("--reference-examples", type=int, default=None,
                        help="examples for the list-based reference (default: --examples); fewer are "
                             "extrapolated linearly to --examples")
    parser.add_argument("--micro-batch-size", type=int, default=32)
    parser.add_argument("--accumulation", type=int, default=1)
    parser.add_argument("--world-size", type=int, default=1, help="processes (this measures rank 0)")
    parser.add_argument("--group-by-length", action="store_true", help="with per-example lengths grouping")
    parser.add_argument("--skip-reference", action="store_true")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "src"))
    from bertkit.runtime import probe

    options = {"micro_batch_size": args.micro_batch_size, "accumulation": args.accumulation,
               "world_size": args.world_size, "group_by_length": args.group_by_length}
    reference_examples = args.reference_examples or args.examples
    print(f"# machine: {probe.machine().line()}")
    print(f"# {time.strftime('%Y-%m-%d')}; global batch {args.micro_batch_size * args.accumulation * args.world_size}"
          f" (micro {args.micro_batch_size} x accumulation {args.accumulation} x world {args.world_size}), rank 0, "
          f"grouping by length {'on' if args.group_by_length else 'off'}; load average before "
          f"{os.getloadavg()[0]:.2f} ({os.cpu_count()} cores)")
    rows = []
    for implementation, examples in [("bertkit", args.examples)] + (
            [] if args.skip_reference else [("list plan (before)", reference_examples)]):
        for resume in (False, True):
            result = in_fresh_process(measure, "bertkit" if implementation == "bertkit" else "list", examples, resume,
                                      options)
            rows.append((implementation, examples, resume, result))
    print("\n| plan | examples | start | time to first batch | peak added RSS | bytes / example |")
    print("|---|---|---|---|---|---|")
    for implementation, examples, resume, result in rows:
        start = "resume at mid-epoch" if resume else "fresh epoch"
        per_example = result["added_mib"] * 2**20 / examples
        print(f"| {implementation} | {examples:,} | {start} | {result['seconds']:.2f} s | "
              f"{result['added_mib']:,.0f} MiB | {per_example:.1f} |")
        if examples != args.examples:
            scale = args.examples / examples
            print(f"| {implementation}, extrapolated | {args.examples:,} | {start} | "
                  f"~{result['seconds'] * scale:.1f} s | ~{result['added_mib'] * scale:,.0f} MiB | {per_example:.1f} |")
    if not all(result["exact_peak"] for *_, result in rows):
        print("(no /proc/self/clear_refs: peak added RSS is ru_maxrss growth, a lower bound)")
    print(f"\nload average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
