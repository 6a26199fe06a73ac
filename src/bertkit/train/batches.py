"""The resumable batch source: epochs over a map-style dataset, shuffled per epoch, sharded by rank.

Design decision: the data position is counted in *global samples*. Each epoch is one permutation of the
dataset drawn from (seed, epoch); optimizer step s of the epoch takes the next global batch of
micro_batch_size x accumulation x world_size indices from it, and this process keeps its share, cut
into `accumulation` micro-batches. Because the position is (epoch, samples consumed in the epoch), a run
resumes at the exact next sample, mid-epoch, and even at a different world size as long as the global
batch is the same. A last global batch too small to give every process and micro-step at least one
sample is skipped and counted (it is a different subset every epoch because of the shuffle); with
`full_batches_only` (a step compiled for static shapes), so is any last global batch smaller than the others.

With per-example `lengths`, each epoch's permutation is grouped by length: windows of
GROUPING_WINDOW_BATCHES global batches are sorted by length and cut into global batches, whose order
is then shuffled — so a batch holds similar lengths (little padding) while the epoch stays random.
It is drawn from the same (seed, epoch) generator, so resume stays exact.

The plan costs a few bytes per example, not a Python object: the permutation is one numpy array of
int32 indices (int64 past 2**31 examples), drawn by shuffling an arange in place (the same draws, hence
the same order, as `rng.permutation(n)`, in half its memory), and this process's micro-batch index
lists are cut from it one step at a time, as the DataLoader's batch_sampler asks for them, so a fresh
epoch or a resume mid-epoch builds nothing for the steps it does not reach. At 100M examples: 4 bytes an
example and ~19 s to the first batch on a 2-core EPYC, against 56 bytes and 128 s for the list plan it
replaced (benchmarks/epoch_order.py; docs/performance.md, "Epoch order at scale"). That time is the
Fisher-Yates shuffle, kept because it is the order earlier runs were trained and checkpointed with.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from bertkit.errors import BertkitError

logger = logging.getLogger(__name__)

GROUPING_WINDOW_BATCHES = 50  # global batches sorted together when grouping by length


def group_by_length(order: np.ndarray, lengths: np.ndarray, batch_size: int, rng: np.random.Generator) -> np.ndarray:
    """Reorder a permutation so each run of `batch_size` holds similar lengths; batch order shuffled.
    Arrays throughout (the grouped copy and the batch shuffle's), no object per batch or example."""
    window = batch_size * GROUPING_WINDOW_BATCHES  # a multiple of batch_size: batches never straddle windows
    grouped = np.empty_like(order)
    for start in range(0, len(order), window):
        chunk = order[start:start + window]
        grouped[start:start + window] = chunk[np.argsort(-lengths[chunk], kind="stable")]  # longest first
    full = len(order) // batch_size  # a short last batch stays last
    batches = grouped[:full * batch_size].reshape(full, batch_size)
    grouped[:full * batch_size] = batches[rng.permutation(full)].ravel()
    return grouped


def index_dtype(num_examples: int) -> type[np.signedinteger]:
    """The narrowest signed integer type holding every index of `num_examples` examples."""
    return np.int32 if num_examples <= 2**31 else np.int64


def count_steps_per_epoch(num_examples: int, global_batch_size: int, min_tail: int) -> int:
    """Optimizer steps in one epoch: full global batches, plus the tail if it has at least `min_tail`
    samples (one per process and micro-step; a smaller tail is skipped)."""
    full, tail = divmod(num_examples, global_batch_size)
    return full + (tail >= min_tail)


@dataclass
class StepBatch:
    """What one process feeds into one optimizer step."""

    micro_batches: list[Any]
    """`accumulation` collated micro-batches, in order."""
    micro_sizes: list[int]
    """Number of samples in each micro-batch."""
    global_size: int
    """Number of samples in the whole global batch (all processes, all micro-steps)."""
    ends_epoch: bool = False
    """Whether this is the epoch's last step (where end-of-epoch evaluations happen, whatever the world size)."""


class EpochBatches:
    """Iterates StepBatches forever (epoch after epoch); `position()` / `restore()` make it resumable."""

    def __init__(self, dataset: Dataset, collate_fn: Callable[[list[Any]], Any] | None, *,
                 micro_batch_size: int, accumulation: int, rank: int, world_size: int, seed: int,
                 shuffle: bool = True, num_workers: int = 0, lengths: Any = None, full_batches_only: bool = False,
                 pin_memory: bool = False) -> None:
        self.dataset, self.collate_fn = dataset, collate_fn
        self.lengths = None if lengths is None else np.asarray(lengths)
        self.micro_batch_size, self.accumulation = micro_batch_size, accumulation
        self.rank, self.world_size, self.seed = rank, world_size, seed
        self.shuffle, self.num_workers, self.pin_memory = shuffle, num_workers, pin_memory
        self.num_examples = len(dataset)  # type: ignore[arg-type]  # torch's Dataset declares no __len__
        self.global_batch_size = micro_batch_size * accumulation * world_size
        self.min_tail = self.global_batch_size if full_batches_only else accumulation * world_size
        """The smallest last global batch of an epoch that is trained on (smaller ones are skipped and counted)."""
        self.epoch, self.samples_in_epoch = 0, 0
        self.skipped_samples = 0
        self.phase: Callable[[int], Any] | None = None
        """`phase(step)`: the key read with each index of the batch of the step after `step` steps (items are then
        `dataset[(index, key)]`, `TrainingData.phase`); None: `dataset[index]`."""
        if self.num_examples < accumulation * world_size:
            raise BertkitError(
                f"the training data has {self.num_examples} examples, fewer than one per micro-step and "
                f"process ({accumulation} x {world_size}); use more data or fewer accumulation steps")

    @property
    def steps_per_epoch(self) -> int:
        return count_steps_per_epoch(self.num_examples, self.global_batch_size, self.min_tail)

    def position(self) -> dict[str, int]:
        """The data position after the last step handed out (JSON-able)."""
        return {"epoch": self.epoch, "samples_in_epoch": self.samples_in_epoch,
                "global_batch_size": self.global_batch_size, "skipped_samples": self.skipped_samples,
                "steps_per_epoch": self.steps_per_epoch}

    def restore(self, position: dict[str, int]) -> None:
        self.epoch, self.samples_in_epoch = position["epoch"], position["samples_in_epoch"]
        self.skipped_samples = position.get("skipped_samples", 0)
        before = position.get("steps_per_epoch")  # checkpoints of older versions lack it
        if before is not None and before != self.steps_per_epoch:
            logger.warning("an epoch is %d optimizer steps with %d process(es) x %d micro-step(s) and was %d where "
                           "the run was saved: an epoch's last global batch is skipped when it cannot give every "
                           "micro-step a sample, so --epochs budgets count the new steps (end-of-epoch "
                           "evaluations still happen where each epoch ends)", self.steps_per_epoch,
                           self.world_size, self.accumulation, before)

    def permutation(self, epoch: int) -> np.ndarray:
        """The sample order of `epoch`, the same on every process and every run."""
        order = np.arange(self.num_examples, dtype=index_dtype(self.num_examples))
        if not self.shuffle:
            return order
        rng = np.random.default_rng([self.seed, epoch])
        rng.shuffle(order)  # rng.permutation(n)'s draws and order, without its int64 copy
        if self.lengths is None:
            return order
        return group_by_length(order, self.lengths, self.global_batch_size, rng)

    def _plan(self, epoch: int) -> _EpochPlan:
        """This process's plan of `epoch` from the current position: the permutation, cut lazily."""
        parts = self.accumulation * self.world_size
        return _EpochPlan(self.permutation(epoch), self.samples_in_epoch, self.global_batch_size, parts,
                          range(self.rank * self.accumulation, (self.rank + 1) * self.accumulation), self.min_tail)

    def _loader(self, batch_sampler: Iterable[list[int]], epoch: int) -> DataLoader:
        # A seeded generator keeps DataLoader from drawing from the global torch RNG (exact resume).
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return DataLoader(self.dataset, batch_sampler=batch_sampler, collate_fn=self.collate_fn,
                          num_workers=self.num_workers, generator=generator, pin_memory=self.pin_memory,
                          worker_init_fn=ignore_stop_signals if self.num_workers else None)

    def __iter__(self) -> Iterator[StepBatch]:
        return self.iterate(0)

    def iterate(self, first_step: int) -> Iterator[StepBatch]:
        """StepBatches from the current position; the first feeds the step after `first_step` steps (what
        `phase` is asked about)."""
        step = first_step
        while True:
            if hasattr(self.dataset, "set_epoch"):
                self.dataset.set_epoch(self.epoch)
            plan = self._plan(self.epoch)
            loader = iter(self._loader(_MicroBatchSampler(plan, step, self.phase), self.epoch))
            step += len(plan)
            remaining = len(plan)
            for index, (pieces, global_size) in enumerate(plan.steps()):
                micro_batches = [next(loader) for _ in pieces]
                self.samples_in_epoch += global_size
                yield StepBatch(micro_batches, [piece.stop - piece.start for piece in pieces], global_size,
                                ends_epoch=index == remaining - 1)
            tail = self.num_examples - self.samples_in_epoch
            if tail:
                self.skipped_samples += tail
                logger.info("epoch %d: %d samples left over after the last full global batch were skipped",
                            self.epoch, tail)
            self.epoch, self.samples_in_epoch = self.epoch + 1, 0


@dataclass(frozen=True)
class _EpochPlan:
    """This process's share of an epoch from sample `start` on, as slices of `order`, computed a step at a
    time (nothing is built for steps not reached)."""

    order: np.ndarray
    start: int
    global_batch_size: int
    parts: int
    """world_size x accumulation: each global batch is split evenly into this many micro-batches."""
    mine: range
    """The indices of this process's micro-batches among the parts (a contiguous run of `accumulation`)."""
    min_size: int
    """The smallest global batch trained on (`EpochBatches.min_tail`)."""

    def steps(self) -> Iterator[tuple[list[slice], int]]:
        """(this process's micro-batches as slices of `order`, the global batch size) for each step."""
        for offset in range(self.start, len(self.order), self.global_batch_size):
            size = min(self.global_batch_size, len(self.order) - offset)
            if size < self.min_size:
                return
            yield [_piece(offset, size, self.parts, part) for part in self.mine], size

    def __len__(self) -> int:
        return count_steps_per_epoch(max(0, len(self.order) - self.start), self.global_batch_size, self.min_size)


def _piece(offset: int, size: int, parts: int, part: int) -> slice:
    """Piece `part` of the `size` samples at `offset` split into `parts` near-equal pieces, as
    np.array_split cuts them: the first size % parts pieces are one longer."""
    base, longer = divmod(size, parts)
    start = offset + part * base + min(part, longer)
    return slice(start, start + base + (part < longer))


class _MicroBatchSampler:
    """The DataLoader's batch_sampler: this process's micro-batch index lists, made as they are asked for
    (it lives in the main process; workers receive the lists)."""

    def __init__(self, plan: _EpochPlan, first_step: int = 0, phase: Callable[[int], Any] | None = None) -> None:
        self.plan, self.first_step, self.phase = plan, first_step, phase

    def __iter__(self) -> Iterator[list[Any]]:
        for number, (pieces, _) in enumerate(self.plan.steps()):
            key = None if self.phase is None else self.phase(self.first_step + number)
            for piece in pieces:
                indices = self.plan.order[piece].tolist()
                yield indices if self.phase is None else [(index, key) for index in indices]

    def __len__(self) -> int:
        return len(self.plan) * len(self.plan.mine)


def ignore_stop_signals(worker_id: int) -> None:
    """A DataLoader worker ignores SIGTERM and SIGINT: its training process decides when to stop. torchrun stops a
    job with `killpg(SIGTERM)` and a terminal's Ctrl-C reaches the whole process group, so without this the
    workers die first and the DataLoader raises in the training process before it can save the step."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
