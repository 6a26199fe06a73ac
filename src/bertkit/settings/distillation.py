"""What `bertkit distill <kind>` adds to fine-tuning's settings: the teacher, the student, the losses and their
weights, and the extra text the teacher labels.

Design decision: task distillation is fine-tuning with another objective, so a distillation run is a
`FinetuneSettings` (seeds, budget, precision, resume, torchrun) plus this `DistillSettings`; the task itself (its
labels, columns, length) is the teacher's, read from its bertkit_task.json, since a student is trained for the
teacher's task. The loss weights' defaults are the ones docs/distillation.md measured. No torch import.

References: Hinton et al. 2015 (soft targets at a temperature, the T^2 factor); Sanh et al. 2019, DistilBERT
(a student of every other teacher layer, temperature 2); Jiao et al. 2020, TinyBERT (hidden-state MSE on a uniform
layer map, a learned projection between widths); Tang et al. 2019 (teacher-labelled augmented copies).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from bertkit.errors import BertkitError
from bertkit.settings.fields import Settings

DISTILL_KINDS = ("classification", "tagging", "squad", "multiple-choice")
"""The task kinds `bertkit distill` trains students for (every fine-tuning task kind); `distill embedding` and
`distill pretraining` are commands of their own (another loss, another output)."""

MAX_WEIGHT = 1000.0
"""The largest loss weight accepted (a finite bound: an infinite weight makes every step non-finite)."""
UNLABELED_KINDS = ("classification", "tagging")
"""Kinds whose inputs a line of plain text can be: the ones --unlabeled and --augment extend."""


@dataclass(kw_only=True)
class DistillSettings(Settings):
    """The teacher, the student and the distillation objective of `bertkit distill <kind>`."""

    teacher: Path = dataclasses.field(metadata={"path": "dir"})
    """The teacher: a fine-tuned directory (`bertkit finetune`'s OUTPUT/best, or a Hugging Face task model with
    bertkit_task.json); its task (labels, columns, length) is the student's."""
    student: str | None = None
    """The student: `layers:0,2,...` (these teacher layers, width kept), a preset (random initialisation, e.g.
    bert-mini), or a pre-trained checkpoint directory; unset: every other teacher layer (DistilBERT's rule)."""
    temperature: float = dataclasses.field(default=2.0, metadata={"min": 0.05, "max": 100.0})
    """Softmax temperature of the soft targets (the loss is scaled by its square)."""
    soft_weight: float = dataclasses.field(default=1.0, metadata={"min": 0.0, "max": MAX_WEIGHT})
    """Weight of the soft-target loss (KL divergence to the teacher's distribution; MSE for regression)."""
    hard_weight: float = dataclasses.field(default=1.0, metadata={"min": 0.0, "max": MAX_WEIGHT})
    """Weight of the task's own loss on the gold labels (examples without labels add none)."""
    hidden_weight: float = dataclasses.field(default=0.0, metadata={"min": 0.0, "max": MAX_WEIGHT})
    """Weight of the hidden-state MSE on a uniform layer map (a learned projection when widths differ); above 0 the
    teacher runs beside the student at every step."""
    attention_weight: float = dataclasses.field(default=0.0, metadata={"min": 0.0, "max": MAX_WEIGHT})
    """Weight of the attention-distribution KL on the same layer map (TinyBERT, MiniLM; the student needs the
    teacher's number of heads); above 0 the teacher runs beside the student at every step."""
    unlabeled: Path | None = None
    """Unlabelled inputs the teacher labels (classification, tagging): a .txt file of one text per line ('a ||| b'
    for a pair teacher; blank lines skipped), or a file in the training file's format (JSONL, CSV, TSV, Parquet, a
    `datasets` directory, CoNLL for tagging) read by the teacher's columns without labels; unset: none."""
    max_unlabeled: int | None = dataclasses.field(default=None, metadata={"min": 1})
    """Read at most this many --unlabeled inputs (the first ones); unset: all."""
    augment: int = dataclasses.field(default=0, metadata={"min": 0, "max": 64})
    """Augmented copies of each training text that the teacher labels (word masking and n-gram sampling, Tang et
    al. 2019; classification, tagging)."""
    compare_without_teacher: bool = False
    """Also fine-tune the same student on the labels alone (same seeds, OUTPUT/without-teacher) and report the
    difference with Welch's p."""

    def check(self) -> None:
        if not any((self.soft_weight, self.hard_weight, self.hidden_weight, self.attention_weight)):
            raise BertkitError("every loss weight (--soft-weight, --hard-weight, ...) is 0: nothing to train on; give "
                               "one a positive weight")


def student_layers(spec: str, teacher_layers: int) -> tuple[int, ...]:
    """The teacher layers a `layers:i,j,...` student keeps (0-based, increasing, each below `teacher_layers`)."""
    body = spec.split(":", 1)[1]
    try:
        layers = tuple(int(part) for part in body.split(",") if part.strip())
    except ValueError:
        raise BertkitError(f"--student {spec}: expected layers:i,j,... with 0-based teacher layer numbers, e.g. "
                           "layers:0,2,4") from None
    if not layers or list(layers) != sorted(set(layers)) or layers[0] < 0 or layers[-1] >= teacher_layers:
        raise BertkitError(f"--student {spec}: give increasing, distinct teacher layers between 0 and "
                           f"{teacher_layers - 1} (the teacher has {teacher_layers})")
    return layers


def every_other_layer(teacher_layers: int) -> tuple[int, ...]:
    """DistilBERT's student: teacher layers 0, 2, 4, ... (half the depth, rounded up)."""
    return tuple(range(0, teacher_layers, 2))
