"""Is a difference between two sets of runs more than seed noise? The note printed wherever bertkit compares
runs (the quickstart's pre-trained vs random, `bertkit glue`'s learning rates, scripts/domain_adaptation.sh).

    compare_seeds(a, b) -> SeedComparison     difference of the means, Welch's t-test p-value, a plain note

Design decision: Welch's t-test (unequal variances), two-sided, on the per-seed scores, because fine-tuning runs
of different configurations do not share a variance, and three seeds per side is what users run. With so few
seeds the test has little power: the note says "within seed noise", never "no difference", and names how to
learn more (more seeds). One seed per side has no spread to judge by, and the note says so instead of a number.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import warnings
from collections.abc import Sequence

SIGNIFICANCE_LEVEL = 0.05
"""p below this reads "unlikely to be seed noise" (the conventional two-sided 5%)."""


@dataclasses.dataclass(frozen=True)
class SeedComparison:
    """`a` against `b`: mean(a) - mean(b), the two-sided Welch p-value (None where it is undefined) and the
    sentence to print after the difference."""

    difference: float
    p_value: float | None
    note: str


def compare_seeds(a: Sequence[float], b: Sequence[float]) -> SeedComparison:
    """Compare per-seed scores `a` with `b` (same units; any scale)."""
    if not a or not b:
        raise ValueError("compare_seeds needs at least one score on each side")
    difference = statistics.fmean(a) - statistics.fmean(b)
    counts = f"{len(a)} vs {len(b)} seeds"
    if len(a) < 2 or len(b) < 2:
        return SeedComparison(difference, None, f"{counts}: no seed-to-seed spread to judge the difference by; "
                                                "run 3 seeds (--seeds 1,2,3) to know whether it is noise")
    if statistics.stdev(a) == 0 and statistics.stdev(b) == 0:
        note = ("every seed scored the same on both sides" if difference == 0 else
                "every seed scored the same on each side, so the difference is not seed noise")
        return SeedComparison(difference, None, f"{counts}: {note}")
    p_value = _welch_p_value(a, b)
    if p_value < SIGNIFICANCE_LEVEL:
        verdict = "unlikely to be seed noise"
    else:
        verdict = "within seed-to-seed noise; more seeds would tell"
    return SeedComparison(difference, p_value, f"Welch's t-test p = {p_value:.2g} over {counts}: {verdict}")


def _welch_p_value(a: Sequence[float], b: Sequence[float]) -> float:
    from scipy import stats

    with warnings.catch_warnings():  # one side of equal scores: scipy's "precision loss" note; the p-value is sound
        warnings.simplefilter("ignore", RuntimeWarning)
        p_value = float(stats.ttest_ind(a, b, equal_var=False).pvalue)
    return 1.0 if math.isnan(p_value) else p_value
