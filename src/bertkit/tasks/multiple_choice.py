"""Multiple choice (SWAG): one `[CLS] context [SEP] start + ending [SEP]` input per choice, one score each.

`BertForMultipleChoice` scores each (context, choice) pair from its pooled [CLS] vector with one shared
vector; a softmax over the choices gives the answer, trained with cross-entropy on the right choice's
index (the paper's section 4.4). Design decision: each example's choices are encoded as a group and the
batch is a (B, C, T) tensor, so choices of one example are always scored together; inputs longer than
`max_seq_length` are truncated longest-first and the number of examples affected is reported.

References: Devlin et al. (2018), section 4.4; Zellers et al. (2018).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar, cast

import numpy as np
import torch
import torch.nn.functional as F

from bertkit.data.swag import ChoiceExample, read_choices
from bertkit.model import BertForMultipleChoice
from bertkit.model.feature_based import FeatureHead
from bertkit.settings import MultipleChoiceSettings
from bertkit.tasks.metrics import accuracy
from bertkit.tasks.task import BaseTask, write_jsonl

log = logging.getLogger(__name__)


class MultipleChoiceTask(BaseTask):
    """Multiple choice as a `bertkit.tasks.task.Task`."""

    settings_class = MultipleChoiceSettings
    kind = MultipleChoiceSettings.kind
    model_class = BertForMultipleChoice
    input_axes: ClassVar[tuple[str, ...]] = ("batch", "choices", "sequence")  # (B, C, T): choices scored together
    settings: MultipleChoiceSettings

    @property
    def metric_names(self) -> tuple[str, ...]:
        return ("accuracy",)

    def feature_head(self) -> FeatureHead:
        return FeatureHead(1)  # one score per choice, read at its [CLS]

    def read(self, path: str | Path, labelled: bool = True, training: bool = False,
             ) -> tuple[list[ChoiceExample], list[str]]:
        return read_choices(path, labelled=labelled), []

    def features(self, examples: Sequence[ChoiceExample], tokenizer: Any, training: bool = False) -> list[dict]:
        contexts = [e.context for e in examples for _ in e.endings]
        seconds = [e.second_segment(ending) for e in examples for ending in e.endings]
        encodings = tokenizer.encode_batch(contexts, seconds, max_length=self.settings.max_seq_length, truncation=True)
        self._report_truncation(examples, encodings)
        features, cursor = [], 0
        for example in examples:
            group = encodings[cursor:cursor + len(example.endings)]  # C encodings
            cursor += len(example.endings)
            feature: dict[str, Any] = {"input_ids": [e.input_ids for e in group],
                                       "token_type_ids": [e.token_type_ids for e in group],
                                       "attention_mask": [e.attention_mask for e in group]}
            if example.label is not None:
                feature["labels"] = example.label
            features.append(feature)
        return features

    def _report_truncation(self, examples: Sequence[ChoiceExample], encodings: Sequence[Any]) -> None:
        too_long, cursor = 0, 0
        for example in examples:
            too_long += any(e.truncated for e in encodings[cursor:cursor + len(example.endings)])
            cursor += len(example.endings)
        if too_long:
            log.warning("%d of %d examples have a choice longer than --max-seq-length %d; truncated longest-first",
                        too_long, len(examples), self.settings.max_seq_length)
        self.last_truncated = too_long

    def loss(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        logits = model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"]).logits  # (B, C)
        return F.cross_entropy(logits.float(), batch["labels"]), {}

    def decode(self, examples: Sequence[ChoiceExample], features: Sequence[dict],
               outputs: dict[str, list[np.ndarray]]) -> list[dict[str, Any]]:
        predictions = []
        for example, scores in zip(examples, outputs["logits"]):
            probabilities = np.exp(scores - scores.max())
            probabilities /= probabilities.sum()
            predictions.append({"id": example.guid, "label": int(scores.argmax()),
                                "probabilities": [float(p) for p in probabilities]})
        return predictions

    def score(self, examples: Sequence[ChoiceExample], predictions: Sequence[dict]) -> dict[str, float]:
        gold = cast(list[int], [e.label for e in examples])  # read(labelled=True) gives every example its label
        return {"accuracy": accuracy(gold, [p["label"] for p in predictions])}

    def write_predictions(self, examples: Sequence[ChoiceExample], predictions: Sequence[dict], directory: Path,
                          prefix: str) -> list[Path]:
        return [write_jsonl(directory / f"{prefix}predictions.jsonl", predictions)]
