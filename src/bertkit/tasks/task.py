"""The `Task` protocol, every method and attribute that the fine-tuning driver, the evaluator, the predictors,
the ONNX export and the CLI use on a fine-tuning task, and `BaseTask`, what the four tasks share.

A task turns files into examples (`read`), examples into model inputs (`features`), a batch into a loss
(`loss`), model outputs back into predictions per example (`decode`), and predictions into metrics and
files (`score`, `write_predictions`). Its settings dataclass round-trips through bertkit_task.json
(`to_json`/`from_json`) by field name; an unknown or missing field in a saved file is the user's error,
reported with the file.

Design decision: a task kind is one class. Everything that differs between kinds is an attribute or method
here: the head (`model_class`), the outputs and input axes (`output_names`, `token_level_outputs`,
`input_axes`: what predict, serve and the ONNX export read), the column flags it takes (`column_settings`), how
`bertkit finetune` makes it from a training file (`from_training_file`) and how a head model fine-tuned elsewhere
is read (`from_config`). Generic code (workflows/finetune.py, workflows/predict.py, serve/predictor.py,
export/onnx.py) is typed against this protocol and never asks which task it holds; `bertkit.tasks.kinds` is the
one table of the classes. Settings that one task chooses on the dev set (SQuAD v2.0's null-score threshold) go
through `select_on_dev`, which the other tasks leave as it is. A task module then reads as its own data, loss
and metric code.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, ClassVar, Protocol, TypeVar, cast, runtime_checkable

import numpy as np
import torch

from bertkit.config import BertConfig
from bertkit.errors import BertkitError
from bertkit.io.atomic import write_text_atomic
from bertkit.model.feature_based import FeatureHead
from bertkit.settings import TaskSettings
from bertkit.tokenizer import WordPieceTokenizer

log = logging.getLogger(__name__)

T = TypeVar("T", bound="BaseTask")


@runtime_checkable
class Task(Protocol):
    """A fine-tuning task (classification, tagging, squad, multiple-choice)."""

    kind: ClassVar[str]
    """The `task` value in bertkit_task.json and the `bertkit finetune` subcommand."""
    model_class: ClassVar[type[Any]]
    """The task model (`BertFor...`): `model_class(config)` or `model_class.from_pretrained(directory)`."""
    output_names: ClassVar[tuple[str, ...]]
    """Model outputs that `decode` reads, and the outputs of the kind's ONNX graph."""
    token_level_outputs: ClassVar[tuple[str, ...]]
    """Outputs with one value per token (cut back to each input's real length; a sequence axis in ONNX)."""
    input_axes: ClassVar[tuple[str, ...]]
    """The axes of the model's inputs, as the ONNX export names them: ("batch", "sequence"), or with a
    "choices" axis between them for inputs grouped per example (multiple choice)."""
    column_settings: ClassVar[tuple[str, ...]]
    """The reading settings of `bertkit predict/evaluate` (and serve's long-document ones) this kind takes
    (`with_columns`); another kind's are refused naming the kind that takes them."""
    settings: Any
    """The settings dataclass saved in bertkit_task.json."""
    last_truncated: int
    """Examples that the last `features` call truncated to max_seq_length (0 for tasks that window)."""

    @property
    def metric_names(self) -> tuple[str, ...]:
        """Metrics `score` returns; the first selects the best evaluation."""

    def read(self, path: str | Path, labelled: bool = True, training: bool = False) -> tuple[list[Any], list[str]]:
        """(examples, descriptions of the records skipped) of a file."""

    def features(self, examples: Sequence[Any], tokenizer: WordPieceTokenizer,
                 training: bool = False) -> list[dict[str, Any]]:
        """Model inputs (see `bertkit.inference.batching`); with `training`, the loss's targets too."""

    def loss(self, model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        """(loss, extra metrics) of a padded batch."""

    def training_loss(self) -> Any:
        """What the training loop trains with: `loss` (a mean per example, weighted by examples), or a
        `bertkit.train.loop.Objective` for a loss over tokens (normalised by the global batch's tokens)."""

    def decode(self, examples: Sequence[Any], features: Sequence[dict[str, Any]],
               outputs: dict[str, list[np.ndarray]]) -> Any:
        """Predictions per example from the model's `output_names` per feature."""

    def select_on_dev(self, examples: Sequence[Any], decoded: Any) -> Any:
        """Adopt the settings chosen on the (first) dev set and return the predictions decided with them."""

    def score(self, examples: Sequence[Any], decoded: Any) -> dict[str, float]:
        """Metrics of the predictions against the examples' gold labels."""

    def write_predictions(self, examples: Sequence[Any], decoded: Any, directory: Path, prefix: str) -> list[Path]:
        """Write the predictions into `directory` (file names start with `prefix`); the paths written."""

    def config_overrides(self) -> dict[str, Any]:
        """BertConfig fields the task's head needs (num_labels, id2label, ...)."""

    def feature_head(self) -> FeatureHead:
        """The linear layer of the feature-based approach (`bertkit.model.feature_based`) for this task."""

    def with_columns(self, **columns: Any) -> Task:
        """This task reading files by the given column settings (`PredictSettings.columns`: the `bertkit
        predict/evaluate` flags); a setting the task does not read is refused (`refuse_columns`)."""

    def to_json(self) -> dict[str, Any]:
        """bertkit_task.json's content: {"task": kind, **settings}."""

    @classmethod
    def from_json(cls, data: dict[str, Any], source: str = "bertkit_task.json") -> Task:
        """The task of a bertkit_task.json's content."""

    @classmethod
    def from_training_file(cls, train_path: str | Path, options: dict[str, Any]) -> Task:
        """The task `bertkit finetune` trains: its settings from the command's task settings (`options`, keyword
        values of `settings_class`, plus any the kind's command adds), what they leave open (label sets) read
        from the training file."""

    @classmethod
    def from_config(cls, config: BertConfig, max_seq_length: int | None = None, source: str = "config.json") -> Task:
        """The task of a `model_class` directory fine-tuned elsewhere (no bertkit_task.json), from its config.json;
        `max_seq_length` is a length its own files give (a CrossEncoder's), else the kind's default."""


class BaseTask:
    """What ClassificationTask, TaggingTask, SquadTask and MultipleChoiceTask share (each is a `Task`)."""

    kind: ClassVar[str]
    model_class: ClassVar[type[Any]]
    settings_class: ClassVar[type[TaskSettings]]
    """The settings dataclass, read back by `from_json`."""
    output_names: ClassVar[tuple[str, ...]] = ("logits",)
    token_level_outputs: ClassVar[tuple[str, ...]] = ()
    input_axes: ClassVar[tuple[str, ...]] = ("batch", "sequence")
    column_settings: ClassVar[tuple[str, ...]] = ()
    last_truncated: int = 0

    def __init__(self, settings: Any) -> None:
        self.settings = settings

    def config_overrides(self) -> dict[str, Any]:
        return {}

    def feature_head(self) -> FeatureHead:
        return FeatureHead(self.config_overrides()["num_labels"])  # one score per label at [CLS]

    def with_columns(self, **columns: Any) -> Task:
        """A kind that reads no file by column (no `column_settings`) refuses the flags."""
        refuse_columns(self.kind, columns)
        return cast(Task, self)  # nothing was given; every subclass is a Task

    def training_loss(self) -> Any:
        return self.loss  # type: ignore[attr-defined]  # each task defines loss

    def select_on_dev(self, examples: Sequence[Any], decoded: Any) -> Any:
        return decoded

    def to_json(self) -> dict[str, Any]:
        return {"task": self.kind, **dataclasses.asdict(self.settings)}

    @classmethod
    def from_json(cls: type[T], data: dict[str, Any], source: str = "bertkit_task.json") -> T:
        fields = {k: v for k, v in data.items() if k != "task"}
        try:
            return cls(cls.settings_class(**fields))
        except TypeError as exc:  # an unknown or missing field
            known = ", ".join(f.name for f in dataclasses.fields(cast(Any, cls.settings_class)))
            raise BertkitError(f"{source}: invalid {cls.kind} settings ({exc}); the fields are {known} - "
                               "was the directory written by another bertkit version?") from None

    @classmethod
    def from_training_file(cls: type[T], train_path: str | Path, options: dict[str, Any]) -> T:
        return cls(cls.settings_class(**options))  # a kind whose settings the training file does not complete

    @classmethod
    def from_config(cls: type[T], config: BertConfig, max_seq_length: int | None = None,
                    source: str = "config.json") -> T:
        """The kind's defaults (config.json holds none of its settings), their length cut to the model's
        positions (a model made elsewhere with 64 of them read 128- or 384-token windows past its table)."""
        return cls.from_json(cls.settings_class.fitted_to(config.max_position_embeddings), source=source)


def refuse_columns(kind: str, columns: dict[str, Any]) -> None:
    """Raise naming the first of the given column settings (None: not given), e.g. `--text-column` for a
    tagging model, and the task kind that takes it (its `column_settings`)."""
    from bertkit.tasks.kinds import TASK_CLASSES  # the registry imports the task modules, which import this one

    for name, value in columns.items():
        if value is None:
            continue
        owners = [cls.kind for cls in TASK_CLASSES.values() if name in cls.column_settings]
        flag = "--" + ("no_header" if name == "header" and value is False else name).replace("_", "-")
        raise BertkitError(f"{flag} applies to {' and '.join(owners) or 'no'} models; this is a {kind} model")


def write_jsonl(path: Path, records: Iterable[dict[str, Any]]) -> Path:
    """One JSON object per line (the predictions file of classification, multiple choice and tagging tables)."""
    write_text_atomic(path, "".join(json.dumps(r) + "\n" for r in records))
    return path


def warn_skipped(path: str | Path, examples: Sequence[Any], skipped: Sequence[str]) -> None:
    """Log how many records of a file `read` skipped, and the first ones."""
    if skipped:
        log.warning("%s: skipped %d of %d records; first ones:\n  %s", path, len(skipped),
                    len(skipped) + len(examples), "\n  ".join(skipped[:5]))


def warn_empty_texts(path: str | Path, examples: Sequence[Any]) -> None:
    """Log the classification examples whose text (or pair text) is empty or blank: kept, as transformers keeps
    them (the model reads [CLS] [SEP]), but said, since a blank field is more often a mistake than an input."""
    def blank(text: Any) -> bool:
        return isinstance(text, str) and not text.strip()
    empty = [e.guid for e in examples if blank(getattr(e, "text", None)) or blank(getattr(e, "text_pair", None))]
    if empty:
        log.warning("%s: %d of %d examples have an empty text (kept; the model reads [CLS] [SEP] for it); first "
                    "ones: %s", path, len(empty), len(examples), ", ".join(empty[:5]))
