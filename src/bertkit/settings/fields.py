"""The mechanics every settings dataclass shares, and the settings several commands share, declared once.

- `Settings`: the base of every settings dataclass. Its checks run when an object is made (and again on
  `dataclasses.replace`): each field's bounds and choices from its metadata (`min`, `max`, `choices`: the
  same metadata the command line turns into click ranges and choices), then the class's own rules
  (`check`). A settings object that exists is valid; no caller has to remember to validate it.
- `TorchThreads`, `DeviceChoice`, `InferencePrecision`: fields several commands take, each with its one
  docstring (its `--help`); a command whose default differs says so in its command line's overrides.
- `sequence_length_field`, `check_positions`: every input length (`max_seq_length`, `max_length`) declared by
  one rule and checked against a model's position table by one function.
- `flag_of`, `field_flag`: the command-line flag of a field, for messages.
- `DEVICES`, `PRECISIONS`, `INFERENCE_PRECISIONS`: the values those flags accept.

Design decision: the mixins are keyword-only dataclasses, so a command's own fields keep their order and
positions; no torch import here or anywhere in bertkit.settings (every `--help` answers at once). A length's
field bounds only what the command itself needs (room for its specials and a token of each text; what its own
file format can hold); the model's max_position_embeddings is the upper bound wherever a model is read, checked
there by `check_positions`, because a settings object is made before any model is.
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


SINGLE_TEXT_TOKENS = 3
"""The shortest input of one text: [CLS] a token [SEP]."""
PAIR_TOKENS = 5
"""The shortest input of a pair: [CLS] a token [SEP] a token [SEP]."""


def sequence_length_field(default: int | None, *, pairs: bool = False, most: int | None = None) -> Any:
    """The field of an input length in tokens, specials included (`max_seq_length`, `max_length`): at least
    PAIR_TOKENS when the command's inputs are pairs, else SINGLE_TEXT_TOKENS; at most `most` only where the
    command's own output format bounds it (pre-training data's uint16 positions). The model's
    max_position_embeddings bounds it where the model is read (`check_positions`)."""
    bounds = {"min": PAIR_TOKENS if pairs else SINGLE_TEXT_TOKENS}
    if most is not None:
        bounds["max"] = most
    return dataclasses.field(default=default, metadata=bounds)


def check_positions(length: int, positions: int, flag: str = "--max-seq-length") -> None:
    """The one check of an input length against a model's position table (config.json's
    max_position_embeddings): a longer input has no position embedding for its last tokens."""
    if length > positions:
        raise BertkitError(f"{flag} {length} exceeds the model's max_position_embeddings ({positions}); "
                           f"use {flag} {positions} or less")


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
