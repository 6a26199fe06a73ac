"""The fine-tuning task kinds by name, and the task of a `bertkit finetune` command.

`TASK_CLASSES` maps the `task` value of bertkit_task.json (and the `bertkit finetune` subcommand) to its
class; `build_task(kind, train_path, task_settings)` makes the task from the command's task settings
(`Task.from_training_file`); `kind_of_architecture(name)` is the kind whose head a config.json's
`architectures` names.

Design decision: the one table of the task classes. A kind is one class (`bertkit.tasks.task`) that carries
its head, outputs, column flags and readers, so every other list of kinds (the predictors', the ONNX export's
heads, the owners of a column flag) is derived from this table, and generic code reaches a task through the
`Task` protocol without importing a task module. A new kind is its module and one entry here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bertkit.errors import BertkitError
from bertkit.tasks.classification import ClassificationTask
from bertkit.tasks.multiple_choice import MultipleChoiceTask
from bertkit.tasks.squad import SquadTask
from bertkit.tasks.tagging import TaggingTask
from bertkit.tasks.task import Task

TASK_CLASSES: dict[str, type[Task]] = {
    cls.kind: cls for cls in (ClassificationTask, TaggingTask, SquadTask, MultipleChoiceTask)}


def task_class(kind: str, source: str = "--task") -> type[Task]:
    if kind not in TASK_CLASSES:
        raise BertkitError(f"{source}: unknown task {kind!r}; expected one of {', '.join(TASK_CLASSES)}")
    return TASK_CLASSES[kind]


def build_task(kind: str, train_path: str | Path, task_settings: dict[str, Any]) -> Task:
    """The task object for `kind` with its settings; label sets not fixed by the task come from the
    training file (classification without --task, tagging)."""
    return task_class(kind).from_training_file(train_path, dict(task_settings))


def kind_of_architecture(architecture: str) -> str | None:
    """The first kind (in table order) whose head is the class `architecture` names, e.g. "tagging" for
    BertForTokenClassification; None for a class no kind trains (BertModel, the pre-training heads)."""
    return next((cls.kind for cls in TASK_CLASSES.values() if cls.model_class.__name__ == architecture), None)
