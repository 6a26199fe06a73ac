"""Unlabelled inputs of `bertkit extract` and `bertkit export onnx --sample`: one text per line, a pair written
`text_a ||| text_b` (Google's extract_features.py format), or a table (Parquet, a `datasets` directory) with one
input per row from its text (and pair) column.

Design decision: every input gets an output line, so nothing is skipped: a malformed line or a null row is an
error naming it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

from bertkit.errors import BertkitError, where
from bertkit.io.columnar import is_table_input, read_rows
from bertkit.io.textfile import check_length, stream_lines


def read_lines(path: str | Path, flag: str = "--input", text_column: str = "text",
               text_pair_column: str | None = None, limit: int | None = None) -> list[tuple[str, str | None]]:
    """(text_a, text_b or None) per line, the first `limit` lines (None: all); text_b after ' ||| ' as in the
    original. Errors name `flag`. A table (Parquet, a `datasets` directory) gives one input per row from its text
    (and pair) column."""
    path = Path(path)
    if is_table_input(path):
        return _table_inputs(path, text_column, text_pair_column)[:limit]
    inputs = [(a, b) for _, a, b in itertools.islice(iter_lines(path, flag), limit)]
    if not inputs:
        raise BertkitError(f"{flag} {path}: the file is empty; write one text per line")
    return inputs


def iter_lines(path: str | Path, flag: str = "--input") -> Iterator[tuple[int, str, str | None]]:
    """(line number, text_a, text_b or None) of each line of a text file, read as they are asked for (a caller
    that stops after N reads about N lines of the file)."""
    path = Path(path)
    for number, line in enumerate(stream_lines(path, flag=flag), start=1):
        a, sep, b = line.partition("|||")
        if sep and "|||" in b:
            raise BertkitError(f"{where(path, number)}: more than one '|||'; write 'text_a ||| text_b'")
        text, pair = (a.strip(), b.strip()) if sep else (line.strip(), None)
        check_length(text, where(path, number))
        if pair is not None:
            check_length(pair, where(path, number), "second text")
        yield number, text, pair


def _table_inputs(path: Path, text_column: str, text_pair_column: str | None) -> list[tuple[str, str | None]]:
    """(text, pair or None) of every row; a null text is an error naming its row (each row has an output)."""
    wanted = {text_column: "--text-column", **({text_pair_column: "--text-pair-column"} if text_pair_column else {})}
    inputs: list[tuple[str, str | None]] = []
    for number, row in read_rows(path, wanted, tuple(wanted)):
        null = next((column for column, value in row.items() if value is None), None)
        if null is not None:
            raise BertkitError(f"{where(path, number)}: column {null!r} ({wanted[null]}) is null in row {number} (the "
                               "first is 1); every row gets a feature line, so give it a text or drop the row")
        inputs.append((row[text_column], row[text_pair_column] if text_pair_column else None))
    if not inputs:
        raise BertkitError(f"--input {path}: no rows")
    return inputs
