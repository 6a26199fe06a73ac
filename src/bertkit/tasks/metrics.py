"""Evaluation metrics of the fine-tuning tasks, written to match their reference definitions exactly.

- GLUE: accuracy, binary F1 (positive class 1), Matthews correlation, Pearson and Spearman, with
  scikit-learn's / scipy's conventions (a degenerate Matthews denominator gives 0; Spearman ranks ties
  by their average rank).
- Entity-level precision/recall/F1 for tagging (CoNLL-2003). Design decision: the default ("conlleval")
  mode follows the chunking rules of the conlleval Perl script, which is also seqeval's default mode: it
  accepts BIO (IOB2), IOB1 and BIOES alike and recovers an entity from any tag sequence, so an invalid
  prediction such as `O I-PER` still counts. The "strict" mode only accepts entities well formed in the
  declared scheme (BIO: `B-X (I-X)*`; BIOES: `S-X | B-X (I-X)* E-X`) and equals seqeval's
  `mode="strict"` with `IOB2` / `IOBES`.
- SQuAD: exact match and F1 as the official v1.1 and v2.0 evaluation scripts define them (lower-case,
  strip punctuation and the articles a/an/the, collapse whitespace; maximum over gold answers; an
  unanswerable question has the gold answer ""), plus the v2.0 no-answer threshold search.

References: GLUE (Wang et al., 2018); conlleval.pl (CoNLL-2000 shared task); seqeval; the SQuAD
`evaluate-v1.1.py` / `evaluate-v2.0.py` scripts (Rajpurkar et al., 2016, 2018).
"""

from __future__ import annotations

import collections
import math
import re
import string
from collections.abc import Mapping, Sequence

import numpy as np

from bertkit.errors import BertkitError

# --- GLUE -------------------------------------------------------------------------------------------


def accuracy(labels: Sequence[int], predictions: Sequence[int]) -> float:
    labels_arr, preds_arr = _paired(labels, predictions)
    return float((labels_arr == preds_arr).mean())


def binary_f1(labels: Sequence[int], predictions: Sequence[int], positive: int = 1) -> float:
    """F1 of the positive class (GLUE's F1 for MRPC and QQP); 0 when there are no true or predicted positives."""
    labels_arr, preds_arr = _paired(labels, predictions)
    true_pos = float(np.sum((preds_arr == positive) & (labels_arr == positive)))
    denominator = float(np.sum(preds_arr == positive) + np.sum(labels_arr == positive))
    return 2.0 * true_pos / denominator if denominator else 0.0


def matthews_correlation(labels: Sequence[int], predictions: Sequence[int]) -> float:
    """Multi-class Matthews correlation (Gorodkin's R_K, as scikit-learn); 0 when undefined."""
    labels_arr, preds_arr = _paired(labels, predictions)
    classes, encoded = np.unique(np.concatenate([labels_arr, preds_arr]), return_inverse=True)
    k = len(classes)
    confusion = np.zeros((k, k), dtype=np.float64)
    np.add.at(confusion, (encoded[: len(labels_arr)], encoded[len(labels_arr):]), 1.0)
    true_counts, pred_counts = confusion.sum(axis=1), confusion.sum(axis=0)
    correct, total = np.trace(confusion), confusion.sum()
    covariance = correct * total - np.dot(true_counts, pred_counts)
    denominator = math.sqrt((total**2 - np.dot(pred_counts, pred_counts))
                            * (total**2 - np.dot(true_counts, true_counts)))
    return float(covariance / denominator) if denominator else 0.0


def pearson(labels: Sequence[float] | np.ndarray, predictions: Sequence[float] | np.ndarray) -> float:
    labels_arr, preds_arr = _paired(labels, predictions, dtype=np.float64)
    x, y = labels_arr - labels_arr.mean(), preds_arr - preds_arr.mean()
    denominator = math.sqrt(float(np.dot(x, x)) * float(np.dot(y, y)))
    return float(np.dot(x, y) / denominator) if denominator else float("nan")


