"""Augmented copies for the teacher to label (Tang et al. 2019): the masking and swap rates, spans of single texts
only, special tokens and per-token fields in step, determinism from the RNG."""

from __future__ import annotations

import random

from bertkit.data.augment import MASK_PROB, SWAP_PROB, augmented_features

MASK, CLS, SEP = 4, 2, 3


def _feature(ids: list[int], pair: bool = False) -> dict:
    types = [0] * len(ids) if not pair else [0] * (len(ids) // 2) + [1] * (len(ids) - len(ids) // 2)
    return {"input_ids": [CLS, *ids, SEP], "token_type_ids": [0, *types, types[-1]],
            "attention_mask": [1] * (len(ids) + 2), "labels": 1, "word_positions": [None, *range(len(ids)), None]}


def test_tokens_are_masked_and_swapped_at_their_rates_and_specials_never() -> None:
    features = [_feature(list(range(10, 60)))] * 40
    copies = augmented_features(features, 5, random.Random(0), MASK, (0, 1, CLS, SEP, MASK), ngrams=False)
    tokens = masked = swapped = 0
    for copy in copies:
        assert copy["input_ids"][0] == CLS and copy["input_ids"][-1] == SEP
        assert len(copy["input_ids"]) == 52 and copy["word_positions"] == features[0]["word_positions"]
        for before, after in zip(features[0]["input_ids"][1:-1], copy["input_ids"][1:-1]):
            tokens += 1
            masked += after == MASK
            swapped += after not in (MASK, before)
    # 200 copies x 50 tokens: the rates within 5 standard errors (a swap may draw the token itself: 1/50).
    assert abs(masked / tokens - MASK_PROB) < 5 * (MASK_PROB * (1 - MASK_PROB) / tokens) ** 0.5
    assert abs(swapped / tokens - SWAP_PROB * 49 / 50) < 5 * (SWAP_PROB * (1 - SWAP_PROB) / tokens) ** 0.5


def test_spans_are_cut_from_single_texts_only_with_every_per_token_field() -> None:
    singles = augmented_features([_feature(list(range(10, 30)))] * 200, 1, random.Random(1), MASK, (CLS, SEP, MASK),
                                 ngrams=True)
    short = [c for c in singles if len(c["input_ids"]) < 22]
    assert 0.15 < len(short) / len(singles) < 0.35  # NGRAM_PROB = 0.25
    for copy in short:
        assert 3 <= len(copy["input_ids"]) <= 7 and copy["input_ids"][0] == CLS and copy["input_ids"][-1] == SEP
        assert len(copy["attention_mask"]) == len(copy["token_type_ids"]) == len(copy["word_positions"]) \
            == len(copy["input_ids"])
    pairs = augmented_features([_feature(list(range(10, 30)), pair=True)] * 50, 1, random.Random(1), MASK,
                               (CLS, SEP, MASK), ngrams=True)
    assert all(len(c["input_ids"]) == 22 for c in pairs)


def test_copies_follow_the_rng_and_differ_from_their_source() -> None:
    features = [_feature([10, 11, 12]), _feature([13, 14, 15, 16])]
    first = augmented_features(features, 8, random.Random(7), MASK, (CLS, SEP, MASK), ngrams=True)
    assert first == augmented_features(features, 8, random.Random(7), MASK, (CLS, SEP, MASK), ngrams=True)
    assert all(c["input_ids"] not in (f["input_ids"] for f in features) for c in first)
    assert augmented_features(features, 0, random.Random(7), MASK, (CLS, SEP, MASK), ngrams=True) == []
