"""Sentence and sentence-pair classification (GLUE) and regression (STS-B): features, loss, metrics.

Input is `[CLS] text [SEP]` or `[CLS] text [SEP] pair [SEP]`; the head reads the pooled [CLS] vector
(`BertForSequenceClassification`). Design decision: an input longer than `max_seq_length` is truncated
longest-first (the original `_truncate_seq_pair`) and the number of truncated examples is counted and
reported, never hidden, unless `long_documents` is "windows": then it is read in overlapping windows,
each a feature with its example's `document_index`, whose logits `decode` aggregates
(`bertkit.tasks.long_documents`); regression (one output, mean squared error) is chosen by the label
list being None, as STS-B's is.

References: Devlin et al. (2018), section 4.1 and figure 4 (a, b); google-research/bert
`run_classifier.py`; GLUE (Wang et al., 2018) for the metric of each task.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar, cast

import numpy as np
import torch
import torch.nn.functional as F

from bertkit.config import BertConfig
from bertkit.data.glue import TextExample, check_labels, glue_task, read_glue, read_table
from bertkit.errors import BertkitError
from bertkit.io.columnar import is_table_input
from bertkit.io.textfile import format_suffix
from bertkit.model import BertForSequenceClassification
from bertkit.settings import ClassificationSettings
from bertkit.tasks.long_documents import WindowPlan, aggregate_logits, plan_windows, window_features
from bertkit.tasks.metrics import GLUE_METRICS, classification_metrics
from bertkit.tasks.task import BaseTask, refuse_columns, write_jsonl

log = logging.getLogger(__name__)

LONG_DOCUMENT_CHOICES = ("long_documents", "doc_stride", "window_aggregation", "max_windows")
"""The `LongDocumentSettings` that predict, evaluate and serve may give in place of the saved ones."""


class ClassificationTask(BaseTask):
    """The classification task as a `bertkit.tasks.task.Task`."""

    settings_class = ClassificationSettings
    kind = ClassificationSettings.kind
    model_class = BertForSequenceClassification
    column_settings: ClassVar[tuple[str, ...]] = ("text_column", "text_pair_column", "label_column", "id_column",
                                                  "header", *LONG_DOCUMENT_CHOICES)
    settings: ClassificationSettings

    @classmethod
    def from_training_file(cls, train_path: str | Path, options: dict[str, Any]) -> ClassificationTask:
        """The labels of a GLUE task (`glue_task`; its training file is not read here), none for `regression`
        (the command's --regression), else the training file's, sorted."""
        options = dict(options)
        regression = options.pop("regression", False)
        glue = glue_task(options["glue_task"]) if options.get("glue_task") else None
        if glue is not None and glue.pair_column is not None and not options.get("text_pair_column"):
            options["text_pair_column"] = "text_pair"  # JSONL inputs of a GLUE pair task (predict/evaluate)
        s = ClassificationSettings(labels=None, **options)
        train = [] if glue else read_table(train_path, s.text_column, s.text_pair_column, s.label_column,
                                           header=s.header)[0]
        return cls(dataclasses.replace(s, labels=labels_for(s.glue_task, train, regression)))

    @classmethod
    def from_config(cls, config: BertConfig, max_seq_length: int | None = None,
                    source: str = "config.json") -> ClassificationTask:
        """config.json's labels (one output, or problem_type regression: a score); BERT's 512 tokens unless
        the directory gives a length."""
        if config.problem_type == "multi_label_classification":
            raise BertkitError(f"{source}: problem_type multi_label_classification (labels independent of each "
                               "other, a sigmoid each): bertkit's classifier gives one label a text (a softmax), "
                               "which would read these scores wrongly; use transformers for this model")
        regression = config.problem_type == "regression" or config.num_labels == 1
        return cls.from_json({"labels": None if regression else config.label_names,
                              "max_seq_length": min(max_seq_length or 512, config.max_position_embeddings)},
                             source=source)

    @property
    def is_regression(self) -> bool:
        return self.settings.labels is None

    @property
    def metric_names(self) -> tuple[str, ...]:
        if self.settings.glue_task:
            return GLUE_METRICS[self.settings.glue_task]
        return ("pearson", "spearman") if self.is_regression else ("accuracy",)

    def config_overrides(self) -> dict[str, Any]:
        labels = self.settings.labels
        if labels is None:  # regression
            return {"num_labels": 1, "id2label": {0: "score"}, "problem_type": "regression"}
        return {"num_labels": len(labels), "id2label": dict(enumerate(labels)),
                "problem_type": "single_label_classification"}

    # --- data ---------------------------------------------------------------------------------

    by_column: bool = False
    """Read every file by column name, GLUE task or not (set by `with_columns`)."""
    id_column: str | None = None
    """Column of each row's id for predictions; None: a column called "id" when the file has one."""

    def with_columns(self, text_column: str | None = None, text_pair_column: str | None = None,
                     label_column: str | None = None, id_column: str | None = None,
                     header: bool | None = None, **others: Any) -> ClassificationTask:
        """This task reading files by the given column names (the predict/evaluate flags; `header` False:
        numbers, in a file without a header row), the saved settings filling in the rest; a GLUE model
        then reads its files as generic tables too. The long-document choices given (`others`:
        `LongDocumentSettings`) replace the saved ones; another task's column settings are refused."""
        choices = {k: others.pop(k) for k in LONG_DOCUMENT_CHOICES if others.get(k) is not None}
        refuse_columns(self.kind, others)
        if text_pair_column and not self.settings.text_pair_column:
            raise BertkitError(f"--text-pair-column {text_pair_column!r}: this model was fine-tuned on single "
                               "texts, not pairs; leave the flag out")
        s = self.with_long_documents(**choices).settings
        task = ClassificationTask(dataclasses.replace(
            s, text_column=text_column or s.text_column, text_pair_column=text_pair_column or s.text_pair_column,
            label_column=label_column or s.label_column, header=s.header if header is None else header))
        given = (text_column, text_pair_column, label_column, id_column, header)
        task.by_column = self.by_column or any(v is not None for v in given)  # a long-document choice alone: no
        task.id_column = id_column or self.id_column
        return task

    def with_long_documents(self, **choices: Any) -> ClassificationTask:
        """This task with the long-document settings given (long_documents, doc_stride, window_aggregation,
        max_windows) in place of the saved ones; switching to truncate drops a saved doc_stride."""
        if not choices:
            return self
        s = self.settings
        if choices.get("long_documents") == "truncate" and "doc_stride" not in choices:
            choices["doc_stride"] = None
        task = ClassificationTask(dataclasses.replace(s, **choices))  # __post_init__ checks them
        task.by_column, task.id_column = self.by_column, self.id_column
        return task

    def read(self, path: str | Path, labelled: bool = True, training: bool = False,
             ) -> tuple[list[TextExample], list[str]]:
        """A GLUE file in the task's layout, or a .jsonl file / generic table (Parquet, `datasets`) by column
        names. A label the task does not know stops training; in any other file its row is skipped, counted
        and named. A `datasets` ClassLabel column is read as its names, unless the task's labels are numbers
        (GLUE's 0/1 tasks label as the `datasets` glue numbers do, 1 = the positive class)."""
        s = self.settings
        path = Path(path)
        if s.glue_task and not self.by_column and format_suffix(path) not in (".jsonl", ".json") \
                and not is_table_input(path):
            examples, skipped = read_glue(path, glue_task(s.glue_task), labelled=labelled)
        else:
            numbered = bool(s.labels) and all(label.isdigit() for label in s.labels or ())
            examples, skipped = read_table(path, s.text_column, s.text_pair_column,
                                           s.label_column if labelled else None, self.id_column, s.header,
                                           label_names=not numbered)
        if not labelled:
            return examples, skipped
        examples, unknown = check_labels(examples, None if s.labels is None else tuple(s.labels))
        if unknown and training:
            raise BertkitError(f"{unknown[0]}; is --task right for this training file?")
        if not examples:
            raise BertkitError(f"{path}: no examples; all {len(unknown)} rows were skipped, first: {unknown[0]}")
        return examples, skipped + unknown

    def features(self, examples: Sequence[TextExample], tokenizer: Any, training: bool = False) -> list[dict[str, Any]]:
        """input_ids/token_type_ids/attention_mask (+ labels when the examples have them); with windows,
        one feature per window, each with its example's `document_index` and label."""
        if self.settings.long_documents == "windows":
            return self.window_features(examples, tokenizer)[0]
        texts = [e.text for e in examples]
        pairs = [e.text_pair or "" for e in examples] if examples[0].text_pair is not None else None
        encodings = tokenizer.encode_batch(texts, pairs, max_length=self.settings.max_seq_length, truncation=True)
        self._report_truncation(examples, encodings)
        features = []
        for example, encoding in zip(examples, encodings):
            feature = {"input_ids": encoding.input_ids, "token_type_ids": encoding.token_type_ids,
                       "attention_mask": encoding.attention_mask}
            features.append(self._labelled(feature, example))
        return features

    def _labelled(self, feature: dict[str, Any], example: TextExample) -> dict[str, Any]:
        labels = self.settings.labels  # None: regression
        if example.label is not None:
            feature["labels"] = float(example.label) if labels is None else labels.index(example.label)
        return feature

    def window_features(self, examples: Sequence[TextExample], tokenizer: Any,
                        ) -> tuple[list[dict[str, Any]], list[WindowPlan]]:
        """The window features of every example (`document_index` says whose; labels repeated) and each
        example's `WindowPlan`; examples with tokens in no window (the --max-windows cap, a pair's long
        first text) are counted in `last_truncated` and logged."""
        s = self.settings
        firsts = tokenizer.encode_ids([e.text for e in examples])
        seconds = tokenizer.encode_ids([e.text_pair or "" for e in examples]) \
            if examples and examples[0].text_pair is not None else None
        features: list[dict[str, Any]] = []
        plans = []
        for index, (example, first) in enumerate(zip(examples, firsts)):
            second = seconds[index] if seconds is not None else None
            plan = plan_windows(len(first), None if second is None else len(second), s.max_seq_length, s.doc_stride,
                                s.max_windows)
            plans.append(plan)
            for feature in window_features(first, second, plan, tokenizer.cls_token_id, tokenizer.sep_token_id):
                features.append(self._labelled({**feature, "document_index": index}, example))
        self._report_windows(examples, plans, len(features))
        return features, plans

    def _report_windows(self, examples: Sequence[TextExample], plans: Sequence[WindowPlan], windows: int) -> None:
        capped = sum(p.needed > len(p.spans) for p in plans)
        cut = sum(p.first_cut for p in plans)
        source = examples[0].guid.rsplit(":", 1)[0] if examples else ""
        log.info("%d inputs (from %s) read in %d windows of at most %d tokens", len(examples), source, windows,
                 self.settings.max_seq_length)
        if capped:
            log.warning("%d of %d inputs (from %s) need more than --max-windows %d windows (the longest %d); their "
                        "first %d windows and their last were read", capped, len(examples), source,
                        self.settings.max_windows, max(p.needed for p in plans), self.settings.max_windows - 1)
        if cut:
            log.warning("%d of %d pairs (from %s) have a first text longer than half a window; it was cut",
                        cut, len(examples), source)
        self.last_truncated = sum(p.truncated for p in plans)

    def _report_truncation(self, examples: Sequence[TextExample], encodings: Sequence[Any]) -> int:
        """Count and say the examples truncated; when most are, name the setting that reads them whole (on long
        dictionary entries it was worth several points: docs/finetuning.md, "Documents longer than the model")."""
        truncated = sum(e.truncated for e in encodings)
        if truncated:
            most = 2 * truncated >= len(examples)
            log.warning("%d of %d examples (from %s) are longer than --max-seq-length %d and were truncated "
                        "longest-first%s", truncated, len(examples), examples[0].guid.rsplit(":", 1)[0],
                        self.settings.max_seq_length,
                        "; --long-documents windows reads every token of them (docs/finetuning.md, \"Documents "
                        "longer than the model\")" if most else "")
        self.last_truncated = truncated
        return truncated

    # --- training and evaluation ---------------------------------------------------------------

    def loss(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        logits = model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"]).logits
        if self.is_regression:
            loss = F.mse_loss(logits.squeeze(-1).float(), batch["labels"].float())
        else:
            loss = F.cross_entropy(logits.float(), batch["labels"])
        return loss, {}

    def decode(self, examples: Sequence[TextExample], features: Sequence[dict],
               outputs: dict[str, list[np.ndarray]]) -> list[dict[str, Any]]:
        """One prediction per example: the label (or score) and, for classification, probabilities; the
        logits of an example read in windows are its windows' aggregated (`aggregate_logits`)."""
        logits = aggregate_logits(outputs["logits"], features, len(examples),
                                  self.settings.window_aggregation)  # (N, num_labels)
        labels = self.settings.labels
        if labels is None:  # regression
            return [{"id": e.id or e.guid, "score": float(row[0])} for e, row in zip(examples, logits)]
        shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
        probabilities = shifted / shifted.sum(axis=1, keepdims=True)
        return [{"id": e.id or e.guid, "label": labels[int(row.argmax())],
                 "probabilities": dict(zip(labels, map(float, row)))}
                for e, row in zip(examples, probabilities)]

    def score(self, examples: Sequence[TextExample], predictions: Sequence[dict]) -> dict[str, float]:
        # read(labelled=True) refused or skipped every row without a label.
        gold_labels = cast(list[str], [e.label for e in examples])
        labels = self.settings.labels
        gold: list[float] | list[int]
        if labels is None:  # regression
            gold = [float(label) for label in gold_labels]
            predicted = [p["score"] for p in predictions]
        else:
            gold = [labels.index(label) for label in gold_labels]
            predicted = [labels.index(p["label"]) for p in predictions]
        return classification_metrics(self.metric_names, gold, predicted)

    def write_predictions(self, examples: Sequence[TextExample], predictions: Sequence[dict], directory: Path,
                          prefix: str) -> list[Path]:
        return [write_jsonl(directory / f"{prefix}predictions.jsonl", predictions)]


def labels_for(glue_name: str | None, train_examples: Sequence[TextExample], regression: bool) -> list[str] | None:
    """The task's label list: GLUE's fixed list, None for regression, else the training file's labels sorted."""
    if glue_name:
        glue_labels = glue_task(glue_name).labels
        return list(glue_labels) if glue_labels is not None else None
    if regression:
        return None
    # The training file is read with a label column, so every example has a label; the test narrows the type.
    labels = sorted({e.label for e in train_examples if e.label is not None})
    if len(labels) < 2:
        raise BertkitError(f"the training file has only the label {labels[0]!r}; classification needs at "
                           "least two (use --regression for numeric targets)")
    return labels
