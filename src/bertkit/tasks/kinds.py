"""The fine-tuning task kinds by name, and the task of a `bertkit finetune` command.

`TASK_CLASSES` maps the `task` value of bertkit_task.json (and the `bertkit finetune` subcommand) to its
class; `build_task(kind, train_path, task_settings)` makes the task from the command's task settings, taking the
label sets that the task does not fix from the training file.

Design decision: the only place that lists the task classes; generic code reaches a task through the
`bertkit.tasks.task.Task` protocol and never imports a task module itself.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from bertkit.data.glue import glue_task, read_table
from bertkit.errors import BertkitError
from bertkit.tasks.classification import ClassificationSettings, ClassificationTask, labels_for
from bertkit.tasks.multiple_choice import MultipleChoiceSettings, MultipleChoiceTask
from bertkit.tasks.squad import SquadSettings, SquadTask
from bertkit.tasks.tagging import TaggingSettings, TaggingTask, labels_from, read_tagged
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
    options = dict(task_settings)
    if kind == "classification":
        regression = options.pop("regression", False)
        glue = glue_task(options["glue_task"]) if options.get("glue_task") else None
        if glue is not None and glue.pair_column is not None and not options.get("text_pair_column"):
            options["text_pair_column"] = "text_pair"  # JSONL inputs of a GLUE pair task (predict/evaluate)
        train = [] if options.get("glue_task") else read_table(
            train_path, options["text_column"], options.get("text_pair_column"), options["label_column"],
            header=options.get("header", True))[0]
        labels = labels_for(options.get("glue_task"), train, regression)
        return ClassificationTask(ClassificationSettings(labels=labels, **options))
    if kind == "tagging":
        defaults = TaggingSettings(labels=[], **options)
        sentences, _ = read_tagged(train_path, defaults.tag_scheme, defaults.tokens_column, defaults.tags_column)
        return TaggingTask(dataclasses.replace(defaults, labels=labels_from(sentences)))
    if kind == "squad":
        return SquadTask(SquadSettings(**options))
    if kind == "multiple-choice":
        return MultipleChoiceTask(MultipleChoiceSettings(**options))
    raise BertkitError(f"unknown task {kind!r}; choose one of {', '.join(TASK_CLASSES)}")
