"""The lazy, array-based epoch plan of `EpochBatches` hands out exactly what the list-based plan did
before it (the reference below is that code, kept verbatim in algorithm): same order for the same seed,
for several sizes, world sizes, accumulations, with and without length grouping and without shuffle,
across epochs and from a mid-epoch resume; DataLoader workers change nothing; and the plan costs a few
bytes per example instead of Python lists of every index."""

from __future__ import annotations

import tracemalloc
from itertools import islice

import numpy as np
import pytest

from bertkit.train.batches import GROUPING_WINDOW_BATCHES, EpochBatches, group_by_length

# ---- the reference: the list-based plan as it was before the lazy one ----


def reference_group_by_length(order, lengths, batch_size, rng):
    window = batch_size * GROUPING_WINDOW_BATCHES
    batches = []
    for start in range(0, len(order), window):
        chunk = order[start:start + window]
        chunk = chunk[np.argsort(-lengths[chunk], kind="stable")]
        batches += [chunk[i:i + batch_size] for i in range(0, len(chunk), batch_size)]
    tail = [batches.pop()] if len(batches[-1]) < batch_size else []
    shuffled = [batches[i] for i in rng.permutation(len(batches))]
    return np.concatenate(shuffled + tail)


def reference_permutation(n, seed, epoch, shuffle, lengths, global_batch_size):
    if not shuffle:
        return np.arange(n)
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(n)
    if lengths is None:
        return order
    return reference_group_by_length(order, lengths, global_batch_size, rng)


def reference_steps(n, *, micro, accumulation, rank, world_size, seed, shuffle=True, lengths=None,
                    epoch=0, samples_in_epoch=0):
    """(micro-batch index lists, global size) per step, epoch after epoch, from the given position."""
    global_batch_size, parts = micro * accumulation * world_size, accumulation * world_size
    while True:
        order = reference_permutation(n, seed, epoch, shuffle, lengths, global_batch_size)
        for offset in range(samples_in_epoch, len(order), global_batch_size):
            global_batch = order[offset:offset + global_batch_size]
            if len(global_batch) < parts:
                break
            pieces = np.array_split(global_batch, parts)
            mine = pieces[rank * accumulation:(rank + 1) * accumulation]
            yield [piece.tolist() for piece in mine], len(global_batch)
        epoch, samples_in_epoch = epoch + 1, 0


# ---- the comparisons ----


def _batches(n, micro, accumulation, rank, world_size, seed=5, lengths=None, shuffle=True, workers=0):
    return EpochBatches(list(range(n)), list, micro_batch_size=micro, accumulation=accumulation, rank=rank,
                        world_size=world_size, seed=seed, shuffle=shuffle, num_workers=workers, lengths=lengths)


def _steps(batches, count):
    return [(step.micro_batches, step.global_size, step.micro_sizes) for step in islice(batches, count)]


def _expected(reference, count):
    return [(ids, size, [len(i) for i in ids]) for ids, size in islice(reference, count)]


CASES = [  # (examples, micro-batch size, accumulation, world size)
    (1, 1, 1, 1), (7, 2, 1, 1), (7, 1, 2, 3), (100, 3, 2, 1), (100, 4, 1, 3), (1003, 8, 2, 2), (1003, 5, 3, 4),
]


@pytest.mark.parametrize("grouped", [False, True], ids=["plain", "grouped"])
@pytest.mark.parametrize("n,micro,accumulation,world_size", CASES)
def test_same_order_as_the_list_plan(n, micro, accumulation, world_size, grouped):
    lengths = np.random.default_rng(n).integers(1, 129, size=n) if grouped else None
    for rank in range(world_size):
        batches = _batches(n, micro, accumulation, rank, world_size, lengths=lengths)
        count = 2 * batches.steps_per_epoch + 1  # two epochs and the first step of a third
        reference = reference_steps(n, micro=micro, accumulation=accumulation, rank=rank,
                                    world_size=world_size, seed=5, lengths=lengths)
        assert _steps(batches, count) == _expected(reference, count)
        assert batches.position()["epoch"] == 2


