"""Statistical and rule tests of masked-LM masking, for both executions (numpy batch, original loop).

Seeded runs over thousands of instances: the masked count is exactly the quota, the 80/10/10 split
holds within tolerance, [CLS]/[SEP] are never chosen, whole words are masked whole, and labels hold
the original ids.
"""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from bertkit.data.masking import IGNORE_INDEX, MaskingVocab, google_mask_fn, mask_batch, prediction_quota

VOCAB_SIZE, PAD, CLS, SEP, MASK = 1000, 0, 2, 3, 4
CONTINUATION = np.zeros(VOCAB_SIZE, dtype=bool)
CONTINUATION[500:] = True  # ids >= 500 play '##' pieces


def make_instances(n: int, seed: int, max_len: int = 128):
    """Flat [CLS] A [SEP] B [SEP] instances of random lengths; ids in [5, 1000)."""
    rng = np.random.default_rng(seed)
    instances = []
    for _ in range(n):
        a, b = rng.integers(1, max_len // 2 - 1, size=2)
        body = rng.integers(5, VOCAB_SIZE, size=a + b)
        instances.append(np.concatenate([[CLS], body[:a], [SEP], body[a:], [SEP]]))
    offsets = np.concatenate([[0], np.cumsum([len(i) for i in instances])])
    return np.concatenate(instances).astype(np.int64), offsets


def run_numpy(ids, offsets, whole_word):
    vocab = MaskingVocab(VOCAB_SIZE, MASK, CLS, SEP, CONTINUATION if whole_word else None)
    return mask_batch(ids, offsets, 0.15, 20, vocab, np.random.default_rng(0))


def run_google(ids, offsets, whole_word):
    vocab = MaskingVocab(VOCAB_SIZE, MASK, CLS, SEP, CONTINUATION if whole_word else None)
    mask = google_mask_fn(0.15, 20, vocab)
    rng = random.Random(0)
    masked, labels = ids.copy(), np.full(len(ids), IGNORE_INDEX)
    for start, stop in itertools.pairwise(offsets):
        out, positions, originals = mask(ids[start:stop].tolist(), rng)
        masked[start:stop] = out
        labels[start + np.array(positions, dtype=np.int64)] = originals
    return masked, labels


RUNNERS = {"numpy": run_numpy, "google": run_google}


@pytest.mark.parametrize("runner", RUNNERS)
def test_quota_specials_labels_and_80_10_10(runner):
    ids, offsets = make_instances(4000, seed=1)
    masked, labels = RUNNERS[runner](ids, offsets, whole_word=False)
    chosen = labels != IGNORE_INDEX
    lengths = np.diff(offsets)
    per_instance = np.add.reduceat(chosen, offsets[:-1])
    assert np.array_equal(per_instance, prediction_quota(lengths, 0.15, 20))  # exactly the quota
    assert not chosen[np.isin(ids, [CLS, SEP])].any()  # specials never masked
    assert np.array_equal(labels[chosen], ids[chosen])  # labels are the original ids
    assert np.array_equal(masked[~chosen], ids[~chosen])  # nothing else changes
    fraction = chosen.sum() / len(ids)
    assert 0.14 < fraction < 0.155  # ~15% (rounding per instance)
    n = chosen.sum()
    to_mask = (masked[chosen] == MASK).mean()
    unchanged = (masked[chosen] == ids[chosen]).mean()  # includes random picks equal to the original (~0.1%)
    tolerance = 4 * np.sqrt(0.1 * 0.9 / n)
    assert abs(to_mask - 0.8) < 4 * np.sqrt(0.8 * 0.2 / n)
    assert abs(unchanged - 0.1) < tolerance
    assert abs(1 - to_mask - unchanged - 0.1) < tolerance


@pytest.mark.parametrize("runner", RUNNERS)
def test_positions_uniform_over_candidates(runner):
    ids, offsets = make_instances(3000, seed=2, max_len=24)
    _, labels = RUNNERS[runner](ids, offsets, whole_word=False)
    # Position 1 (first token of A) vs the last token before the final [SEP]: same chance.
    first = labels[offsets[:-1] + 1] != IGNORE_INDEX
    last = labels[offsets[1:] - 2] != IGNORE_INDEX
    assert abs(first.mean() - last.mean()) < 0.04


def word_spans(instance: np.ndarray) -> list[list[int]]:
    """The original's grouping: a continuation joins the previous candidate word (even across [SEP])."""
    words: list[list[int]] = []
    for i, token in enumerate(instance):
        if token in (CLS, SEP):
            continue
        if words and CONTINUATION[token]:
            words[-1].append(i)
        else:
            words.append([i])
    return words


@pytest.mark.parametrize("runner", RUNNERS)
def test_whole_words_masked_whole(runner):
    ids, offsets = make_instances(1500, seed=3)
    _masked, labels = RUNNERS[runner](ids, offsets, whole_word=True)
    chosen = labels != IGNORE_INDEX
    quota = prediction_quota(np.diff(offsets), 0.15, 20)
    partial = 0
    for k, (start, stop) in enumerate(itertools.pairwise(offsets)):
        flags = chosen[start:stop]
        assert flags.sum() <= quota[k]
        for word in word_spans(ids[start:stop]):
            partial += 0 < flags[word].sum() < len(word)
    assert partial == 0
    assert not chosen[np.isin(ids, [CLS, SEP])].any()
    assert 0.12 < chosen.mean() < 0.155  # words that would overshoot are skipped, so a little under


def test_numpy_masking_is_seeded():
    ids, offsets = make_instances(50, seed=4)
    vocab = MaskingVocab(VOCAB_SIZE, MASK, CLS, SEP)
    a = mask_batch(ids, offsets, 0.15, 20, vocab, np.random.default_rng(7))
    b = mask_batch(ids, offsets, 0.15, 20, vocab, np.random.default_rng(7))
    c = mask_batch(ids, offsets, 0.15, 20, vocab, np.random.default_rng(8))
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not np.array_equal(a[1], c[1])