def spearman(labels: Sequence[float], predictions: Sequence[float]) -> float:
    labels_arr, preds_arr = _paired(labels, predictions, dtype=np.float64)
    return pearson(_average_ranks(labels_arr), _average_ranks(preds_arr))


def _average_ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks; tied values share the mean of the ranks they span."""
    order = np.argsort(values, kind="mergesort")
    sorted_values = values[order]
    # Start index of each run of equal values, and the run each sorted position belongs to.
    starts = np.flatnonzero(np.r_[True, sorted_values[1:] != sorted_values[:-1]])
    run_of = np.cumsum(np.r_[True, sorted_values[1:] != sorted_values[:-1]]) - 1
    ends = np.r_[starts[1:], len(values)]
    mean_rank = (starts + ends + 1) / 2.0  # mean of ranks start+1 .. end
    ranks = np.empty(len(values), dtype=np.float64)
    ranks[order] = mean_rank[run_of]
    return ranks


def _paired(a: Sequence | np.ndarray, b: Sequence | np.ndarray,
            dtype: type = np.int64) -> tuple[np.ndarray, np.ndarray]:
    if len(a) != len(b):
        raise ValueError(f"{len(a)} labels but {len(b)} predictions")
    if len(a) == 0:
        raise BertkitError("cannot compute a metric on an empty evaluation set; check the --dev file")
    return np.asarray(a, dtype=dtype), np.asarray(b, dtype=dtype)


# Which metrics each GLUE task reports, and the one that selects the best checkpoint (listed first).
GLUE_METRICS: dict[str, tuple[str, ...]] = {
    "cola": ("matthews_correlation",),
    "sst2": ("accuracy",),
    "mrpc": ("f1", "accuracy"),
    "stsb": ("pearson", "spearman"),
    "qqp": ("f1", "accuracy"),
    "mnli": ("accuracy",),
    "qnli": ("accuracy",),
    "rte": ("accuracy",),
    "wnli": ("accuracy",),
}

_METRIC_FUNCTIONS = {
    "accuracy": accuracy,
    "f1": binary_f1,
    "matthews_correlation": matthews_correlation,
    "pearson": pearson,
    "spearman": spearman,
}


def classification_metrics(names: Sequence[str], labels: Sequence, predictions: Sequence) -> dict[str, float]:
    """The named metrics, e.g. `("f1", "accuracy")`, as a dict by name."""
    return {name: _METRIC_FUNCTIONS[name](labels, predictions) for name in names}


# --- Entity-level tagging metrics ---------------------------------------------------------------



def _split_tag(tag: str) -> tuple[str, str]:
    """'B-PER' -> ('B', 'PER'); 'O' -> ('O', ''). A tag without a type gets the type '_' (as conlleval)."""
    if tag == "O":
        return "O", ""
    prefix, _, entity_type = tag.partition("-")
    return prefix, entity_type or "_"


def _chunk_ends(prev_prefix: str, prev_type: str, prefix: str, entity_type: str) -> bool:
    """conlleval's endOfChunk: does the chunk holding the previous tag end before this tag?"""
    if prev_prefix in ("E", "S"):
        return True
    if prev_prefix in ("B", "I") and prefix in ("B", "S", "O"):
        return True
    return prev_prefix != "O" and prev_type != entity_type


def _chunk_starts(prev_prefix: str, prev_type: str, prefix: str, entity_type: str) -> bool:
    """conlleval's startOfChunk: does a new chunk start at this tag?"""
    if prefix in ("B", "S"):
        return True
    if prefix in ("I", "E") and prev_prefix in ("E", "S", "O"):
        return True
    return prefix != "O" and prev_type != entity_type


