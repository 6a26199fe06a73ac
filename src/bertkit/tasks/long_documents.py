"""Documents longer than the model, for classification and regression: overlapping windows of
max_seq_length tokens, one score per window, the scores aggregated per document.

    plan_windows(first, second, max_seq_length, doc_stride, max_windows) -> WindowPlan   lengths only
    window_features(first_ids, second_ids, plan, cls_id, sep_id) -> features of one document
    aggregate_logits(logits, features, documents, how) -> (documents, num_labels)

A text of n tokens is cut into windows of max_seq_length tokens, [CLS]/[SEP] included, that start every
`doc_stride` tokens, the last one reaching the end (`bertkit.tasks.windows.sliding_windows`, the rule of
SQuAD and tagging), so every token is in at least one window and consecutive windows overlap by window -
stride tokens. A pair keeps its first text whole in every window (as SQuAD keeps the question; at most
half of the window when the second text needs the rest) and windows the second one; a first text longer
than that is cut and counted. Each window is scored by the model; a document's score is the mean of its
windows' logits (default) or, per label, their maximum.

Design decisions, each with its reason:
- Training sees every window as an example with its document's label; evaluation and prediction
  aggregate. This is the segment-level fine-tuning of Pappagari et al. (2019, "Hierarchical Transformers
  for Long Document Classification": segments with the document's label, aggregated afterwards) and the
  usual answer on the Hugging Face forum (tokenize with overflowing windows, repeat the label, average at
  prediction). Aggregating inside training (Sun et al. 2019's hierarchical pooling of window [CLS]
  vectors) needs all of a document's windows in one batch, so memory grows with the document; windows as
  examples keep the training step, the batch size and resume exactly as they are. A window that does not
  hold the evidence is trained towards the document's label anyway: that label noise is what the model
  learns to answer with low confidence, so such windows move the mean little.
- The mean of logits is the default: it is the model's log-linear pooling of the windows (a product of
  their distributions, renormalised), robust when the evidence is spread over the document (sentiment,
  topic), and a single confidently wrong window cannot decide alone. The maximum (per label) answers "does
  any window say so" and suits a label decided by one passage; measured on docs/finetuning.md's task.
- Cost is linear in the document's length and bounded: at most `max_windows` windows per document; a
  longer one keeps its first max_windows - 1 windows and its last (the head and the tail, the truncation
  Sun et al. 2019 found best for long reviews), and is counted as truncated.

References: Pappagari et al. (2019) arXiv:1910.10781; Sun et al. (2019) "How to Fine-Tune BERT for Text
Classification?" arXiv:1905.05583, section 5.3; google-research/bert `run_squad.py` (`doc_stride`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from bertkit.errors import BertkitError
from bertkit.settings import WINDOW_AGGREGATIONS
from bertkit.tasks.windows import sliding_windows


@dataclass(frozen=True)
class WindowPlan:
    """Which tokens of one document the windows read (lengths only, no tokens)."""

    first_kept: int
    """Tokens of the first text in every window (a pair), or 0 (one text: the text is what is windowed)."""
    spans: tuple[tuple[int, int], ...]
    """(start, length) of each window over the windowed text, after the cap."""
    needed: int
    """Windows the whole text would need (more than len(spans) when the cap cut the document)."""
    first_cut: bool
    """The first text of a pair was longer than its share of the window and was cut."""
    is_pair: bool
    """A pair: each window is [CLS] first [SEP] window [SEP]."""

    @property
    def truncated(self) -> bool:
        """Some tokens of the document are in no window."""
        return self.first_cut or self.needed > len(self.spans)

    @property
    def tokens(self) -> int:
        """Tokens the model runs for this document, specials included."""
        frame = self.first_kept + 3 if self.is_pair else 2
        return sum(size + frame for _, size in self.spans)


def plan_windows(first: int, second: int | None, max_seq_length: int, doc_stride: int | None,
                 max_windows: int) -> WindowPlan:
    """The windows of a text of `first` tokens, or of a pair (`second` tokens windowed, the first kept);
    `doc_stride` None: half of a window's room for the windowed text."""
    if second is None:
        room, windowed, kept = max_seq_length - 2, first, 0
    else:
        room = max_seq_length - 3
        kept = min(first, max(room // 2, room - second))  # the whole pair when it fits, as truncation keeps it
        room, windowed = room - kept, second
    room = max(room, 1)  # max_seq_length >= 4 is checked with the settings; never an empty window
    stride = min(doc_stride or max(room // 2, 1), room)
    spans = sliding_windows(windowed, room, stride)
    kept_spans = spans if len(spans) <= max_windows else (
        [*spans[:max_windows - 1], spans[-1]] if max_windows > 1 else spans[:1])
    return WindowPlan(kept, tuple(kept_spans), len(spans), second is not None and kept < first, second is not None)


def window_features(first_ids: Sequence[int], second_ids: Sequence[int] | None, plan: WindowPlan, cls_id: int,
                    sep_id: int) -> list[dict[str, Any]]:
    """[CLS] window [SEP], or [CLS] first [SEP] window [SEP], for each window of `plan`."""
    features = []
    for start, size in plan.spans:
        if second_ids is None:
            ids = [cls_id, *first_ids[start:start + size], sep_id]
            types = [0] * len(ids)
        else:
            head = [cls_id, *first_ids[:plan.first_kept], sep_id]
            ids = [*head, *second_ids[start:start + size], sep_id]
            types = [0] * len(head) + [1] * (size + 1)
        features.append({"input_ids": ids, "token_type_ids": types, "attention_mask": [1] * len(ids)})
    return features


def aggregate_logits(logits: Sequence[np.ndarray], features: Sequence[dict[str, Any]], documents: int,
                     how: str) -> np.ndarray:
    """(documents, num_labels): each document's window logits (the features' `document_index` says whose)
    pooled by `how`, mean or max (per label), in float64; features without one are one per document, and
    their logits come back as they are."""
    if how not in WINDOW_AGGREGATIONS:
        raise BertkitError(f"window_aggregation {how!r}: use one of {', '.join(WINDOW_AGGREGATIONS)}")
    if not features or "document_index" not in features[0]:
        return np.stack(logits)  # one feature per document, as it is
    rows = np.stack(logits).astype(np.float64)  # (W, L)
    index = np.array([f["document_index"] for f in features])
    out = np.full((documents, rows.shape[1]), -np.inf if how == "max" else 0.0)
    if how == "max":
        np.maximum.at(out, index, rows)
    else:
        np.add.at(out, index, rows)
        out /= np.bincount(index, minlength=documents)[:, None]
    return out
