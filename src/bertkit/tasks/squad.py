"""Extractive question answering (SQuAD v1.1 / v2.0): windows over long contexts, span post-processing.

Features: `[CLS] question [SEP] context window [SEP]`, the question cut to `max_query_length` tokens,
the context split into windows of at most `max_seq_length - len(question) - 3` tokens that start every
`doc_stride` tokens. Each context token keeps its character offsets, so an answer's characters map to
token positions, and the span of its whole word, so a predicted span maps back to whole words of the
original context.

Post-processing follows the original `write_predictions`: the `n_best_size` best start and end logits of
every window are paired; a pair counts when both ends are context tokens, the start token has its
*maximum context* in this window (the window where it has most tokens on its shorter side), start <= end
and the span has at most `max_answer_length` tokens. The answer is the context from the start of the
word of the start token to the end of the word of the end token (words as the tokenizer splits them: at
whitespace and punctuation), so a span that starts or ends on a word piece never answers part of a
word. For v2.0 the null score is start+end logit at [CLS], the minimum over windows; the question is
answered "" when null score minus the best span score exceeds `null_score_diff_threshold` (chosen on dev).

Design decision: whole tokenizer words from offsets and word ids, the rule of transformers'
question-answering pipeline (`align_to_words`), instead of the original's whitespace words and
`get_final_text`. The original takes the whitespace words the span touches and cuts that text back to
the characters of the predicted pieces (found by string search after basic tokenization), so it answers
"lement" for a span "##lem ##ent" of "complement" and falls back to the whole whitespace words
(punctuation and all) when its alignment fails. Here the answer is always an exact slice of the context
made of whole words, with punctuation that is a word of its own left out unless the span covers it.

References: Devlin et al. (2018), section 4.2-4.3; google-research/bert `run_squad.py`.
"""

from __future__ import annotations

import collections
import json
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from bertkit.data.squad import SquadExample, read_squad
from bertkit.errors import BertkitError
from bertkit.io.atomic import write_text_atomic
from bertkit.model import BertForQuestionAnswering
from bertkit.model.feature_based import FeatureHead
from bertkit.settings import SquadSettings
from bertkit.tasks.metrics import squad_evaluate
from bertkit.tasks.task import BaseTask
from bertkit.tasks.windows import max_context_flags, sliding_windows

log = logging.getLogger(__name__)


def whole_word_spans(offsets: Sequence[tuple[int, int]], word_ids: Sequence[int]) -> list[tuple[int, int]]:
    """For each token, the character span of the whole word it belongs to (words as the tokenizer splits
    them: at whitespace and punctuation), e.g. (0, 10) for each of "comp", "##lem", "##ent" of "complement"."""
    spans: dict[int, tuple[int, int]] = {}
    for (start, end), word in zip(offsets, word_ids):
        first, last = spans.get(word, (start, end))
        spans[word] = (min(first, start), max(last, end))
    return [spans[word] for word in word_ids]


def _token_span(offsets: Sequence[tuple[int, int]], char_start: int, char_end: int) -> tuple[int, int] | None:
    """First and last context token overlapping characters [char_start, char_end), None if none does."""
    inside = [i for i, (s, e) in enumerate(offsets) if e > char_start and s < char_end]
    return (inside[0], inside[-1]) if inside else None


