"""Positions a bertkit pre-training trained, and the one-line warning when inputs reach past them.

A short-budget pre-training cuts its instances (64 tokens in the short recipe, unless its full-length steps ran), so
position embeddings past the cut keep their random initialisation; a model read at longer inputs then reads those
positions as noise (fine-tuning 128-token texts from such a model lost to random initialisation: docs/pretraining.md,
"Every position a fine-tuning reads").
`final/bertkit_pretraining.json` records `trained_positions`; fine-tuning, prediction and serving say when their
inputs reach past it, with the fix.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bertkit.io.jsonfile import read_json_object

log = logging.getLogger(__name__)

PRETRAINING_FILE = "bertkit_pretraining.json"
"""Written into a pre-training run's final/ (steps, recipe, trained positions, last held-out metrics); read by
fine-tuning's learning-rate rule and by whatever reads the model at some input length."""


def trained_positions(record: dict[str, Any]) -> int | None:
    """The leading positions a model's bertkit_pretraining.json says its pre-training trained (every run of its
    --init-from chain); None when a checkpoint made elsewhere is in the chain, or the record does not say (a run
    of a bertkit from before it was recorded): then every position is assumed trained."""
    origin = record.get("continued_from")
    if isinstance(origin, dict) and origin.get("released"):
        return None
    value = record.get("trained_positions")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def directory_trained_positions(directory: Path) -> int | None:
    """`trained_positions` of a model directory's record (None without one, or with a damaged one)."""
    return trained_positions(read_json_object(directory / PRETRAINING_FILE, missing={}, damaged={}))


class UntrainedPositions:
    """Says once, in one line, when inputs reach positions a model's pre-training never trained (a predictor or a
    server reads many batches: the first that reaches past them is named, the rest counted in `past`)."""

    def __init__(self, trained: int | None, directory: str) -> None:
        self.trained, self.directory = trained, directory
        self.past = 0
        """Inputs so far that reached past the trained positions."""

    def check(self, lengths: Sequence[int]) -> int:
        """How many of these inputs (their lengths in tokens, [CLS] and [SEP] included) reach past the trained
        positions; the first time any do, a warning with the fix."""
        if self.trained is None:
            return 0
        past = sum(length > self.trained for length in lengths)
        if past and not self.past:
            log.warning("%d of %d inputs reach positions past %d, which the pre-training of %s never trained (its "
                        "instances were %d tokens), so their vectors read untrained position embeddings: use "
                        "--max-seq-length %d, or continue pre-training at the length you use (`bertkit pretrain "
                        "--init-from %s --max-seq-length N ...`); said once", past, len(lengths), self.trained,
                        self.directory, self.trained, self.trained, self.directory)
        self.past += past
        return past