def entities_conlleval(tags: Sequence[str]) -> set[tuple[str, int, int]]:
    """Chunks `(type, start, end_inclusive)` of one sentence by conlleval's rules (any scheme)."""
    chunks: set[tuple[str, int, int]] = set()
    prev_prefix, prev_type, begin = "O", "", 0
    for i, tag in enumerate([*tags, "O"]):
        prefix, entity_type = _split_tag(tag)
        if _chunk_ends(prev_prefix, prev_type, prefix, entity_type):
            chunks.add((prev_type, begin, i - 1))
        if _chunk_starts(prev_prefix, prev_type, prefix, entity_type):
            begin = i
        prev_prefix, prev_type = prefix, entity_type
    return chunks


def entities_strict(tags: Sequence[str], scheme: str) -> set[tuple[str, int, int]]:
    """Entities well formed in `scheme` ('BIO' or 'BIOES'); malformed tag runs are not entities."""
    if scheme not in ("BIO", "BIOES"):
        raise BertkitError(f"strict entity matching supports the BIO and BIOES schemes, not {scheme!r}")
    split = [_split_tag(tag) for tag in tags]
    entities: set[tuple[str, int, int]] = set()
    i = 0
    while i < len(split):
        prefix, entity_type = split[i]
        if prefix == "S" and scheme == "BIOES":
            entities.add((entity_type, i, i))
        if prefix != "B":
            i += 1
            continue
        end = i + 1
        while end < len(split) and split[end] == ("I", entity_type):
            end += 1
        if scheme == "BIO":
            entities.add((entity_type, i, end - 1))
        elif end < len(split) and split[end] == ("E", entity_type):
            entities.add((entity_type, i, end))
            end += 1
        i = end
    return entities


def entity_scores(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]],
                  mode: str = "conlleval", scheme: str = "BIO") -> dict[str, float]:
    """Micro-averaged entity precision, recall and F1 over sentences (0 where undefined, as seqeval)."""
    if len(gold) != len(predicted):
        raise ValueError(f"{len(gold)} gold sentences but {len(predicted)} predicted")
    true_count = pred_count = correct = 0
    for gold_tags, pred_tags in zip(gold, predicted):
        if len(gold_tags) != len(pred_tags):
            raise ValueError(f"sentence of {len(gold_tags)} gold tags but {len(pred_tags)} predicted")
        if mode == "conlleval":
            gold_set, pred_set = entities_conlleval(gold_tags), entities_conlleval(pred_tags)
        elif mode == "strict":
            gold_set, pred_set = entities_strict(gold_tags, scheme), entities_strict(pred_tags, scheme)
        else:
            raise BertkitError(f"entity matching mode must be 'conlleval' or 'strict', not {mode!r}")
        true_count += len(gold_set)
        pred_count += len(pred_set)
        correct += len(gold_set & pred_set)
    precision = correct / pred_count if pred_count else 0.0
    recall = correct / true_count if true_count else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1}