class SquadTask(BaseTask):
    """SQuAD as a `bertkit.tasks.task.Task`."""

    settings_class = SquadSettings
    kind = SquadSettings.kind
    model_class = BertForQuestionAnswering
    output_names: ClassVar[tuple[str, ...]] = ("start_logits", "end_logits")
    token_level_outputs: ClassVar[tuple[str, ...]] = ("start_logits", "end_logits")
    settings: SquadSettings
    _kept_threshold_said = False  # select_on_dev's warning, once per task

    @property
    def metric_names(self) -> tuple[str, ...]:
        return ("f1", "exact_match")

    def feature_head(self) -> FeatureHead:
        return FeatureHead(2, per_token=True, span=True)  # start and end scores at every token

    def read(self, path: str | Path, labelled: bool = True, training: bool = False,
             ) -> tuple[list[SquadExample], list[str]]:
        """Questions of a SQuAD JSON file or a table in the `datasets` squad layout (`read_squad`)."""
        return read_squad(path, training=training, version_2_with_negative=self.settings.version_2_with_negative,
                          labelled=labelled)

    # --- features -------------------------------------------------------------------------------

    def features(self, examples: Sequence[SquadExample], tokenizer: Any, training: bool = False) -> list[dict]:
        s = self.settings
        questions = tokenizer.encode_ids([e.question for e in examples])
        features: list[dict] = []
        for index, (example, question) in enumerate(zip(examples, questions)):
            question = question[: s.max_query_length]
            window = s.max_seq_length - len(question) - 3  # [CLS] q [SEP] ... [SEP]
            if window <= 0:
                raise BertkitError(f"--max-seq-length {s.max_seq_length} leaves no room for the context after a "
                                   f"{len(question)}-token question; raise it or lower --max-query-length")
            context = tokenizer.encode(example.context, truncation=False)
            keep = [i for i, seq in enumerate(context.sequence_ids) if seq is not None]  # drop [CLS]/[SEP]
            ids = [context.input_ids[i] for i in keep]
            offsets = [tuple(context.offsets[i]) for i in keep]
            words = whole_word_spans(offsets, [context.word_ids[i] for i in keep])
            spans = sliding_windows(len(ids), window, s.doc_stride)
            for (start, size), flags in zip(spans, max_context_flags(spans)):
                feature = self._window(tokenizer, question, ids, words, start, size, flags, index)
                if training:
                    self._add_positions(feature, example, offsets, start, size)
                features.append(feature)
        return features

    def _window(self, tokenizer: Any, question: list[int], ids: list[int], words: list[tuple[int, int]],
                start: int, size: int, flags: list[bool], example_index: int) -> dict:
        prefix = len(question) + 2  # tokens before the first context token
        input_ids = [tokenizer.cls_token_id, *question, tokenizer.sep_token_id, *ids[start:start + size],
                     tokenizer.sep_token_id]
        return {
            "input_ids": input_ids,
            "token_type_ids": [0] * prefix + [1] * (size + 1),
            "attention_mask": [1] * len(input_ids),
            "example_index": example_index,
            # Character span of the whole word of each position's token; None outside the context.
            "word_spans": [None] * prefix + words[start:start + size] + [None],
            "max_context": [False] * prefix + flags + [False],
        }

    def _add_positions(self, feature: dict, example: SquadExample, offsets: list[tuple[int, int]],
                       start: int, size: int) -> None:
        """start/end_positions of the answer; 0 ([CLS]) when unanswerable or outside this window."""
        feature["start_positions"] = feature["end_positions"] = 0
        if example.is_impossible:
            return
        text, char_start = example.answers[0]
        span = _token_span(offsets, char_start, char_start + len(text))
        if span is None:
            raise BertkitError(f"question id {example.qid!r}: the answer {text!r} covers no token of the context; "
                               "fix or remove the question")
        first, last = span
        prefix = len(feature["input_ids"]) - size - 1
        if first >= start and last < start + size:
            feature["start_positions"], feature["end_positions"] = first - start + prefix, last - start + prefix

    # --- loss and decoding ----------------------------------------------------------------------

    def loss(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        out = model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
        # Padding is no answer position: left in the softmax, it would make the loss depend on how long the
        # other inputs of the micro-batch are (and so on the micro-batch size and the number of processes).
        padding = batch["attention_mask"] == 0  # (B, T)
        lowest = torch.finfo(torch.float32).min
        start = F.cross_entropy(out.start_logits.float().masked_fill(padding, lowest), batch["start_positions"])
        end = F.cross_entropy(out.end_logits.float().masked_fill(padding, lowest), batch["end_positions"])
        return (start + end) / 2, {}

    def decode(self, examples: Sequence[SquadExample], features: Sequence[dict],
               outputs: dict[str, list[np.ndarray]]) -> dict[str, dict]:
        """By question id: "predictions" (after the null threshold), "span_predictions" (best non-null
        span), "nbest", and "null_odds" (null score minus best span score; empty for v1.1)."""
        by_example: dict[int, list[int]] = collections.defaultdict(list)
        for i, feature in enumerate(features):
            by_example[feature["example_index"]].append(i)
        result: dict[str, dict] = {"predictions": {}, "span_predictions": {}, "nbest": {}, "null_odds": {}}
        for index, example in enumerate(examples):
            windows = [(features[i], outputs["start_logits"][i], outputs["end_logits"][i]) for i in by_example[index]]
            nbest, null_score = self._nbest(example, windows)
            # As the original: the best entry with text; if there is none, the scores count as 0.
            best_span: dict[str, Any] = next((e for e in nbest if e["text"]),
                                             {"start_logit": 0.0, "end_logit": 0.0, "text": ""})
            qid = example.qid
            result["nbest"][qid] = nbest
            result["span_predictions"][qid] = best_span["text"]
            if self.settings.version_2_with_negative:
                result["null_odds"][qid] = null_score - best_span["start_logit"] - best_span["end_logit"]
            else:
                result["predictions"][qid] = nbest[0]["text"]
        if self.settings.version_2_with_negative:
            result["predictions"] = self._thresholded(result, self.settings.null_score_diff_threshold)
        return result

    @staticmethod
    def _thresholded(decoded: dict[str, dict], threshold: float) -> dict[str, str]:
        return {qid: "" if decoded["null_odds"][qid] > threshold else text
                for qid, text in decoded["span_predictions"].items()}

    def _nbest(self, example: SquadExample, windows: list[tuple[dict, np.ndarray, np.ndarray]],
               ) -> tuple[list[dict], float]:
        s = self.settings
        # (score, start logit, end logit, text, start char, end char)
        candidates: list[tuple[float, float, float, str, int | None, int | None]] = []
        null = (math.inf, 0.0, 0.0)
        for feature, start_logits, end_logits in windows:
            if start_logits[0] + end_logits[0] < null[0]:
                null = (float(start_logits[0] + end_logits[0]), float(start_logits[0]), float(end_logits[0]))
            words, flags = feature["word_spans"], feature["max_context"]
            for i in np.argsort(-start_logits, kind="stable")[: s.n_best_size]:
                for j in np.argsort(-end_logits, kind="stable")[: s.n_best_size]:
                    if words[i] is None or words[j] is None or not flags[i] or j < i \
                            or j - i + 1 > s.max_answer_length:
                        continue
                    start_char, end_char = words[i][0], words[j][1]  # whole words, never a piece
                    candidates.append((float(start_logits[i] + end_logits[j]), float(start_logits[i]),
                                       float(end_logits[j]), example.context[start_char:end_char],
                                       start_char, end_char))
        if s.version_2_with_negative:
            candidates.append((null[0], null[1], null[2], "", None, None))
        candidates.sort(key=lambda c: c[0], reverse=True)
        seen, kept = set(), []
        for candidate in candidates:
            if candidate[3] in seen:
                continue
            seen.add(candidate[3])
            kept.append(candidate)
            if len(kept) == s.n_best_size:
                break
        if s.version_2_with_negative and "" not in seen:
            kept.append((null[0], null[1], null[2], "", None, None))
        if not kept:
            kept.append((0.0, 0.0, 0.0, "empty", None, None))  # as the original: no valid span at all
        scores = np.array([c[0] for c in kept])
        probabilities = np.exp(scores - scores.max())
        probabilities /= probabilities.sum()
        # The original's four fields, plus the answer's character span in the context (None: no span).
        nbest = [{"text": c[3], "probability": float(p), "start_logit": c[1], "end_logit": c[2],
                  "start_char": c[4], "end_char": c[5]} for c, p in zip(kept, probabilities)]
        return nbest, null[0]

    @staticmethod
    def _gold(examples: Sequence[SquadExample]) -> dict[str, list[str]]:
        return {e.qid: [] if e.is_impossible else [text for text, _ in e.answers] for e in examples}

    def _threshold_search(self, examples: Sequence[SquadExample], decoded: dict[str, dict]) -> dict[str, float]:
        """The v2.0 script's best_exact/best_f1 and thresholds, over the span predictions and null odds."""
        search = squad_evaluate(self._gold(examples), decoded["span_predictions"], null_odds=decoded["null_odds"],
                                null_odds_threshold=math.inf)
        return {k: v for k, v in search.items() if k.startswith("best_")}

    def score(self, examples: Sequence[SquadExample], decoded: dict[str, dict]) -> dict[str, float]:
        """Official scores of the predictions; for v2.0 also the threshold in use and the best-threshold search."""
        results = squad_evaluate(self._gold(examples), decoded["predictions"])
        if self.settings.version_2_with_negative:
            results.update(self._threshold_search(examples, decoded),
                           null_score_diff_threshold=self.settings.null_score_diff_threshold)
        return results

    def select_on_dev(self, examples: Sequence[SquadExample], decoded: dict[str, dict]) -> dict[str, dict]:
        """v2.0: adopt the null-score threshold that maximises dev F1 and re-decide the predictions with it.

        A dev set without both kinds of question (e.g. a v1.1 file, every question answerable) cannot place
        the threshold: the search would push it past every dev question's null odds, so the model would never
        answer "no answer". The threshold then stays at `null_score_diff_threshold` (0.0, run_squad.py's
        default: "no answer" when the null score beats the best span), said once in the log."""
        if not self.settings.version_2_with_negative:
            return decoded
        kinds = {bool(answers) for answers in self._gold(examples).values()}
        if kinds != {True, False}:
            if not self._kept_threshold_said:
                self._kept_threshold_said = True
                log.warning("the dev set has %s: the SQuAD 2.0 no-answer threshold cannot be chosen on it; it "
                            "stays %g (no answer when the null score beats the best span's by more)",
                            "no unanswerable question" if True in kinds else "no answerable question",
                            self.settings.null_score_diff_threshold)
            return decoded
        self.settings.null_score_diff_threshold = float(self._threshold_search(examples, decoded)["best_f1_thresh"])
        return {**decoded, "predictions": self._thresholded(decoded, self.settings.null_score_diff_threshold)}

    def write_predictions(self, examples: Sequence[SquadExample], decoded: dict[str, dict], directory: Path,
                          prefix: str) -> list[Path]:
        """predictions.json, nbest_predictions.json and (v2.0) null_odds.json, as the original writes them."""
        files = [("predictions.json", decoded["predictions"]), ("nbest_predictions.json", decoded["nbest"])]
        if self.settings.version_2_with_negative:
            files.append(("null_odds.json", decoded["null_odds"]))
        paths = []
        for name, content in files:
            path = directory / f"{prefix}{name}"
            write_text_atomic(path, json.dumps(content, indent=2) + "\n")
            paths.append(path)
        return paths
