"""The resumable batch source: epochs over a map-style dataset, shuffled per epoch, sharded by rank.

Design decision: the data position is counted in *global samples*. Each epoch is one permutation of the
dataset drawn from (seed, epoch); optimizer step s of the epoch takes the next global batch of
micro_batch_size x accumulation x world_size indices from it, and this process keeps its share, cut
into `accumulation` micro-batches. Because the position is (epoch, samples consumed in the epoch), a run
resumes at the exact next sample, mid-epoch, and even at a different world size as long as the global
batch is the same. A last global batch too small to give every process and micro-step at least one
sample is skipped and counted (it is a different subset every epoch because of the shuffle).

With per-example `lengths`, each epoch's permutation is grouped by length: windows of
GROUPING_WINDOW_BATCHES global batches are sorted by length and cut into global batches, whose order
is then shuffled — so a batch holds similar lengths (little padding) while the epoch stays random.
It is drawn from the same (seed, epoch) generator, so resume stays exact.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from bertkit.errors import BertkitError

logger = logging.getLogger(__name__)

GROUPING_WINDOW_BATCHES = 50  # global batches sorted together when grouping by length


def group_by_length(order: np.ndarray, lengths: np.ndarray, batch_size: int, rng: np.random.Generator) -> np.ndarray:
    """Reorder a permutation so each run of `batch_size` holds similar lengths; batch order shuffled."""
    window = batch_size * GROUPING_WINDOW_BATCHES
    batches = []
    for start in range(0, len(order), window):
        chunk = order[start:start + window]
        chunk = chunk[np.argsort(-lengths[chunk], kind="stable")]  # longest first within the window
        batches += [chunk[i:i + batch_size] for i in range(0, len(chunk), batch_size)]
    tail = [batches.pop()] if len(batches[-1]) < batch_size else []  # a short last batch stays last
    shuffled = [batches[i] for i in rng.permutation(len(batches))]
    return np.concatenate(shuffled + tail)


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


class EpochBatches:
    """Iterates StepBatches forever (epoch after epoch); `position()` / `restore()` make it resumable."""

    def __init__(self, dataset: Dataset, collate_fn: Callable[[list[Any]], Any] | None, *,
                 micro_batch_size: int, accumulation: int, rank: int, world_size: int, seed: int,
                 shuffle: bool = True, num_workers: int = 0, lengths: Any = None) -> None:
        self.dataset, self.collate_fn = dataset, collate_fn
        self.lengths = None if lengths is None else np.asarray(lengths)
        self.micro_batch_size, self.accumulation = micro_batch_size, accumulation
        self.rank, self.world_size, self.seed = rank, world_size, seed
        self.shuffle, self.num_workers = shuffle, num_workers
        self.num_examples = len(dataset)  # type: ignore[arg-type]  # torch's Dataset declares no __len__
        self.global_batch_size = micro_batch_size * accumulation * world_size
        self.epoch, self.samples_in_epoch = 0, 0
        self.skipped_samples = 0
        if self.num_examples < accumulation * world_size:
            raise BertkitError(
                f"the training data has {self.num_examples} examples, fewer than one per micro-step and "
                f"process ({accumulation} x {world_size}); use more data or fewer accumulation steps")

    @property
    def steps_per_epoch(self) -> int:
        return count_steps_per_epoch(self.num_examples, self.global_batch_size, self.accumulation * self.world_size)

    def position(self) -> dict[str, int]:
        """The data position after the last step handed out (JSON-able)."""
        return {"epoch": self.epoch, "samples_in_epoch": self.samples_in_epoch,
                "global_batch_size": self.global_batch_size, "skipped_samples": self.skipped_samples}

    def restore(self, position: dict[str, int]) -> None:
        self.epoch, self.samples_in_epoch = position["epoch"], position["samples_in_epoch"]
        self.skipped_samples = position.get("skipped_samples", 0)

    def permutation(self, epoch: int) -> np.ndarray:
        """The sample order of `epoch`, the same on every process and every run."""
        if not self.shuffle:
            return np.arange(self.num_examples)
        rng = np.random.default_rng([self.seed, epoch])
        order = rng.permutation(self.num_examples)
        if self.lengths is None:
            return order
        return group_by_length(order, self.lengths, self.global_batch_size, rng)

    def _plan(self, order: np.ndarray, start: int) -> Iterator[tuple[list[list[int]], int]]:
        """(this process's micro-batch index lists, global batch size) for each step from `start` on."""
        parts = self.accumulation * self.world_size
        for offset in range(start, len(order), self.global_batch_size):
            global_batch = order[offset:offset + self.global_batch_size]
            if len(global_batch) < parts:
                break
            # Even split into world_size x accumulation parts; this rank owns a contiguous run of them.
            pieces = np.array_split(global_batch, parts)
            mine = pieces[self.rank * self.accumulation:(self.rank + 1) * self.accumulation]
            yield [piece.tolist() for piece in mine], len(global_batch)

    def _loader(self, micro_index_lists: list[list[int]], epoch: int) -> DataLoader:
        # A seeded generator keeps DataLoader from drawing from the global torch RNG (exact resume).
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return DataLoader(self.dataset, batch_sampler=micro_index_lists, collate_fn=self.collate_fn,
                          num_workers=self.num_workers, generator=generator)

    def __iter__(self) -> Iterator[StepBatch]:
        while True:
            if hasattr(self.dataset, "set_epoch"):
                self.dataset.set_epoch(self.epoch)
            plan = list(self._plan(self.permutation(self.epoch), self.samples_in_epoch))
            loader = iter(self._loader([ids for step, _ in plan for ids in step], self.epoch))
            for step_ids, global_size in plan:
                micro_batches = [next(loader) for _ in step_ids]
                self.samples_in_epoch += global_size
                yield StepBatch(micro_batches, [len(ids) for ids in step_ids], global_size)
            tail = self.num_examples - self.samples_in_epoch
            if tail:
                self.skipped_samples += tail
                logger.info("epoch %d: %d samples left over after the last full global batch were skipped",
                            self.epoch, tail)
            self.epoch, self.samples_in_epoch = self.epoch + 1, 0
