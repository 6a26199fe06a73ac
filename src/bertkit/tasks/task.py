"""What every fine-tuning task shares: its settings dataclass, saved to and read from bertkit_task.json.

Design decision: a task is a plain class holding one settings dataclass (`settings_class`); the
fine-tuning driver (`tasks/finetune.py`) calls the methods each task defines (`read`, `features`,
`loss`, `decode`, `score`, `write_predictions`) and this base supplies only what is identical for all of
them, so a task module reads as its own data, loss and metric code. Settings round-trip through JSON
by field name; an unknown or missing field in a saved file is the user's error, reported with the file.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from bertkit.atomic import write_text_atomic
from bertkit.errors import BertkitError

T = TypeVar("T", bound="Task")


class Task:
    """Base of ClassificationTask, TaggingTask, SquadTask and MultipleChoiceTask."""

    kind: ClassVar[str]
    """The `task` value in bertkit_task.json and the `bertkit finetune` subcommand."""
    settings_class: ClassVar[type]
    output_names: ClassVar[tuple[str, ...]] = ("logits",)
    """Model outputs the driver collects for decoding."""
    token_level_outputs: ClassVar[tuple[str, ...]] = ()
    """Outputs with one value per token (cut back to each input's real length)."""

    def __init__(self, settings: Any) -> None:
        self.settings = settings

    def config_overrides(self) -> dict[str, Any]:
        """BertConfig fields the task's head needs (num_labels, id2label, ...)."""
        return {}

    def to_json(self) -> dict[str, Any]:
        return {"task": self.kind, **dataclasses.asdict(self.settings)}

    @classmethod
    def from_json(cls: type[T], data: dict[str, Any], source: str = "bertkit_task.json") -> T:
        fields = {k: v for k, v in data.items() if k != "task"}
        try:
            return cls(cls.settings_class(**fields))
        except TypeError as exc:  # an unknown or missing field
            known = ", ".join(f.name for f in dataclasses.fields(cls.settings_class))
            raise BertkitError(f"{source}: invalid {cls.kind} settings ({exc}); the fields are {known} - "
                               "was the directory written by another bertkit version?") from None


def write_jsonl(path: Path, records: Iterable[dict[str, Any]]) -> Path:
    """One JSON object per line (the predictions file of classification and multiple choice)."""
    write_text_atomic(path, "".join(json.dumps(r) + "\n" for r in records))
    return path
