"""Sliding windows over token sequences longer than the model's input: SQuAD contexts and tagged sentences.

A sequence of `length` tokens is cut into windows of at most `window` tokens that start every `stride`
tokens, the last one reaching the end (the original `doc_span` rule). A token in several windows is
read from the one where it has the most context (`max_context_flags`), so each token is predicted once.

Design decision: pure functions over lengths and (start, size) spans, with no tokens or tasks involved,
so question answering and tagging share them and they are tested on their own.

Reference: google-research/bert `run_squad.py` (`doc_stride`, `_check_is_max_context`).
"""

from __future__ import annotations

from collections.abc import Sequence


def sliding_windows(length: int, window: int, stride: int) -> list[tuple[int, int]]:
    """(start, length) of windows over `length` tokens: each starts `stride` after the previous one,
    and the last one reaches the end (the original doc-span rule)."""
    spans, start = [], 0
    while True:
        size = min(length - start, window)
        spans.append((start, size))
        if start + size >= length:
            return spans
        start += min(size, stride)


def max_context_flags(spans: Sequence[tuple[int, int]]) -> list[list[bool]]:
    """For each window, whether each of its tokens has its maximum context there: the window where
    min(tokens left, tokens right) + 0.01 * window length is largest (first one on ties)."""
    best: dict[int, tuple[float, int]] = {}
    for index, (start, size) in enumerate(spans):
        for position in range(start, start + size):
            score = min(position - start, start + size - 1 - position) + 0.01 * size
            if position not in best or score > best[position][0]:
                best[position] = (score, index)
    return [[best[p][1] == index for p in range(start, start + size)] for index, (start, size) in enumerate(spans)]