@pytest.mark.parametrize("n,micro,accumulation,world_size", [(100, 3, 2, 1), (1003, 8, 2, 2)])
def test_same_order_without_shuffle(n, micro, accumulation, world_size):
    batches = _batches(n, micro, accumulation, world_size - 1, world_size, shuffle=False)
    count = batches.steps_per_epoch + 2
    reference = reference_steps(n, micro=micro, accumulation=accumulation, rank=world_size - 1,
                                world_size=world_size, seed=5, shuffle=False)
    assert _steps(batches, count) == _expected(reference, count)


@pytest.mark.parametrize("grouped", [False, True], ids=["plain", "grouped"])
def test_same_order_after_a_mid_epoch_resume(grouped):
    n, micro, accumulation, world_size = 995, 4, 2, 2  # 995 % 16 = 3 < 4 parts: the tail is skipped
    lengths = np.random.default_rng(1).integers(1, 129, size=n) if grouped else None
    first = _batches(n, micro, accumulation, 1, world_size, lengths=lengths)
    _steps(first, first.steps_per_epoch + 7)  # into the second epoch
    position = first.position()
    assert position["epoch"] == 1 and position["samples_in_epoch"] == 7 * first.global_batch_size
    assert position["skipped_samples"] == 3
    resumed = _batches(n, micro, accumulation, 1, world_size, lengths=lengths)
    resumed.restore(position)
    reference = reference_steps(n, micro=micro, accumulation=accumulation, rank=1, world_size=world_size,
                                seed=5, lengths=lengths, epoch=1, samples_in_epoch=position["samples_in_epoch"])
    count = resumed.steps_per_epoch
    assert _steps(resumed, count) == _expected(reference, count)
    assert resumed.skipped_samples == 6


def test_group_by_length_equals_the_list_version():
    rng_a, rng_b = np.random.default_rng(4), np.random.default_rng(4)
    for n, batch_size in [(1, 1), (50, 7), (5000, 16), (5000, 10)]:
        order = np.random.default_rng(n).permutation(n)
        lengths = np.random.default_rng(n + 1).integers(1, 20, size=n)  # many ties: the stable sort matters
        np.testing.assert_array_equal(group_by_length(order.astype(np.int32), lengths, batch_size, rng_a),
                                      reference_group_by_length(order, lengths, batch_size, rng_b))


def test_workers_hand_out_the_same_batches():
    plain, with_workers = _batches(103, 3, 2, 0, 2), _batches(103, 3, 2, 0, 2, workers=2)
    count = plain.steps_per_epoch + 2
    assert _steps(with_workers, count) == _steps(plain, count)


class _TinyItems:
    """A dataset of n examples whose items are their indices: measures the plan, nothing else."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        return index


def _peak_bytes_to_first_step(batches: EpochBatches) -> int:
    tracemalloc.start()  # numpy reports its buffers to tracemalloc, so the permutation is counted
    try:
        next(iter(batches))
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("grouped,bytes_per_example", [(False, 4), (True, 12)], ids=["plain", "grouped"])
def test_the_plan_costs_a_few_bytes_per_example(grouped, bytes_per_example):
    """The int32 permutation (4 bytes an example; grouping adds its sorted copy and the batch shuffle's) and
    one step's lists, fresh and resumed near the end of the epoch. The list plan took ~30 bytes an example
    here (tracemalloc's count; its RSS grew by ~56)."""
    n, slack = 1_000_000, 2**21  # slack: one step's lists, DataLoader's own objects
    lengths = np.random.default_rng(0).integers(1, 129, size=n, dtype=np.int16) if grouped else None
    fresh = EpochBatches(_TinyItems(n), list, micro_batch_size=32, accumulation=2, rank=0, world_size=2,
                         seed=0, lengths=lengths)
    assert _peak_bytes_to_first_step(fresh) < bytes_per_example * n + slack
    resumed = EpochBatches(_TinyItems(n), list, micro_batch_size=32, accumulation=2, rank=0, world_size=2,
                           seed=0, lengths=lengths)
    resumed.restore({"epoch": 3, "samples_in_epoch": (fresh.steps_per_epoch - 2) * fresh.global_batch_size})
    assert _peak_bytes_to_first_step(resumed) < bytes_per_example * n + slack
