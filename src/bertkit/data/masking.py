"""Masked-LM masking: Google's rules, vectorised over a batch of instances, plus the original's loop.

The rules (google-research/bert `create_masked_lm_predictions`): the number of predictions is
min(max_predictions_per_seq, max(1, round(len(tokens) * masked_lm_prob))) with `len` counting the
specials; candidates are every position except [CLS] and [SEP]; candidates are taken in a uniformly
random order (whole words as units with whole-word masking, where a `##` piece joins the word
before it, and a word that would overshoot the quota is skipped); each chosen position becomes
[MASK] with probability 0.8, a uniformly random vocabulary id with 0.1, and stays with 0.1.

Design decision: two executions of the same rules. `mask_positions` (and `mask_batch`, which adds
dense labels) draws from a numpy Generator and handles a whole block of instances with a few array
operations (random keys distinct within each instance, one row sort, a threshold at the quota),
which is what makes data creation and on-the-fly (dynamic) masking fast.
`google_mask_fn` is the original's per-token loop, drawing from a `random.Random` in the original's
order; with it, instances are identical to the original's for the same generator state (the parity
test checks this). Both are tested against the same statistical claims.

References: Devlin et al. 2018 (arXiv:1810.04805), section 3.1; google-research/bert
`create_pretraining_data.py` and its whole-word-masking note in README.md.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from bertkit.data.instances import MaskFn

IGNORE_INDEX = -100
"""Label of positions that are not predicted (PyTorch's cross-entropy default ignore_index)."""


@dataclass(frozen=True)
class MaskingVocab:
    """What masking needs to know about the vocabulary."""

    vocab_size: int
    mask_id: int
    cls_id: int
    sep_id: int
    continuation: np.ndarray | None = None
    """(vocab_size,) bool: the token starts with '##' (whole-word masking only; None otherwise)."""

    @classmethod
    def from_tokenizer(cls, tokenizer, whole_word: bool) -> MaskingVocab:
        continuation = None
        if whole_word:
            tokens = tokenizer.convert_ids_to_tokens(list(range(tokenizer.vocab_size)))
            continuation = np.fromiter((t.startswith("##") for t in tokens), dtype=bool, count=len(tokens))
        return cls(tokenizer.vocab_size, tokenizer.mask_token_id, tokenizer.cls_token_id,
                   tokenizer.sep_token_id, continuation)


def prediction_quota(length: int | np.ndarray, masked_lm_prob: float, max_predictions: int):
    """How many positions an instance of `length` tokens (specials included) predicts."""
    # np.rint and Python's round both round halves to even.
    return np.minimum(max_predictions, np.maximum(1, np.rint(np.asarray(length) * masked_lm_prob).astype(np.int64)))


def prediction_cap(max_seq_length: int, masked_lm_prob: float) -> int:
    """The cap on predictions per instance that lets `masked_lm_prob` mask its share of the longest instance:
    `prediction_quota` of `max_seq_length` tokens with no cap (19 at 64 tokens and 0.3, 29 at 96)."""
    return int(prediction_quota(max_seq_length, masked_lm_prob, np.iinfo(np.int64).max))


def mask_batch(ids: np.ndarray, offsets: np.ndarray, masked_lm_prob: float, max_predictions: int,
               vocab: MaskingVocab, gen: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Mask every instance of a flat batch: `ids` (N,) holds instance k at offsets[k]:offsets[k+1].

    Returns (masked ids (N,) int64, labels (N,) int64 with the original id where predicted, -100
    elsewhere). Whole-word masking is on when `vocab.continuation` is set.
    """
    ids = np.asarray(ids, dtype=np.int64)
    masked, positions = mask_positions(ids, offsets, masked_lm_prob, max_predictions, vocab, gen)
    labels = np.full(len(ids), IGNORE_INDEX, dtype=np.int64)
    labels[positions] = ids[positions]
    return masked, labels


def mask_positions(ids: np.ndarray, offsets: np.ndarray, masked_lm_prob: float, max_predictions: int,
                   vocab: MaskingVocab, gen: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """`mask_batch` without the dense labels: (masked ids (N,) in ids' dtype, predicted positions (P,)
    ascending indices into ids). The original ids at the positions are the labels."""
    lengths = np.diff(offsets)
    candidate = (ids != vocab.cls_id) & (ids != vocab.sep_id)
    quota = prediction_quota(lengths, masked_lm_prob, max_predictions)
    if vocab.continuation is None:
        chosen = _choose_tokens(candidate, lengths, quota, gen)
    else:
        instance_of = np.repeat(np.arange(len(lengths)), lengths)  # (N,) instance of each token
        chosen = _choose_whole_words(ids, candidate, instance_of, offsets, quota, vocab.continuation, gen)
    positions = np.flatnonzero(chosen)
    return _replace(ids, positions, vocab, gen), positions


def _choose_tokens(candidate, lengths, quota, gen) -> np.ndarray:
    """(N,) bool: the first quota[k] candidates of instance k in a uniformly random order."""
    width = int(lengths.max(initial=0))
    valid = np.arange(width) < lengths[:, None]  # (n, T) real positions of the padded layout
    padded = np.zeros(valid.shape, dtype=bool)  # (n, T) candidates
    padded[valid] = candidate
    keys = _random_keys(valid.shape, gen)
    keys[~padded] = np.iinfo(keys.dtype).max
    # quota[k]-th smallest key of row k; keys are distinct within a row, so exactly quota[k] are <= it
    # (or every candidate, when a row has fewer candidates than its quota).
    kth = np.sort(keys, axis=1)[np.arange(len(lengths)), np.minimum(quota, width) - 1]
    return (padded & (keys <= kth[:, None]))[valid]


def _random_keys(shape: tuple[int, int], gen: np.random.Generator) -> np.ndarray:
    """(n, T) random sort keys, distinct within a row: random high bits, the column in the low bits."""
    width = shape[1]
    column_bits = max(1, (width - 1).bit_length())
    dtype = np.uint32 if column_bits <= 8 else np.uint64  # keep >= 24 random bits (ties ~2^-24)
    size = shape[0] * shape[1]
    raw = gen.bit_generator.random_raw(-(-size * np.dtype(dtype).itemsize // 8))  # 64 random bits each
    keys: np.ndarray = raw.view(dtype)[:size].reshape(shape)  # dtype chosen at run time: the stubs cannot know it
    keys &= ~dtype(2**column_bits - 1)  # clear the low bits, then put the column there
    keys |= np.arange(width, dtype=dtype)
    return keys


def _choose_whole_words(ids, candidate, instance_of, offsets, quota, continuation, gen) -> np.ndarray:
    """(N,) bool: whole words in random order, skipping any that would overshoot the quota."""
    earlier = np.cumsum(candidate) - candidate  # candidates before each position, whole batch
    has_earlier = earlier - earlier[offsets[:-1]][instance_of] > 0
    # A '##' piece joins the previous candidate word of its instance, even across [SEP] (as the original).
    word_start = candidate & ~(continuation[ids] & has_earlier)
    word_of = np.cumsum(word_start) - 1  # (N,) word index, valid at candidates
    starts = np.flatnonzero(word_start)
    sizes = np.bincount(word_of[candidate], minlength=len(starts))
    word_instance = instance_of[starts]
    order = np.argsort(word_instance * 4.0 + gen.random(len(starts)), kind="stable")
    bounds = np.searchsorted(word_instance[order], np.arange(len(quota) + 1))
    order_list, sizes_list, quota_list = order.tolist(), sizes.tolist(), quota.tolist()
    word_chosen = np.zeros(len(starts), dtype=bool)
    for k, q in enumerate(quota_list):
        total = 0
        for w in order_list[bounds[k]:bounds[k + 1]]:
            if total >= q:
                break
            if total + sizes_list[w] <= q:
                word_chosen[w] = True
                total += sizes_list[w]
    return candidate & word_chosen[np.maximum(word_of, 0)]


def _replace(ids, positions, vocab: MaskingVocab, gen) -> np.ndarray:
    """`ids` with 80% [MASK] / 10% random id / 10% unchanged at `positions`."""
    u = gen.random(len(positions))
    masked = ids.copy()
    masked[positions[u < 0.8]] = vocab.mask_id
    random_token = positions[u >= 0.9]
    masked[random_token] = gen.integers(0, vocab.vocab_size, len(random_token))
    return masked


def google_mask_fn(masked_lm_prob: float, max_predictions: int, vocab: MaskingVocab) -> MaskFn:
    """The original's masking loop, drawing from the caller's `random.Random` in the original's order."""
    continuation = vocab.continuation.tolist() if vocab.continuation is not None else None

    def mask(tokens: list[int], rng: random.Random) -> tuple[list[int], list[int], list[int]]:
        words: list[list[int]] = []
        for i, token in enumerate(tokens):
            if token == vocab.cls_id or token == vocab.sep_id:
                continue
            if continuation is not None and words and continuation[token]:
                words[-1].append(i)
            else:
                words.append([i])
        rng.shuffle(words)
        quota = min(max_predictions, max(1, round(len(tokens) * masked_lm_prob)))
        output = list(tokens)
        positions: list[int] = []
        for word in words:
            if len(positions) >= quota:
                break
            if len(positions) + len(word) > quota:
                continue
            for index in word:
                if rng.random() < 0.8:
                    output[index] = vocab.mask_id
                elif rng.random() >= 0.5:  # else: keep the original token
                    output[index] = rng.randint(0, vocab.vocab_size - 1)
                positions.append(index)
        positions.sort()
        return output, positions, [tokens[p] for p in positions]

    return mask
