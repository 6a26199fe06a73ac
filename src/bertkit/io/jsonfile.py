"""JSON files bertkit reads back: its own records (manifests, run settings, recipes, task files) and the JSON
other tools write beside a model (config.json, sentence-transformers' module files).

    read_json(path, missing=..., damaged=..., fix=...) -> the value
    read_json_object(path, ...) -> a dict (a JSON object), the common case

Design decision: one reader, so every JSON file fails the same way: a missing file and an unreadable or
invalid one are either a default the caller chose (a record that may be absent or is rebuilt when damaged) or
a BertkitError that names the file, says what is wrong and, with `fix`, what to do. No `json.loads(
path.read_text())` elsewhere, where a UnicodeDecodeError or a list where a dict was expected would surface as
a traceback.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from bertkit.errors import BertkitError
from bertkit.io.bounded import file_present, read_bounded

MAX_JSON_BYTES = 64 << 20
"""Largest JSON file read: a multilingual tokenizer.json is tens of MB (XLM-R's 17); parsed JSON takes up to some
25 times its bytes, so this keeps a file that passes within a few GB."""


class _Raise:
    """The default of `missing` / `damaged`: raise a BertkitError naming the file."""

    def __repr__(self) -> str:
        return "RAISE"


RAISE: Any = _Raise()


def read_json(path: str | Path, *, missing: Any = RAISE, damaged: Any = RAISE, fix: str = "") -> Any:
    """The JSON value in `path`. A missing file gives `missing`, an unreadable or invalid one `damaged`; either
    left at RAISE is a BertkitError naming the file (and `fix`, a sentence saying what to do)."""
    path = Path(path)
    try:
        if not file_present(path):  # before open: a FIFO would wait forever
            return _fail(missing, f"{path}: not found", fix)
    except BertkitError as exc:  # a device, a FIFO, a directory: not the file
        return _fail(damaged, str(exc), fix)
    try:
        text = read_bounded(path, MAX_JSON_BYTES, "a JSON file", decompress=False).decode("utf-8")
    except FileNotFoundError:
        return _fail(missing, f"{path}: not found", fix)
    except (OSError, UnicodeDecodeError) as exc:
        return _fail(damaged, f"{path}: unreadable ({exc})", fix)
    except BertkitError as exc:  # larger than any JSON file bertkit reads
        return _fail(damaged, str(exc), fix)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        return _fail(damaged, f"{path}: not valid JSON ({exc})", fix)
    except RecursionError:
        return _fail(damaged, f"{path}: not valid JSON (nested deeper than Python's parser goes)", fix)


def read_json_object(path: str | Path, *, missing: Any = RAISE, damaged: Any = RAISE, fix: str = "") -> Any:
    """`read_json` of a file that must hold a JSON object (a dict); anything else counts as damaged."""
    value = read_json(path, missing=missing, damaged=damaged, fix=fix)
    if isinstance(value, dict) or value is missing or value is damaged:
        return value
    return _fail(damaged, f"{path}: not a JSON object (found {type(value).__name__})", fix)


def finite_number(value: Any, minimum: float | None = None) -> bool:
    """Whether a value read from a kept record is a finite JSON number (not a bool), at least `minimum` if given:
    what a record's seconds, rates and scores must be before they are summed or planned with."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            and (minimum is None or value >= minimum))


def _fail(default: Any, message: str, fix: str) -> Any:
    if default is RAISE:
        raise BertkitError(f"{message}; {fix}" if fix else message)
    return default
