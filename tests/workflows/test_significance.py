"""The note printed wherever runs are compared: Welch's t-test on per-seed scores, checked against values
computed by hand (and R's t.test), and the cases it must not put a number on (one seed, no spread); then the
places that print it: the quickstart's pre-trained vs random gain and `bertkit glue`'s chosen learning rate."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from bertkit.quickstart.report import comparison_lines, pretraining_gain
from bertkit.workflows import glue
from bertkit.workflows.significance import compare_seeds


def test_welch_p_value_by_hand():
    # a = 1, 2, 3; b = 4, 5, 6: t = -3 / sqrt(1/3 + 1/3) = -3.674, Welch df = 4, two-sided p = 0.02131
    comparison = compare_seeds([1.0, 2.0, 3.0], [4.0, 5.0, 6.0])
    assert comparison.difference == pytest.approx(-3.0)
    assert comparison.p_value == pytest.approx(0.02131, abs=5e-5)
    assert comparison.note == "Welch's t-test p = 0.021 over 3 vs 3 seeds: unlikely to be seed noise"


def test_unequal_variances_use_welch_degrees_of_freedom():
    # variances 1 and 400: t = -9 / sqrt(1/3 + 400/3) = -0.7785; Welch df = (401/3)^2 / ((1/3)^2/2 + (400/3)^2/2)
    # = 2.01, where the df = 2 closed form 1 - |t| / sqrt(t^2 + 2) gives p = 0.519 (pooled df = 4 would give 0.48)
    comparison = compare_seeds([50.0, 51.0, 52.0], [40.0, 60.0, 80.0])
    t = -9 / math.sqrt(401 / 3)
    assert comparison.p_value == pytest.approx(1 - abs(t) / math.sqrt(t * t + 2), abs=3e-3)
    assert comparison.note.endswith("within seed-to-seed noise; more seeds would tell")


def test_one_seed_and_no_spread_get_words_not_a_number():
    one = compare_seeds([0.7], [0.5, 0.6])
    assert one.p_value is None and "no seed-to-seed spread" in one.note and "--seeds 1,2,3" in one.note
    exact = compare_seeds([0.7, 0.7], [0.5, 0.5])
    assert exact.p_value is None and exact.difference == pytest.approx(0.2)
    assert "the difference is not seed noise" in exact.note
    assert "on both sides" in compare_seeds([0.5, 0.5], [0.5, 0.5]).note
    with pytest.raises(ValueError):
        compare_seeds([], [1.0])


def _summary(pretrained: list[float], random: list[float]) -> dict:
    def table(values):
        return {"seeds": {str(i): {"dev": v, "test": v - 0.01} for i, v in enumerate(values, 1)},
                "dev": {"mean": sum(values) / len(values), "std": 0.0},
                "test": {"mean": sum(values) / len(values) - 0.01, "std": 0.0}}
    return {"finetuning": {"pretrained": table(pretrained), "random": table(random)}, "pretraining": {"steps": 5000}}


def test_quickstart_gain_says_whether_it_is_noise():
    gain = pretraining_gain(_summary([0.60, 0.62, 0.61], [0.40, 0.41, 0.42]))
    assert gain is not None and gain.startswith("Gain from pre-training (difference of the means): +20.0 points on dev")
    assert gain.count("unlikely to be seed noise") == 2
    assert gain in comparison_lines(_summary([0.60, 0.62, 0.61], [0.40, 0.41, 0.42]))
    noisy = pretraining_gain(_summary([0.50, 0.60, 0.40], [0.45, 0.55, 0.52]))
    assert noisy is not None and noisy.count("within seed-to-seed noise") == 2
    summary = _summary([0.6, 0.6], [0.4, 0.4])
    del summary["finetuning"]["random"]  # --no-baseline
    assert pretraining_gain(summary) is None


def test_glue_names_the_runner_up_and_whether_the_choice_is_noise():
    spec = glue.GLUE_FOLDERS["rte"]
    found = glue.FoundTask(spec, Path("RTE"), Path("RTE/train.tsv"), [Path("RTE/dev.tsv")], {})

    def run(*values: float) -> dict:
        per_seed = {seed: {"accuracy": v} for seed, v in enumerate(values, 1)}
        return {"metrics": glue._seed_stats(per_seed, ("accuracy",)), "directory": "d"}
    chosen = glue._choose(found, {3e-5: run(0.70, 0.72, 0.71), 2e-5: run(0.50, 0.52, 0.51),
                                  1e-5: run(0.60, 0.61, 0.62)}, (1, 2, 3))
    versus = chosen["versus_runner_up"]
    assert versus["learning_rate"] == 1e-5 and versus["difference"] == pytest.approx(10.0)
    assert versus["p_value"] < 0.05 and "unlikely to be seed noise" in versus["note"]
    assert glue._choice_line(chosen).startswith("ahead of 1e-05 by 10.0 points (Welch's t-test p = ")
    tie = glue._choose(found, {3e-5: run(0.5, 0.5), 2e-5: run(0.5, 0.5)}, (1, 2))
    assert glue._choice_line(tie) == ("tied with 2e-05, the first in grid order kept (2 vs 2 seeds: every seed "
                                      "scored the same on both sides)")
    alone = glue._choose(found, {3e-5: run(0.7, 0.6)}, (1, 2))
    assert alone["versus_runner_up"] is None and glue._choice_line(alone) == ""
    assert not math.isnan(compare_seeds([0.7, 0.6], [0.7, 0.6]).p_value or 0.0)


def test_a_side_of_equal_scores_prints_no_scipy_warning():
    """A random-initialisation baseline that predicts the majority class scores the same on every seed; scipy's
    "precision loss" RuntimeWarning reached the quickstart's output (issue 51's tour). The p-value stays."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = compare_seeds([0.365, 0.382], [0.289, 0.289])
    assert result.p_value is not None and 0 < result.p_value < 1


def test_a_short_pretraining_that_gains_anyway_is_not_told_it_cannot():
    """The verdict on a short pre-training (fewer sequences than where the study saw a gain) said "not expected to
    beat random initialisation" next to a gain with p = 0.046 (issue 51's tour): where a gain shows, it says so."""
    from bertkit.quickstart.report import pretraining_verdict

    gained = {**_summary([0.60, 0.62, 0.61], [0.40, 0.41, 0.42]), "pretraining": {"steps": 300},
              "recipe": {"batch_size": 16}}
    assert "a gain already shows here" in pretraining_verdict(gained)
    none = {**_summary([0.40, 0.42], [0.41, 0.40]), "pretraining": {"steps": 300}, "recipe": {"batch_size": 16}}
    assert "not expected to beat random initialisation" in pretraining_verdict(none)
    long = {**none, "pretraining": {"steps": 5000}}
    assert pretraining_verdict(long) is None
