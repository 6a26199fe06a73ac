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

`create_pair_spans` runs the same rules vectorised for the pipeline's default (numpy) mode: every
(document, pass) of a block is a lane, all lanes advance one instance per step with a few array
operations (sentence prefix sums make a chunk; A and B are contiguous spans of the block's flat
token array), and draws come from a numpy Generator. Same rules and distributions, tested
structurally and statistically against the per-document functions
(tests/data/test_pretraining_spans.py); the cost is per step (one instance of every lane), not per
instance. Truncation there (`truncate_spans`) draws each side's front/back split as one binomial
instead of one draw per removed token.

References: Devlin et al. 2018 (arXiv:1810.04805), section 3.1 and appendix A.2;
google-research/bert `create_pretraining_data.py`.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import chain

import numpy as np

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
    stats: PairStats | None = None,
) -> list[Instance]:
    """All instances of `documents[document_index]`; other documents supply random-next B sides."""
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
            instances.append(_build_instance(tokens_a, tokens_b, is_random_next, max_num_tokens,
                                             cls_id, sep_id, rng, mask_fn, stats))
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
                    stats: PairStats) -> Instance:
    (a_start, a_stop), (b_start, b_stop) = truncate_pair(len(tokens_a), len(tokens_b), max_num_tokens, rng)
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


@dataclass
class PairSpans:
    """Instances as spans of a block's flat token array: A = tokens[a_start:a_stop], B likewise."""

    a_start: np.ndarray
    a_stop: np.ndarray
    b_start: np.ndarray
    b_stop: np.ndarray
    is_random_next: np.ndarray
    """(n,) bool: B is a random span (NSP label 1)."""

    def __len__(self) -> int:
        return len(self.a_start)

    def take(self, index: np.ndarray) -> PairSpans:
        """The instances at `index` (a permutation, a slice, a mask)."""
        return PairSpans(self.a_start[index], self.a_stop[index], self.b_start[index], self.b_stop[index],
                         self.is_random_next[index])


def create_pair_spans(sentence_offsets: np.ndarray, document_offsets: np.ndarray, dupe_factor: int,
                      max_seq_length: int, short_seq_prob: float, gen: np.random.Generator,
                      stats: PairStats | None = None) -> PairSpans:
    """`dupe_factor` passes of the pair rules over every document of a block, untruncated.

    Sentence k is tokens[sentence_offsets[k]:sentence_offsets[k+1]] (S+1 offsets, every sentence
    non-empty); document d is sentences document_offsets[d]:document_offsets[d+1] (D+1 offsets).
    Instances come out step by step (the first instance of every lane, then the second, ...).
    """
    stats = stats if stats is not None else PairStats()
    cum, first = np.asarray(sentence_offsets, dtype=np.int64), np.asarray(document_offsets, dtype=np.int64)
    n_documents = len(first) - 1
    max_num_tokens = max_seq_length - 3  # room for [CLS], [SEP], [SEP]
    doc = np.tile(np.arange(n_documents), dupe_factor)  # (L,) document of each lane
    position, end = first[doc], first[doc + 1]  # (L,) next sentence of each lane, its document's end
    target = np.full(len(doc), max_num_tokens, dtype=np.int64)
    short = gen.random(len(doc)) < short_seq_prob
    target[short] = gen.integers(2, max_num_tokens + 1, int(short.sum()))
    steps, active = [], np.flatnonzero(position < end)
    while len(active):
        p, e, t, d = position[active], end[active], target[active], doc[active]
        # The chunk is sentences p..last: the first whose running length reaches t, or the document's last.
        last = np.minimum(np.searchsorted(cum, cum[p] + t, side="left") - 1, e - 1)
        a_end = p + gen.integers(1, np.maximum(last - p + 1, 2))  # A = sentences p..a_end-1
        random_next = (last == p) | (gen.random(len(p)) < 0.5)
        b_start, b_stop = cum[a_end].copy(), cum[last + 1].copy()
        chosen = np.flatnonzero(random_next)
        b_start[chosen], b_stop[chosen] = _random_spans(
            cum, first, d[chosen], t[chosen] - (cum[a_end] - cum[p])[chosen], gen, stats)
        steps.append((cum[p], cum[a_end], b_start, b_stop, random_next))
        position[active] = np.where(random_next, a_end, last + 1)  # the unused sentences go back
        active = active[position[active] < e]
    if not steps:
        empty = np.zeros(0, dtype=np.int64)
        return PairSpans(empty, empty, empty, empty, np.zeros(0, dtype=bool))
    return PairSpans(*(np.concatenate(parts) for parts in zip(*steps)))


def _random_spans(cum: np.ndarray, first: np.ndarray, doc: np.ndarray, target_b: np.ndarray,
                  gen: np.random.Generator, stats: PairStats) -> tuple[np.ndarray, np.ndarray]:
    """Token spans of sentences from a random start in a random other document, until `target_b` tokens."""
    n_documents = len(first) - 1
    tries = gen.integers(0, n_documents, (len(doc), RANDOM_DOCUMENT_TRIES))  # (m, 10) candidate documents
    other = tries != doc[:, None]
    pick = tries[np.arange(len(doc)), other.argmax(axis=1)]  # first other one; else tries[:, 0] == doc
    stats.random_next_same_document += int((~other.any(axis=1)).sum())
    start = gen.integers(first[pick], first[pick + 1])  # sentence
    stop = np.searchsorted(cum, cum[start] + target_b, side="left")  # first sentence end reaching target_b
    stop = np.minimum(np.maximum(stop, start + 1), first[pick + 1])  # at least one sentence, within the document
    return cum[start], cum[stop]


def truncate_spans(spans: PairSpans, max_num_tokens: int, gen: np.random.Generator,
                   stats: PairStats | None = None) -> PairSpans:
    """`truncate_pair` over arrays, with the same kept spans in distribution and O(1) work each.

    Which side loses each token depends only on the lengths (the longer one, B on ties: first the
    gap, then alternately B, A, B, ...), so the cut per side is known up front; of a side's r cuts,
    the number taken from the front is Binomial(r, 1/2).
    """
    length_a, length_b = spans.a_stop - spans.a_start, spans.b_stop - spans.b_start
    excess = np.maximum(length_a + length_b - max_num_tokens, 0)
    gap = np.minimum(excess, np.abs(length_a - length_b))
    rest = excess - gap
    cut_a = np.where(length_a > length_b, gap, 0) + rest // 2
    cut_b = np.where(length_b > length_a, gap, 0) + rest - rest // 2
    front_a, front_b = gen.binomial(cut_a, 0.5), gen.binomial(cut_b, 0.5)
    if stats is not None:
        stats.truncated_instances += int(np.count_nonzero(excess))
        stats.truncated_tokens += int(excess.sum())
    return PairSpans(spans.a_start + front_a, spans.a_stop - (cut_a - front_a),
                     spans.b_start + front_b, spans.b_stop - (cut_b - front_b), spans.is_random_next)
