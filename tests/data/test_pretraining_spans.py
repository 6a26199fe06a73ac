"""The vectorised pair rules (`create_pair_spans`, the pipeline's numpy mode) against the original's rules.

Two kinds of proof. Structural, exact: walking each document's instances in order, A starts where
the previous chunk left off (after A for a random next, after B otherwise), A and an actual-next B
are whole consecutive sentences of the document, a random B is whole sentences of another document,
every sentence is used, and one target length per (document, pass) explains every chunk end and
every random-B length (equal to max_seq_length - 3 when short_seq_prob is 0). Statistical: over many
passes, instance counts, NSP balance and lengths match `create_instances_from_document` (the
per-document port that the parity test holds equal to Google's code).
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from bertkit.data.instances import PairStats, create_instances_from_document, create_pair_spans, truncate_spans


def random_corpus(seed: int, n_documents: int) -> list[list[int]]:
    """Sentence lengths per document (1-sentence documents included)."""
    rng = random.Random(seed)
    return [[rng.randint(1, 40) for _ in range(rng.choice([1, 2, rng.randint(1, 14)]))] for _ in range(n_documents)]


def offsets(corpus):
    sentence_offsets = np.cumsum([0, *(n for doc in corpus for n in doc)])
    document_offsets = np.cumsum([0, *map(len, corpus)])
    return sentence_offsets, document_offsets


@pytest.mark.parametrize("short_seq_prob", [0.0, 0.5])
@pytest.mark.parametrize("max_seq_length", [16, 64])
def test_every_instance_follows_the_rules(short_seq_prob, max_seq_length):
    corpus = random_corpus(1, 40)
    sentence_offsets, document_offsets = offsets(corpus)
    max_num = max_seq_length - 3
    spans = create_pair_spans(sentence_offsets, document_offsets, 1, max_seq_length, short_seq_prob,
                              np.random.default_rng(0))
    boundary = set(sentence_offsets.tolist())
    sentence_of = lambda token: int(np.searchsorted(sentence_offsets, token, side="right")) - 1  # noqa: E731
    document_of = lambda token: int(np.searchsorted(document_offsets, sentence_of(token), side="right")) - 1  # noqa: E731
    owner = [document_of(a) for a in spans.a_start.tolist()]
    for d in range(len(corpus)):
        start, end = sentence_offsets[document_offsets[d]], sentence_offsets[document_offsets[d + 1]]
        low, high = 1, max_num  # the lane's target lies in (low, high]
        for k in (k for k in range(len(spans)) if owner[k] == d):
            a0, a1, b0, b1 = (int(x[k]) for x in (spans.a_start, spans.a_stop, spans.b_start, spans.b_stop))
            assert a0 == start and start < a1 <= end and a1 in boundary and b0 < b1 and {b0, b1} <= boundary
            last = b1 - sentence_offsets[sentence_of(b1 - 1)]  # length of B's last sentence
            if spans.is_random_next[k]:
                assert document_of(b0) == document_of(b1 - 1) != d
                if b0 != sentence_offsets[sentence_of(b1 - 1)]:  # B grew past its first sentence
                    low = max(low, (a1 - a0) + (b1 - b0) - last)
                if b1 != sentence_offsets[document_offsets[document_of(b0) + 1]]:  # B stopped before its document's end
                    high = min(high, (a1 - a0) + (b1 - b0))
                start = a1
            else:
                assert b0 == a1 and b1 <= end and b1 > b0
                low = max(low, (b1 - a0) - last)
                if b1 != end:
                    high = min(high, b1 - a0)
                start = b1
        assert start == end and low < high
        if short_seq_prob == 0.0:
            assert low < max_num <= high


def test_same_statistics_as_the_per_document_rules():
    corpus = random_corpus(2, 30)
    passes, max_seq_length, short_seq_prob = 300, 48, 0.2
    documents = [[[5] * n for n in doc] for doc in corpus]
    rng = random.Random(0)
    theirs = []
    for _ in range(passes):
        for d in range(len(documents)):
            for i in create_instances_from_document(documents, d, max_seq_length, short_seq_prob, 2, 3, rng):
                theirs.append((i.a_length - 2, len(i.tokens) - i.a_length - 1, i.is_random_next))
    sentence_offsets, document_offsets = offsets(corpus)
    gen = np.random.default_rng(0)
    spans = create_pair_spans(sentence_offsets, document_offsets, passes, max_seq_length, short_seq_prob, gen)
    spans = truncate_spans(spans, max_seq_length - 3, gen, PairStats())
    ours = np.stack([spans.a_stop - spans.a_start, spans.b_stop - spans.b_start, spans.is_random_next], 1)
    theirs = np.array(theirs)
    assert abs(len(ours) - len(theirs)) < 5 * np.sqrt(len(theirs))  # instances per pass
    for column in range(3):  # A length, B length, random next
        a, b = ours[:, column].astype(float), theirs[:, column].astype(float)
        error = np.sqrt(a.var() / len(a) + b.var() / len(b))
        assert abs(a.mean() - b.mean()) < 5 * error, column
    histogram = lambda x: np.bincount(x, minlength=max_seq_length) / len(x)  # noqa: E731
    assert np.abs(histogram(ours[:, 0] + ours[:, 1]) - histogram(theirs[:, 0] + theirs[:, 1])).sum() < 0.05
