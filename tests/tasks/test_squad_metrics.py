"""SQuAD exact match / F1 on crafted cases whose expected values follow the official scripts by hand."""

from __future__ import annotations

import pytest

from bertkit.errors import BertkitError
from bertkit.tasks.metrics import best_null_threshold, normalize_answer, squad_evaluate, squad_f1


@pytest.mark.parametrize(("text", "normalized"), [
    ("The Eiffel Tower!", "eiffel tower"),
    ("  an   apple, a pear ", "apple pear"),
    ("theory", "theory"),                 # articles only as whole words
    ("Denver Broncos.", "denver broncos"),
    ("U.S.A", "usa"),                     # punctuation removed before splitting
    ("the", ""),
])
def test_normalization(text: str, normalized: str) -> None:
    assert normalize_answer(text) == normalized


def test_f1_counts_repeated_tokens_once_per_occurrence() -> None:
    # gold: "new york new york" (4), pred: "new york" (2) -> overlap 2, P=1, R=0.5, F1=2/3
    assert squad_f1("new york new york", "New York") == pytest.approx(2 / 3)
    assert squad_f1("cat", "dog") == 0.0
    assert squad_f1("", "") == 1.0
    assert squad_f1("", "something") == 0.0


def test_v1_scores_take_the_max_over_gold_answers() -> None:
    gold = {"q1": ["Denver Broncos", "the Denver Broncos"], "q2": ["Santa Clara, California", "Levi's Stadium"],
            "q3": ["1990"]}
    preds = {"q1": "Denver Broncos", "q2": "Levi's Stadium in Santa Clara", "q3": "in 1991"}
    results = squad_evaluate(gold, preds)
    # q2 F1: vs "santa clara california": overlap {santa, clara} P=2/5 R=2/3 -> 0.5;
    #        vs "levis stadium": overlap 2, P=2/5, R=1 -> 4/7.  q3: 0.
    assert results["exact_match"] == pytest.approx(100 / 3)
    assert results["f1"] == pytest.approx(100 * (1 + 4 / 7 + 0) / 3)
    assert results["total"] == 3
    assert "HasAns_exact" not in results


def test_missing_prediction_is_an_error_naming_the_id() -> None:
    with pytest.raises(BertkitError, match="'q2'"):
        squad_evaluate({"q1": ["a"], "q2": ["b"]}, {"q1": "a"})


def test_v2_no_answer_handling_and_threshold() -> None:
    gold = {"a1": ["Paris"], "a2": ["blue whale"], "n1": [], "n2": []}
    preds = {"a1": "Paris", "a2": "whale", "n1": "", "n2": "Lyon"}
    results = squad_evaluate(gold, preds)
    # exact: a1 1, a2 0, n1 1 (empty == empty), n2 0; f1: a2 = 2/3 (P=1, R=1/2)
    assert results["exact_match"] == pytest.approx(50.0)
    assert results["f1"] == pytest.approx(100 * (1 + 2 / 3 + 1 + 0) / 4)
    assert (results["HasAns_exact"], results["NoAns_exact"]) == (pytest.approx(50.0), pytest.approx(50.0))
    assert results["HasAns_total"] == results["NoAns_total"] == 2
    assert results["HasAns_f1"] == pytest.approx(100 * (1 + 2 / 3) / 2)


def test_v2_threshold_search_walks_null_odds_in_increasing_order() -> None:
    gold = {"a1": ["Paris"], "a2": ["blue whale"], "n1": [], "n2": []}
    preds = {"a1": "Paris", "a2": "whale", "n1": "", "n2": "Lyon"}
    odds = {"a1": -3.0, "a2": 1.0, "n2": 2.0, "n1": 5.0}
    # Start: all "no answer" -> 2 correct (n1, n2). a1 (-3): +1 -> 3 (best, thresh -3);
    # a2 (1): +0 exact -> 3 (no improvement); n2 (2): predicted "Lyon" -> 2; n1 (5): empty pred -> 2.
    exact = {"a1": 1, "a2": 0, "n1": 1, "n2": 0}
    assert best_null_threshold(exact, preds, odds, {"a1": True, "a2": True, "n1": False, "n2": False}) \
        == (pytest.approx(75.0), -3.0)
    results = squad_evaluate(gold, preds, null_odds=odds, null_odds_threshold=1.5)
    assert results["best_exact"] == pytest.approx(75.0) and results["best_exact_thresh"] == -3.0
    # f1 walk: 2 -> a1 3 -> a2 3+2/3 (best, thresh 1.0) -> n2 2+2/3 -> n1 2+2/3
    assert results["best_f1"] == pytest.approx(100 * (3 + 2 / 3) / 4) and results["best_f1_thresh"] == 1.0
    # --na-prob-thresh 1.5: n2 (2.0) and n1 (5.0) become "no answer" -> both correct.
    assert results["exact_match"] == pytest.approx(75.0)
