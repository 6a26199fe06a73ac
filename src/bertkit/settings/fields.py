"""The mechanics every settings dataclass shares, and the settings several commands share, declared once.

- `Settings`: the base of every settings dataclass. Its checks run when an object is made (and again on
  `dataclasses.replace`): each field's bounds and choices from its metadata (`min`, `max`, `choices`: the
  same metadata the command line turns into click ranges and choices), then the class's own rules
  (`check`). A settings object that exists is valid; no caller has to remember to validate it.
- `TorchThreads`, `DeviceChoice`, `InferencePrecision`: fields several commands take, each with its one
  docstring (its `--help`); a command whose default differs says so in its command line's overrides.
- `flag_of`, `field_flag`: the command-line flag of a field, for messages.
- `DEVICES`, `PRECISIONS`, `INFERENCE_PRECISIONS`: the values those flags accept.

Design decision: the mixins are keyword-only dataclasses, so a command's own fields keep their order and
positions; no torch import here or anywhere in bertkit.settings (every `--help` answers at once).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertkit.errors import BertkitError

DEVICES = ("auto", "cpu", "cuda")
"""The values of --device: auto is the local CUDA device when there is one, else the CPU."""
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
"""The values of --precision for training (pre-training, fine-tuning)."""
INFERENCE_PRECISIONS = ("auto", "fp32", "bf16", "int8")
"""The values of --precision for inference (predict, evaluate, extract, serve)."""


class Settings:
    """Base of every settings dataclass: `check_fields` (bounds and choices from the fields' metadata), then
    `check` (the class's own rules), whenever an object is made."""

    def __post_init__(self) -> None:
        self.coerce_types()
        check_fields(self)
        self.check()

    def coerce_types(self) -> None:
        """Bring values to their declared types before they are checked (a list from JSON or a caller where a
        tuple is declared); settings classes with such fields override it."""

    def check(self) -> None:
        """Raise BertkitError naming the flag of the first setting that makes no sense (beyond bounds and
        choices); subclasses with rules of their own override it."""


@dataclass(kw_only=True)
class TorchThreads(Settings):
    """The `--threads` of every command that runs a model."""

    threads: int | None = dataclasses.field(default=None, metadata={"min": 1})
    """torch CPU threads; unset: torch's."""


@dataclass(kw_only=True)
class DeviceChoice(Settings):
    """The `--device` of every command that trains or predicts in batches."""

    device: str = dataclasses.field(default="auto", metadata={"choices": DEVICES})
    """auto (CUDA when there is a GPU), cpu or cuda."""


@dataclass(kw_only=True)
class InferencePrecision(Settings):
    """The `--precision` of every command that runs a trained model (extract, predict, evaluate, serve)."""

    precision: str = dataclasses.field(default="fp32", metadata={"choices": INFERENCE_PRECISIONS})
    """fp32: exact (predict and evaluate reproduce fine-tuning's dev scores); auto: the faster of fp32 and bf16 as
    measured on this machine (`bertkit doctor`); bf16: results within bf16 rounding; int8: encoder layers
    quantized, CPU only."""
    calibration: Path | None = dataclasses.field(default=None, metadata={"path": "file", "exists": True})
    """With --precision int8: a text file of sample inputs (one per line; a pair as two tab-separated texts, at
    most 512 read; .gz or .zst too) to measure SmoothQuant's scales and each layer's outlier channels (kept in
    fp32) on; they are kept beside the model (int8_smoothing.safetensors) and used by later int8 runs of it."""

    def check(self) -> None:
        super().check()
        if self.calibration is not None and self.precision != "int8":
            raise BertkitError(f"--calibration applies to --precision int8 (SmoothQuant's scales), not "
                               f"--precision {self.precision}; add --precision int8 or leave --calibration out")


def flag_of(settings: object, name: str) -> str:
    """The command-line flag of the field `name` of the dataclass (or class) `settings`, for messages: its
    `flag` metadata (the first name of an on/off pair), else --name-in-kebab-case."""
    field = next(f for f in dataclasses.fields(settings) if f.name == name)  # type: ignore[arg-type]
    return field_flag(field).split("/")[0]


def field_flag(field: dataclasses.Field) -> str:
    """The flag of a dataclass field: its `flag` metadata, else the field's name in kebab case."""
    return field.metadata.get("flag", "--" + field.name.replace("_", "-"))


def check_fields(settings: Any) -> None:
    """Raise BertkitError naming the flag of the first field of the dataclass `settings` outside its
    `min`/`max` metadata or its `choices` (what the command line enforces too, as a click range or choice)."""
    for field in dataclasses.fields(settings):
        value, choices = getattr(settings, field.name), field.metadata.get("choices")
        flag = field_flag(field).split("/")[0]
        if choices and value is not None:
            values = value if isinstance(value, tuple) else (value,)
            wrong = [v for v in values if v not in choices]
            if wrong:
                raise BertkitError(f"{flag} {wrong[0]!r}: use one of {', '.join(map(str, choices))}")
        low, high = field.metadata.get("min"), field.metadata.get("max")
        if value is None or isinstance(value, tuple) or (
                (low is None or value >= low) and (high is None or value <= high)):
            continue
        bounds = f"in [{low}, {high}]" if low is not None and high is not None else (
            f">= {low}" if low is not None else f"<= {high}")
        raise BertkitError(f"{flag} must be {bounds}, got {value!r}")
