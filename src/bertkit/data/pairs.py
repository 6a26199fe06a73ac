"""Readers for sentence-embedding training data: (anchor, positive[, negative]) text pairs and triplets from
CSV, TSV, JSONL (or a JSON array of objects), Parquet and `datasets` directories, by column.

    read_pairs(path, anchor_column, positive_column, negative_column=None, header=True) -> (pairs, skipped)

Design decision: the same file rules as classification's generic tables (`bertkit.data.glue.read_table`,
built from the same pieces of `bertkit.io.textfile` and `bertkit.io.columnar`): `.tsv` split on tabs with no
quote processing, `.csv` with standard quoting, a header row naming the columns unless `header` is False
(columns by number then, 0 the first, -1 the last). A row that cannot be read (another number of fields than
the header, a missing JSON key, a null in a table) is skipped and listed as "file:line: reason" for the caller
to count and report; an absent column, an empty or blank text and a file with no pairs are a `BertkitError`
naming the file, the line and the flag, because training on them would be wrong.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertkit.data.glue import json_kind
from bertkit.errors import BertkitError, where
from bertkit.io.columnar import column_names, is_table_input, read_rows
from bertkit.io.textfile import check_length, format_suffix, read_json_rows, read_records

FLAGS = ("--anchor-column", "--positive-column", "--negative-column")
"""The flags that choose the three columns, in the order `read_pairs` takes them."""


@dataclass(frozen=True)
class PairExample:
    """An anchor, the text that matches it and optionally a hard negative; `guid` is "file:line"."""

    guid: str
    anchor: str
    positive: str
    negative: str | None = None


def read_pairs(path: str | Path, anchor_column: str, positive_column: str, negative_column: str | None = None,
               header: bool = True) -> tuple[list[PairExample], list[str]]:
    """The pairs (triplets with `negative_column`) of a file, and "file:line: reason" for each row skipped."""
    path = Path(path)
    columns = dict(zip(FLAGS, (anchor_column, positive_column, negative_column)))
    wanted = {flag: column for flag, column in columns.items() if column is not None}
    suffix = format_suffix(path)
    if not header and (is_table_input(path) or suffix not in (".csv", ".tsv")):
        raise BertkitError(f"{path}: --no-header applies to CSV/TSV files; tables and JSON name their columns")
    if is_table_input(path):
        names = column_names(path)
        _check_columns(path, None, names, wanted)
        rows = read_rows(path, {c: f for f, c in wanted.items()}, tuple(wanted.values()))
        return _pairs(path, rows, wanted, [])
    if suffix in (".jsonl", ".json"):
        rows = read_json_rows(path)
        if rows:
            _check_columns(path, rows[0][0], list(rows[0][1]), wanted)  # the first object's keys
        return _pairs(path, rows, wanted, [])
    if suffix in (".csv", ".tsv"):
        return _delimited(path, wanted, header)
    raise BertkitError(f"{path}: unknown format {suffix!r}; use .csv, .tsv, .jsonl, .json (an array of objects), "
                       ".parquet or a `datasets` directory")


def _check_columns(path: Path, line: int | None, names: list[str], wanted: dict[str, str]) -> None:
    absent = next((flag for flag, column in wanted.items() if column not in names), None)
    if absent is not None:
        raise BertkitError(f"{where(path, line)}: no column {wanted[absent]!r} ({absent}); the columns are "
                           f"{', '.join(map(repr, names))}; choose them with {', '.join(FLAGS)}")
    twice = next((column for column in wanted.values() if names.count(column) > 1), None)
    if twice is not None:  # names.index would read the first of them, silently
        raise BertkitError(f"{where(path, line)}: the header names column {twice!r} {names.count(twice)} times; "
                           "rename the others so the column read is the one you mean")


def _delimited(path: Path, wanted: dict[str, str], header: bool) -> tuple[list[PairExample], list[str]]:
    """A CSV/TSV file: with a header row, columns by name; without, by number. A record with another number
    of fields than the header (or the first record) is skipped: a stray tab or comma shifts its columns."""
    records = read_records(path)
    if not records:
        raise BertkitError(f"{path}: empty file")
    width = len(records[0][1])
    if header:
        (line, names), *records = records
        if not any(column in names for column in wanted.values()):  # no column named at all: likely no header row
            raise BertkitError(f"{where(path, line)}: no header row with {' or '.join(map(repr, wanted.values()))} "
                               f"({', '.join(FLAGS)}); a file without a header takes --no-header and column "
                               "numbers (--anchor-column 0 --positive-column 1)")
        _check_columns(path, line, names, wanted)
        index = {flag: names.index(column) for flag, column in wanted.items()}
    else:
        index = {flag: _column_number(path, records[0][0], flag, column, width) for flag, column in wanted.items()}
    kind = "tab" if format_suffix(path) == ".tsv" else "comma"
    rows, skipped = [], []
    for number, values in records:
        if len(values) != width:
            skipped.append(f"{where(path, number)}: {len(values)} {kind}-separated fields, "
                           f"{'the header' if header else 'the first record'} has {width}")
            continue
        rows.append((number, {wanted[flag]: values[i] for flag, i in index.items()}))
    return _pairs(path, rows, wanted, skipped)


def _column_number(path: Path, line: int, flag: str, column: str, width: int) -> int:
    try:
        number = int(column)
    except ValueError:
        raise BertkitError(f"{path}: --no-header reads columns by number (0 is the first, -1 the last); {flag} "
                           f"{column!r} is a name: give e.g. --anchor-column 0 --positive-column 1") from None
    if not -width <= number < width:
        raise BertkitError(f"{where(path, line)}: {flag} {number} is not a column of a record with {width} fields "
                           f"(0..{width - 1}, or -1 for the last)")
    return number


def _pairs(path: Path, rows: list[tuple[int, dict[str, Any]]], wanted: dict[str, str],
           skipped: list[str]) -> tuple[list[PairExample], list[str]]:
    """Examples of rows holding every wanted column; a row without one (a missing key, a null) is skipped."""
    examples = []
    for number, row in rows:
        missing = [column for column in wanted.values() if row.get(column) is None]
        if missing:
            skipped.append(f"{where(path, number)}: missing {', '.join(map(repr, missing))}")
            continue
        texts = {flag: _text(row[column], path, number, flag) for flag, column in wanted.items()}
        examples.append(PairExample(where(path, number), texts["--anchor-column"], texts["--positive-column"],
                                    texts.get("--negative-column")))
    if not examples:
        reason = f"; all {len(skipped)} rows were skipped, first: {skipped[0]}" if skipped else ""
        raise BertkitError(f"{path}: no pairs{reason}")
    return examples, skipped


def _text(value: Any, path: Path, number: int, flag: str) -> str:
    what = flag.removeprefix("--").removesuffix("-column")
    if not isinstance(value, str):  # a JSON row's list, object, number or boolean: str() would read Python's text
        raise BertkitError(f"{where(path, number)}: the {what} text ({flag}) is {json_kind(value)}; write a string")
    text = value
    if not text.strip():
        raise BertkitError(f"{where(path, number)}: empty {what} text ({flag}); every row needs one, so fill it in "
                           "or delete the row")
    return check_length(text, where(path, number), f"{what} text")
