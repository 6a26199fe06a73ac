"""Augmented copies of encoded training inputs, for a teacher to label (Tang et al. 2019, section 3.3).

    augmented_features(features, copies, rng, mask_token_id, special_ids, ngrams) -> features

Each copy of a feature replaces each of its tokens, with probability `MASK_PROB`, by [MASK], else with probability
`SWAP_PROB` by a token drawn from the training inputs' own tokens (how often each occurs is how likely it is drawn:
Tang et al. swap a word for another of its part of speech, which needs a tagger; a token of the same corpus is the
tagger-free version); then, with `ngrams` and probability `NGRAM_PROB`, keeps only a random span of 1 to
`MAX_NGRAM` tokens (Tang et al.'s n-gram sampling; a single text only: a pair's two segments stay whole).
Special tokens ([CLS], [SEP]) never change. A copy that comes out identical to its source is dropped.

Design decision: augmentation works on token ids, not on text: a [MASK] typed into text is split into "[", "mask",
"]" by the tokenizer (Google's rule), and the ids keep every other field of the feature (a tagger's word positions)
in step. The copies carry no gold labels (the teacher's outputs are their targets); the caller marks them. A pure
function of its inputs and the explicit RNG.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

MASK_PROB = 0.1
SWAP_PROB = 0.1
NGRAM_PROB = 0.25
MAX_NGRAM = 5


def augmented_features(features: Sequence[dict[str, Any]], copies: int, rng: random.Random, mask_token_id: int,
                       special_ids: Sequence[int], ngrams: bool) -> list[dict[str, Any]]:
    """`copies` augmented copies of every feature (fewer where a copy equals its source), in order."""
    special = set(special_ids)
    pool = [token for f in features for token in f["input_ids"] if token not in special] or [mask_token_id]
    out = []
    for feature in features:
        for _ in range(copies):
            ids = [token if token in special else _replaced(token, rng, mask_token_id, pool)
                   for token in feature["input_ids"]]
            copy = {**feature, "input_ids": ids}
            if ngrams and rng.random() < NGRAM_PROB and not any(feature["token_type_ids"]):
                copy = _span(copy, rng, special)
            if copy["input_ids"] != feature["input_ids"]:
                out.append(copy)
    return out


def _replaced(token: int, rng: random.Random, mask_token_id: int, pool: Sequence[int]) -> int:
    draw = rng.random()
    if draw < MASK_PROB:
        return mask_token_id
    if draw < MASK_PROB + SWAP_PROB:
        return rng.choice(pool)
    return token


def _span(feature: dict[str, Any], rng: random.Random, special: set[int]) -> dict[str, Any]:
    """[CLS] + a random span of 1 to MAX_NGRAM tokens of a single text + [SEP] (every per-token field cut alike)."""
    ids = feature["input_ids"]
    inner = [i for i, token in enumerate(ids) if token not in special]
    if len(inner) < 2:
        return feature
    size = rng.randint(1, min(MAX_NGRAM, len(inner)))
    start = rng.randint(0, len(inner) - size)
    kept = [0, *inner[start:start + size], len(ids) - 1]
    return {key: [value[i] for i in kept] if isinstance(value, list) and len(value) == len(ids) else value
            for key, value in feature.items()}
