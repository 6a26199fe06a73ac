"""GLUE and entity-level metrics against scikit-learn, scipy and seqeval on random inputs."""

from __future__ import annotations

import random

import numpy as np
import pytest
import scipy.stats
import sklearn.metrics
from seqeval.metrics import f1_score, precision_score, recall_score
from seqeval.scheme import IOB2, IOBES

from bertkit.errors import BertkitError
from bertkit.tasks import metrics


@pytest.mark.parametrize("seed", range(20))
def test_classification_metrics_match_sklearn(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n, k = int(rng.integers(1, 60)), int(rng.integers(2, 5))
    labels, preds = rng.integers(0, k, n), rng.integers(0, k, n)
    assert metrics.accuracy(labels, preds) == pytest.approx(sklearn.metrics.accuracy_score(labels, preds))
    assert metrics.matthews_correlation(labels, preds) == pytest.approx(
        sklearn.metrics.matthews_corrcoef(labels, preds), abs=1e-12)
    binary_labels, binary_preds = labels % 2, preds % 2
    assert metrics.binary_f1(binary_labels, binary_preds) == pytest.approx(
        sklearn.metrics.f1_score(binary_labels, binary_preds, zero_division=0.0))


def test_matthews_degenerate_is_zero_like_sklearn() -> None:
    labels, preds = [1, 1, 1], [1, 1, 1]
    assert metrics.matthews_correlation(labels, preds) == sklearn.metrics.matthews_corrcoef(labels, preds) == 0.0


@pytest.mark.parametrize("seed", range(20))
def test_correlations_match_scipy_including_ties(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 80))
    # Rounded values make ties common, which is where Spearman implementations differ.
    labels = np.round(rng.uniform(0, 5, n), 1)
    preds = np.round(labels + rng.normal(0, 1.5, n), 0)
    assert metrics.pearson(labels, preds) == pytest.approx(scipy.stats.pearsonr(labels, preds)[0], abs=1e-10)
    assert metrics.spearman(labels, preds) == pytest.approx(scipy.stats.spearmanr(labels, preds)[0], abs=1e-10)


def test_empty_evaluation_set_is_a_user_error() -> None:
    with pytest.raises(BertkitError, match="empty"):
        metrics.accuracy([], [])


def _random_tags(rng: random.Random, prefixes: str, length: int) -> list[str]:
    types = ["PER", "LOC", "ORG"]
    return [("O" if (p := rng.choice(prefixes + "OO")) == "O" else f"{p}-{rng.choice(types)}")
            for _ in range(length)]


def _random_corpus(rng: random.Random, prefixes: str) -> tuple[list[list[str]], list[list[str]]]:
    lengths = [rng.randint(1, 12) for _ in range(rng.randint(1, 8))]
    return ([_random_tags(rng, prefixes, n) for n in lengths], [_random_tags(rng, prefixes, n) for n in lengths])


@pytest.mark.parametrize("prefixes", ["BI", "I", "BIES"], ids=["BIO", "IOB1", "BIOES"])
def test_entity_scores_match_seqeval_default_mode(prefixes: str) -> None:
    rng = random.Random(prefixes)
    for _ in range(300):
        gold, pred = _random_corpus(rng, prefixes)
        ours = metrics.entity_scores(gold, pred, mode="conlleval")
        assert ours["precision"] == pytest.approx(precision_score(gold, pred, zero_division=0))
        assert ours["recall"] == pytest.approx(recall_score(gold, pred, zero_division=0))
        assert ours["f1"] == pytest.approx(f1_score(gold, pred, zero_division=0))


@pytest.mark.parametrize(("prefixes", "scheme", "seqeval_scheme"), [("BI", "BIO", IOB2), ("BIES", "BIOES", IOBES)])
def test_entity_scores_match_seqeval_strict_mode(prefixes: str, scheme: str, seqeval_scheme: type) -> None:
    rng = random.Random(scheme)
    for _ in range(300):
        gold, pred = _random_corpus(rng, prefixes)
        ours = metrics.entity_scores(gold, pred, mode="strict", scheme=scheme)
        kwargs = dict(mode="strict", scheme=seqeval_scheme, zero_division=0)
        assert ours["precision"] == pytest.approx(precision_score(gold, pred, **kwargs))
        assert ours["recall"] == pytest.approx(recall_score(gold, pred, **kwargs))
        assert ours["f1"] == pytest.approx(f1_score(gold, pred, **kwargs))


def test_conlleval_and_strict_differ_on_a_stray_inside_tag() -> None:
    gold, pred = [["B-PER", "I-PER", "O"]], [["I-PER", "I-PER", "O"]]
    assert metrics.entity_scores(gold, pred)["f1"] == 1.0
    assert metrics.entity_scores(gold, pred, mode="strict", scheme="BIO")["f1"] == 0.0