# --- SQuAD ----------------------------------------------------------------------------------------

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """Lower-case, drop punctuation, drop articles, collapse whitespace (the official order)."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def squad_exact(gold: str, prediction: str) -> int:
    return int(normalize_answer(gold) == normalize_answer(prediction))


def squad_f1(gold: str, prediction: str) -> float:
    """Token-overlap F1 of normalised answers; if either is empty, 1 when both are, else 0 (v2.0 rule)."""
    gold_tokens, pred_tokens = normalize_answer(gold).split(), normalize_answer(prediction).split()
    if not gold_tokens or not pred_tokens:
        return float(gold_tokens == pred_tokens)
    common = collections.Counter(gold_tokens) & collections.Counter(pred_tokens)
    overlap = sum(common.values())
    if overlap == 0:
        return 0.0
    precision, recall = overlap / len(pred_tokens), overlap / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def _gold_texts(answers: Sequence[str]) -> list[str]:
    # v2.0: answers that normalise to nothing are dropped; an unanswerable question's gold is "".
    golds = [text for text in answers if normalize_answer(text)]
    return golds or [""]


def squad_raw_scores(gold_answers: Mapping[str, Sequence[str]], predictions: Mapping[str, str],
                     ) -> tuple[dict[str, int], dict[str, float]]:
    """Per-question exact and F1, each the maximum over the gold answers. Missing predictions are errors."""
    missing = [qid for qid in gold_answers if qid not in predictions]
    if missing:
        raise BertkitError(f"no prediction for {len(missing)} question(s), e.g. id {missing[0]!r}")
    exact, f1 = {}, {}
    for qid, answers in gold_answers.items():
        golds = _gold_texts(answers)
        exact[qid] = max(squad_exact(g, predictions[qid]) for g in golds)
        f1[qid] = max(squad_f1(g, predictions[qid]) for g in golds)
    return exact, f1


def best_null_threshold(scores: Mapping[str, float], predictions: Mapping[str, str],
                        null_odds: Mapping[str, float], has_answer: Mapping[str, bool]) -> tuple[float, float]:
    """The v2.0 script's search: (best score in percent, threshold) over thresholds at each null odds value.

    Start from predicting "no answer" everywhere; walk the questions by increasing null odds and switch
    each to its span prediction, keeping the running score's first maximum.
    """
    current: float
    best: float
    current = best = sum(1 for qid in scores if not has_answer[qid])
    threshold = 0.0
    for qid in sorted(null_odds, key=lambda q: null_odds[q]):
        if qid not in scores:
            continue
        if has_answer[qid]:
            current += scores[qid]
        elif predictions[qid]:
            current -= 1
        if current > best:
            best, threshold = current, null_odds[qid]
    return 100.0 * best / len(scores), threshold


def squad_evaluate(gold_answers: Mapping[str, Sequence[str]], predictions: Mapping[str, str],
                   null_odds: Mapping[str, float] | None = None, null_odds_threshold: float = 1.0,
                   ) -> dict[str, float]:
    """SQuAD scores in percent: `exact_match`, `f1`, for sets with unanswerable questions the v2.0
    script's `HasAns_*`, `NoAns_*`, and given `null_odds` (any set) `best_exact`/`best_f1` with thresholds.

    With `null_odds`, a question whose odds exceed `null_odds_threshold` counts as answered "no answer"
    (the v2.0 script's --na-prob-thresh, default 1.0).
    """
    if not gold_answers:
        raise BertkitError("cannot evaluate SQuAD on an empty set of questions")
    exact_raw, f1_raw = squad_raw_scores(gold_answers, predictions)
    # As the v2.0 script: a question is answerable when its list of gold answers is not empty.
    has_answer = {qid: bool(answers) for qid, answers in gold_answers.items()}
    exact: dict[str, float] = dict(exact_raw)
    f1: dict[str, float] = dict(f1_raw)
    if null_odds is not None:
        for qid in gold_answers:
            if null_odds.get(qid, 0.0) > null_odds_threshold:
                exact[qid] = f1[qid] = float(not has_answer[qid])
    results = {"exact_match": 100.0 * sum(exact.values()) / len(exact),
               "f1": 100.0 * sum(f1.values()) / len(f1), "total": len(exact)}
    if not all(has_answer.values()):
        for name, keep in (("HasAns", True), ("NoAns", False)):
            qids = [qid for qid in gold_answers if has_answer[qid] == keep]
            if qids:
                results[f"{name}_exact"] = 100.0 * sum(exact[q] for q in qids) / len(qids)
                results[f"{name}_f1"] = 100.0 * sum(f1[q] for q in qids) / len(qids)
                results[f"{name}_total"] = len(qids)
    # As the v2.0 script: the threshold search whenever there are null odds, unanswerable questions or not.
    if null_odds is not None:
        full_odds = {qid: null_odds.get(qid, 0.0) for qid in gold_answers}
        results["best_exact"], results["best_exact_thresh"] = best_null_threshold(
            exact_raw, predictions, full_odds, has_answer)
        results["best_f1"], results["best_f1_thresh"] = best_null_threshold(
            f1_raw, predictions, full_odds, has_answer)
    return results
