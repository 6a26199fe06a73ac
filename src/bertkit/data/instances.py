"""Next-sentence-prediction pairs: Google's instance rules as pure functions over token-id lists.

`create_instances_from_document` turns one tokenized document (a list of sentences, each a list of
token ids) into `[CLS] A [SEP] B [SEP]` instances exactly as `create_instances_from_document` in
google-research/bert `create_pretraining_data.py` does: a target length of max_seq_length - 3
(with probability short_seq_prob a random length in [2, target]); sentences accumulate until the
target; A ends at a random sentence boundary; with probability 0.5 (always, for a one-sentence chunk)
B is a random span of another document and the unused sentences go back; the longer side is cut one
token at a time from the front or the back at random.

Design decision: every random choice comes from an explicit `random.Random` passed in, called in
the same order and with the same arguments as the original, so with the same generator state the
output is identical to Google's (tests/data/test_pretraining_parity.py proves it against a
reimplementation of the original). Masking is a separate step (`bertkit.data.masking`); a caller
that wants the original's interleaved random stream passes `mask_fn`, which runs at the same point
of the stream as in the original. Truncation moves indices instead of deleting list heads, so a
sentence of a million tokens costs linear, not quadratic, time (same random calls).

References: Devlin et al. 2018 (arXiv:1810.04805), section 3.1 and appendix A.2;
google-research/bert `create_pretraining_data.py`.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import chain

Document = Sequence[Sequence[int]]
"""A tokenized document: its sentences, each a non-empty sequence of token ids."""

# (tokens, rng) -> (masked tokens, masked positions, original ids at those positions)
MaskFn = Callable[[list[int], random.Random], tuple[list[int], list[int], list[int]]]

# Draws before settling on a random document other than the current one (as in the original).
RANDOM_DOCUMENT_TRIES = 10


@dataclass
class Instance:
    """One pre-training example: `[CLS] A [SEP] B [SEP]` as token ids."""

    tokens: list[int]
    """Token ids, specials included; masked already when `masked_positions` is set."""
    a_length: int
    """Number of tokens with segment id 0: len(A) + 2 ([CLS] and the first [SEP])."""
    is_random_next: bool
    """True when B is a random span from another document (NSP label 1)."""
    masked_positions: list[int] = field(default_factory=list)
    """Positions chosen for masked LM, ascending (empty until masked)."""
    masked_labels: list[int] = field(default_factory=list)
    """Original token ids at `masked_positions`."""

    @property
    def segment_ids(self) -> list[int]:
        return [0] * self.a_length + [1] * (len(self.tokens) - self.a_length)


@dataclass
class PairStats:
    """Counters the pair rules report (added up across documents for the summary)."""

    truncated_instances: int = 0
    """Instances whose A+B was longer than max_seq_length - 3 and got cut."""
    truncated_tokens: int = 0
    """Tokens removed by those cuts."""
    random_next_same_document: int = 0
    """Random-next pairs whose B had to come from the same document (no other document in reach)."""

    def add(self, other: PairStats) -> None:
        self.truncated_instances += other.truncated_instances
        self.truncated_tokens += other.truncated_tokens
        self.random_next_same_document += other.random_next_same_document


def create_instances_from_document(
    documents: Sequence[Document], document_index: int, max_seq_length: int, short_seq_prob: float,
    cls_id: int, sep_id: int, rng: random.Random, mask_fn: MaskFn | None = None,
    stats: PairStats | None = None, original_stream: bool = True,
) -> list[Instance]:
    """All instances of `documents[document_index]`; other documents supply random-next B sides.

    `original_stream=False` draws each truncation's front/back cuts as one binomial draw per side
    (`truncate_pair_fast`: same distribution, O(1) instead of one draw per removed token).
    """
    stats = stats if stats is not None else PairStats()
    document = documents[document_index]
    max_num_tokens = max_seq_length - 3  # room for [CLS], [SEP], [SEP]
    # Mostly fill the sequence; sometimes go short to match fine-tuning's shorter inputs.
    target_length = max_num_tokens
    if rng.random() < short_seq_prob:
        target_length = rng.randint(2, max_num_tokens)

    instances: list[Instance] = []
    chunk: list[Sequence[int]] = []
    chunk_length = 0
    i = 0
    while i < len(document):
        chunk.append(document[i])
        chunk_length += len(document[i])
        if i == len(document) - 1 or chunk_length >= target_length:
            a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
            tokens_a = list(chain.from_iterable(chunk[:a_end]))
            if len(chunk) == 1 or rng.random() < 0.5:
                is_random_next = True
                tokens_b = _random_span(documents, document_index, target_length - len(tokens_a), rng, stats)
                i -= len(chunk) - a_end  # the unused sentences go back for the next chunk
            else:
                is_random_next = False
                tokens_b = list(chain.from_iterable(chunk[a_end:]))
            truncate = truncate_pair if original_stream else truncate_pair_fast
            instances.append(_build_instance(tokens_a, tokens_b, is_random_next, max_num_tokens,
                                             cls_id, sep_id, rng, mask_fn, stats, truncate))
            chunk = []
            chunk_length = 0
        i += 1
    return instances


def _random_span(documents: Sequence[Document], document_index: int, target_b_length: int,
                 rng: random.Random, stats: PairStats) -> list[int]:
    """Sentences from a random start in a random other document, until `target_b_length` tokens."""
    for _ in range(RANDOM_DOCUMENT_TRIES):
        random_index = rng.randint(0, len(documents) - 1)
        if random_index != document_index:
            break
    if random_index == document_index:
        stats.random_next_same_document += 1
    random_document = documents[random_index]
    tokens_b: list[int] = []
    for j in range(rng.randint(0, len(random_document) - 1), len(random_document)):
        tokens_b.extend(random_document[j])
        if len(tokens_b) >= target_b_length:
            break
    return tokens_b


def _build_instance(tokens_a: list[int], tokens_b: list[int], is_random_next: bool, max_num_tokens: int,
                    cls_id: int, sep_id: int, rng: random.Random, mask_fn: MaskFn | None,
                    stats: PairStats, truncate) -> Instance:
    (a_start, a_stop), (b_start, b_stop) = truncate(len(tokens_a), len(tokens_b), max_num_tokens, rng)
    removed = len(tokens_a) + len(tokens_b) - (a_stop - a_start) - (b_stop - b_start)
    if removed:
        stats.truncated_instances += 1
        stats.truncated_tokens += removed
    tokens = [cls_id, *tokens_a[a_start:a_stop], sep_id, *tokens_b[b_start:b_stop], sep_id]
    instance = Instance(tokens=tokens, a_length=a_stop - a_start + 2, is_random_next=is_random_next)
    if mask_fn is not None:
        instance.tokens, instance.masked_positions, instance.masked_labels = mask_fn(tokens, rng)
    return instance


def truncate_pair(length_a: int, length_b: int, max_num_tokens: int,
                  rng: random.Random) -> tuple[tuple[int, int], tuple[int, int]]:
    """Kept [start, stop) of A and of B after cutting the longer side (B on ties) one token at a
    time, from the front or the back with equal probability, until both fit `max_num_tokens`."""
    a_start, a_stop, b_start, b_stop = 0, length_a, 0, length_b
    while (a_stop - a_start) + (b_stop - b_start) > max_num_tokens:
        from_front = rng.random() < 0.5
        if a_stop - a_start > b_stop - b_start:
            a_start, a_stop = (a_start + 1, a_stop) if from_front else (a_start, a_stop - 1)
        else:
            b_start, b_stop = (b_start + 1, b_stop) if from_front else (b_start, b_stop - 1)
    return (a_start, a_stop), (b_start, b_stop)


def truncate_pair_fast(length_a: int, length_b: int, max_num_tokens: int,
                       rng: random.Random) -> tuple[tuple[int, int], tuple[int, int]]:
    """`truncate_pair` in O(1): the same kept spans in distribution, fewer random draws.

    Which side loses each token depends only on the lengths (the longer one, B on ties: first the
    gap, then alternately B, A, B, ...), so the cut per side is known up front; of a side's r cuts,
    the number taken from the front is Binomial(r, 1/2), drawn as the popcount of r random bits.
    """
    excess = length_a + length_b - max_num_tokens
    if excess <= 0:
        return (0, length_a), (0, length_b)
    gap = min(excess, abs(length_a - length_b))
    rest = excess - gap
    cut_a = (gap if length_a > length_b else 0) + rest // 2
    cut_b = (gap if length_b > length_a else 0) + rest - rest // 2
    front_a = rng.getrandbits(cut_a).bit_count() if cut_a else 0
    front_b = rng.getrandbits(cut_b).bit_count() if cut_b else 0
    return (front_a, length_a - (cut_a - front_a)), (front_b, length_b - (cut_b - front_b))
