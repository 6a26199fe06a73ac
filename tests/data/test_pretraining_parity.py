"""Parity: bertkit's instance creation equals the original's, instance for instance.

Google's loop (dupe_factor passes over all documents, one shared `random.Random`) is run twice on
the same documents and seed: once with the reference reimplementation in pretraining_reference.py
(token strings, the original's code path) and once with bertkit's `create_instances_from_document`
plus `google_mask_fn`. Tokens, segment ids, NSP labels, masked positions and labels must be equal.
"""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path

import numpy as np
import pytest

from bertkit.data.instances import PairSpans, PairStats, create_instances_from_document, truncate_pair, truncate_spans
from bertkit.data.masking import MaskingVocab, google_mask_fn

_spec = importlib.util.spec_from_file_location("pretraining_reference",
                                               Path(__file__).with_name("pretraining_reference.py"))
reference = sys.modules.setdefault("pretraining_reference", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(reference)

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
VOCAB = SPECIALS + [f"w{i}" for i in range(60)] + [f"##p{i}" for i in range(40)]
CLS, SEP, MASK = 2, 3, 4


def random_documents(seed: int, n_documents: int, max_sentences: int = 12, max_sentence_length: int = 40):
    rng = random.Random(seed)
    documents = []
    for _ in range(n_documents):
        n_sentences = rng.choice([1, 1, 2, rng.randint(1, max_sentences)])
        documents.append([[rng.randint(5, len(VOCAB) - 1) for _ in range(rng.randint(1, max_sentence_length))]
                          for _ in range(n_sentences)])
    return documents


def as_strings(documents):
    return [[[VOCAB[t] for t in sentence] for sentence in doc] for doc in documents]


def run_ours(documents, seed, max_seq_length, dupe_factor, whole_word):
    continuation = np.array([t.startswith("##") for t in VOCAB]) if whole_word else None
    vocab = MaskingVocab(len(VOCAB), MASK, CLS, SEP, continuation)
    mask_fn = google_mask_fn(0.15, 20, vocab)
    rng = random.Random(seed)
    out = []
    for _ in range(dupe_factor):
        for index in range(len(documents)):
            out.extend(create_instances_from_document(documents, index, max_seq_length, 0.1, CLS, SEP, rng,
                                                      mask_fn=mask_fn, stats=PairStats()))
    return out


def run_reference(documents, seed, max_seq_length, dupe_factor, whole_word):
    rng = random.Random(seed)
    strings = as_strings(documents)
    out = []
    for _ in range(dupe_factor):
        for index in range(len(strings)):
            out.extend(reference.create_instances_from_document(
                strings, index, max_seq_length, 0.1, 0.15, 20, VOCAB, rng, do_whole_word_mask=whole_word))
    return out


@pytest.mark.parametrize("whole_word", [False, True])
@pytest.mark.parametrize("max_seq_length", [16, 64, 128])
def test_instances_identical_to_original(whole_word, max_seq_length):
    documents = random_documents(seed=max_seq_length, n_documents=40)
    ours = run_ours(documents, 12345, max_seq_length, dupe_factor=3, whole_word=whole_word)
    theirs = run_reference(documents, 12345, max_seq_length, dupe_factor=3, whole_word=whole_word)
    assert len(ours) == len(theirs) > 50
    for mine, ref in zip(ours, theirs):
        assert [VOCAB[t] for t in mine.tokens] == ref.tokens
        assert mine.segment_ids == ref.segment_ids
        assert mine.is_random_next == ref.is_random_next
        assert mine.masked_positions == ref.masked_lm_positions
        assert [VOCAB[t] for t in mine.masked_labels] == ref.masked_lm_labels


def test_one_document_corpus_matches_original_fallback():
    # With a single document the original draws 10 times, then takes B from the same document.
    documents = random_documents(seed=3, n_documents=1, max_sentences=30)
    documents[0] = documents[0] + [[7, 8, 9]] * 10
    ours = run_ours(documents, 1, 32, dupe_factor=2, whole_word=False)
    theirs = run_reference(documents, 1, 32, dupe_factor=2, whole_word=False)
    assert [i.tokens for i in ours] == [[VOCAB.index(t) for t in r.tokens] for r in theirs]
    stats = PairStats()
    create_instances_from_document(documents, 0, 32, 0.0, CLS, SEP, random.Random(0), stats=stats)
    assert stats.random_next_same_document >= 1


def test_truncation_matches_original_on_giant_sentences():
    rng_ours, rng_ref = random.Random(7), random.Random(7)
    for length_a, length_b in [(5000, 3), (3, 5000), (400, 400), (1, 1), (200, 201)]:
        (a0, a1), (b0, b1) = truncate_pair(length_a, length_b, 125, rng_ours)
        tokens_a, tokens_b = list(range(length_a)), list(range(length_b))
        reference.truncate_seq_pair(tokens_a, tokens_b, 125, rng_ref)
        assert list(range(a0, a1)) == tokens_a and list(range(b0, b1)) == tokens_b


def test_truncation_counted():
    documents = [[list(range(5, 105))], [list(range(5, 25))]]
    stats = PairStats()
    instances = create_instances_from_document(documents, 0, 32, 0.0, CLS, SEP, random.Random(0), stats=stats)
    assert all(len(i.tokens) <= 32 for i in instances)
    assert stats.truncated_instances == len(instances) == 1
    assert stats.truncated_tokens == 100 + 20 - 29  # A: 100 tokens, B: the other document (20)


def test_vectorised_truncation_same_cuts_and_binomial_front_share():
    lengths = np.array([(a, b) for a in range(0, 140, 3) for b in range(0, 140, 5)])
    zeros = np.zeros(len(lengths), dtype=np.int64)
    spans = PairSpans(zeros, lengths[:, 0], zeros, lengths[:, 1], zeros.astype(bool))
    stats = PairStats()
    kept = truncate_spans(spans, 61, np.random.default_rng(0), stats)
    cuts = []
    for k, (length_a, length_b) in enumerate(lengths.tolist()):
        (a0, a1), (b0, b1) = truncate_pair(length_a, length_b, 61, random.Random(1))
        assert (kept.a_stop[k] - kept.a_start[k], kept.b_stop[k] - kept.b_start[k]) == (a1 - a0, b1 - b0)
        assert 0 <= kept.a_start[k] <= kept.a_stop[k] <= length_a and 0 <= kept.b_start[k] <= kept.b_stop[k] <= length_b
        cuts += [(kept.a_start[k], length_a - (a1 - a0)), (kept.b_start[k], length_b - (b1 - b0))]
    taken_front = sum(int(f) for f, _ in cuts)
    cut = sum(c for _, c in cuts)
    assert stats.truncated_tokens == cut and stats.truncated_instances == int(((lengths.sum(1)) > 61).sum())
    assert cut > 10_000 and abs(taken_front / cut - 0.5) < 4 * (0.25 / cut) ** 0.5
