"""Readers for sentence(-pair) classification data: the nine GLUE TSV layouts and generic tables: CSV, TSV,
JSONL, Parquet and `datasets` directories (`bertkit.io.columnar`).

Design decision: every reader returns `(examples, skipped)`. Rows that cannot be read (a wrong number
of fields, a missing key) are skipped and listed in `skipped` as "file:line: reason" so callers count
and report them; an empty label, a text longer than the tokenizer takes or an empty split is a
`BertkitError`, because training on it would be wrong. `.tsv` files (GLUE's and generic ones) are split
on tabs with no quote processing, as the original `run_classifier.py` reads them (`csv.QUOTE_NONE`;
GLUE sentences contain unbalanced quotes); `.csv` files use standard CSV quoting (see
`bertkit.io.textfile.read_records`).

Labels stay strings here; `check_labels` sorts them into known and unknown ones, and
`bertkit.tasks.classification` maps them to ids (or floats for STS-B).

References: GLUE (Wang et al., 2018); the column layouts of the files written by the GLUE
`download_glue_data.py` script; google-research/bert `run_classifier.py`.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path

from bertkit.errors import BertkitError, where
from bertkit.io.columnar import column_names, is_table_input, read_rows
from bertkit.io.textfile import check_length, format_suffix, read_json_rows, read_records, read_text, text_lines

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TextExample:
    """One classification example; `guid` is "file:line" so errors and predictions point back to it."""

    guid: str
    text: str
    text_pair: str | None
    label: str | None
    id: str | None = None
    """The row's own id (the id column), written into predictions instead of `guid` when present."""


@dataclass(frozen=True)
class GlueTask:
    """Where a GLUE task's TSV keeps its fields (0-based columns; -1 is the last) and its label names."""

    name: str
    text_column: int
    pair_column: int | None
    label_column: int
    has_header: bool
    labels: tuple[str, ...] | None
    """Label names in output-index order; None for regression (STS-B)."""

    @property
    def is_regression(self) -> bool:
        return self.labels is None


GLUE_TASKS: dict[str, GlueTask] = {task.name: task for task in (
    # CoLA train/dev: source, label, original label, sentence; no header.
    GlueTask("cola", 3, None, 1, False, ("0", "1")),
    GlueTask("sst2", 0, None, 1, True, ("0", "1")),
    # MRPC: Quality, #1 ID, #2 ID, #1 String, #2 String.
    GlueTask("mrpc", 3, 4, 0, True, ("0", "1")),
    # STS-B: index, genre, filename, year, old_index, source1, source2, sentence1, sentence2, score.
    GlueTask("stsb", 7, 8, 9, True, None),
    GlueTask("qqp", 3, 4, 5, True, ("0", "1")),
    # MNLI: sentence1/2 in columns 8/9; gold_label is the last column (train: 12 columns, dev: 16).
    GlueTask("mnli", 8, 9, -1, True, ("contradiction", "entailment", "neutral")),
    GlueTask("qnli", 1, 2, -1, True, ("entailment", "not_entailment")),
    GlueTask("rte", 1, 2, -1, True, ("entailment", "not_entailment")),
    GlueTask("wnli", 1, 2, -1, True, ("0", "1")),
)}


def glue_task(name: str) -> GlueTask:
    key = name.lower().replace("-", "")
    if key not in GLUE_TASKS:
        raise BertkitError(f"--task {name!r} is not a GLUE task; choose one of {', '.join(GLUE_TASKS)} "
                           "or leave --task out and use --text-column/--label-column")
    return GLUE_TASKS[key]


def read_glue(path: str | Path, task: GlueTask, labelled: bool = True) -> tuple[list[TextExample], list[str]]:
    """Examples of one GLUE TSV file in `task`'s layout (with labels unless `labelled` is False)."""
    path = Path(path)
    examples: list[TextExample] = []
    skipped: list[str] = []
    needed = max(task.text_column, task.pair_column or 0, task.label_column if labelled else 0) + 1
    for number, line in enumerate(text_lines(read_text(path)), start=1):
        if (task.has_header and number == 1) or not line.strip():
            continue
        columns = line.split("\t")
        if len(columns) < needed:
            skipped.append(f"{where(path, number)}: {len(columns)} tab-separated columns, "
                           f"the {task.name} layout needs at least {needed}")
            continue
        pair = columns[task.pair_column] if task.pair_column is not None else None
        label = _label(columns[task.label_column], path, number, f"column {task.label_column}") if labelled else None
        examples.append(_example(path, number, columns[task.text_column], pair, label))
    _check_not_empty(path, examples, skipped)
    return examples, skipped


def read_table(path: str | Path, text_column: str, text_pair_column: str | None = None,
               label_column: str | None = None, id_column: str | None = None, header: bool = True,
               label_names: bool = True) -> tuple[list[TextExample], list[str]]:
    """Examples from a CSV or TSV file with a header row, a JSONL file (or a JSON array of objects), or a
    table (Parquet, a `datasets` directory; its rows numbered from 1), by column name / key. `header`
    False: a CSV/TSV file whose first row is data, its columns given by number (0 the first, -1 the last).

    `id_column` names the column holding each row's id; None takes a column called "id" when there is one.
    `label_names` False reads a `datasets` ClassLabel column as its numbers, not its names.
    """
    path = Path(path)
    suffix = format_suffix(path)
    if is_table_input(path):
        if not header:
            raise BertkitError(f"{path}: --no-header applies to CSV/TSV files; a table names its columns")
        columns, rows, skipped = (1, column_names(path)), _columnar_rows(path, text_column, text_pair_column,
                                                                           label_column, id_column, label_names), []
    elif suffix in (".jsonl", ".json"):
        if not header:
            raise BertkitError(f"{path}: --no-header applies to CSV/TSV files; JSON objects name their keys")
        rows, skipped = read_json_rows(path), list[str]()
        columns = (rows[0][0], list(rows[0][1])) if rows else (1, [])  # the first object's keys
    elif suffix in (".csv", ".tsv") and not header:
        return _headerless_table(path, text_column, text_pair_column, label_column, id_column)
    elif suffix in (".csv", ".tsv"):
        columns, rows, skipped = _table_rows(path)
    else:
        raise BertkitError(f"{path}: unknown format {suffix!r}; use .csv, .tsv (a header row, or --no-header), "
                           ".jsonl, .json (an array of objects), .parquet or a `datasets` directory")
    header_line, names = columns
    wanted = [c for c in (text_column, text_pair_column, label_column, id_column) if c is not None]
    absent = [c for c in wanted if c not in names]
    if names and absent:  # a wrong column name, not a broken row
        raise BertkitError(f"{where(path, header_line)}: no column {absent[0]!r}; columns are "
                           f"{', '.join(map(repr, names))}; choose with --text-column/--text-pair-column/"
                           f"--label-column/--id-column{_no_header_hint(suffix, names, wanted)}")
    twice = next((c for c in wanted if names.count(c) > 1), None)
    if twice is not None:  # dict(zip(...)) would keep the last of them, silently
        raise BertkitError(f"{where(path, header_line)}: the header names column {twice!r} {names.count(twice)} "
                           "times; rename the others so the column read is the one you mean")
    ids = id_column or ("id" if "id" in names else None)
    examples: list[TextExample] = []
    cell = _json_cell if suffix in (".jsonl", ".json") else _any_cell
    for number, row in rows:
        missing = [c for c in wanted if row.get(c) is None]
        if missing:
            skipped.append(f"{where(path, number)}: missing {', '.join(map(repr, missing))}")
            continue
        text = cell(row, text_column, path, number, (str,), "a string")
        pair = cell(row, text_pair_column, path, number, (str,), "a string") if text_pair_column else None
        label = (_label(cell(row, label_column, path, number, (str, int, float, bool), "a string or a number"),
                        path, number, repr(label_column)) if label_column else None)
        identifier = (cell(row, ids, path, number, (str, int, float, bool), "a string or a number")
                      if ids and row.get(ids) not in (None, "") else None)
        examples.append(_example(path, number, text, pair, label, identifier))
    _check_not_empty(path, examples, skipped)
    return examples, skipped


def _columnar_rows(path: Path, text_column: str, text_pair_column: str | None, label_column: str | None,
                   id_column: str | None, label_names: bool) -> list[tuple[int, dict]]:
    """The rows of a Parquet file or `datasets` directory; its text columns must hold strings, a null
    value is a missing one (the row is skipped, as a JSONL object without the key)."""
    ids = id_column or ("id" if "id" in column_names(path) else None)
    flags = (("--text-column", text_column), ("--text-pair-column", text_pair_column),
             ("--label-column", label_column), ("--id-column", ids))
    wanted = {column: flag for flag, column in reversed(flags) if column is not None}
    texts = tuple(c for c in (text_column, text_pair_column) if c is not None)
    return read_rows(path, wanted, texts, use_class_names=label_names)


def _no_header_hint(suffix: str, names: list[str], wanted: list[str]) -> str:
    """For a CSV/TSV file whose header lacks a column: how to read a file without a header row, said
    loudly when the first row looks like data (a number, a sentence) or the columns were given by number."""
    if suffix not in (".csv", ".tsv"):
        return ""
    by_number = all(_column_number(c) is not None for c in wanted)
    data_like = by_number or any(_number(n) or len(n.split()) >= 3 for n in names)
    if not data_like:
        return "; a file without a header row needs --no-header and the columns by number (0 is the first)"
    text = max(range(len(names)), key=lambda i: len(names[i].split()))  # the example: the longest field is the text
    label = min((i for i in range(len(names)) if i != text), key=lambda i: len(names[i]), default=text + 1)
    return (f"; the first row ({', '.join(repr(n[:40]) for n in names[:4])}) looks like data, not a header: for a "
            f"file without a header row pass --no-header and give the columns by number, e.g. --text-column {text} "
            f"--label-column {label}")


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _column_number(column: str) -> int | None:
    try:
        return int(column)
    except ValueError:
        return None


def _headerless_table(path: Path, text_column: str, text_pair_column: str | None, label_column: str | None,
                      id_column: str | None) -> tuple[list[TextExample], list[str]]:
    """`read_table` of a CSV/TSV file without a header row: every record is data, columns by number. A
    record with another number of fields than the first is skipped and named (a stray tab or comma would
    shift its columns), as a header row's count rules the records of a file that has one."""
    given = {"--text-column": text_column, "--text-pair-column": text_pair_column, "--label-column": label_column,
             "--id-column": id_column}
    numbers: dict[str, int] = {}
    for flag, column in given.items():
        if column is None:
            continue
        number = _column_number(column)
        if number is None:
            raise BertkitError(f"{path}: --no-header reads columns by number (0 is the first, -1 the last); "
                               f"{flag} {column!r} is a name: give e.g. --text-column 0 --label-column 1")
        numbers[flag] = number
    records = read_records(path)
    if not records:
        raise BertkitError(f"{path}: empty file")
    width = len(records[0][1])
    out_of_range = next((f for f, n in numbers.items() if not -width <= n < width), None)
    if out_of_range is not None:
        raise BertkitError(f"{where(path, records[0][0])}: {out_of_range} {numbers[out_of_range]} is not a column of "
                           f"a record with {width} fields (0..{width - 1}, or -1 for the last)")
    kind = "tab" if format_suffix(path) == ".tsv" else "comma"
    examples: list[TextExample] = []
    skipped: list[str] = []
    for number, values in records:
        if len(values) != width:
            skipped.append(f"{where(path, number)}: {len(values)} {kind}-separated fields, the first record has "
                           f"{width}")
            continue
        field = {flag: values[index] for flag, index in numbers.items()}
        pair = field.get("--text-pair-column")
        label = _label(field["--label-column"], path, number, f"column {numbers['--label-column']}") \
            if "--label-column" in field else None
        identifier = field.get("--id-column") or None
        examples.append(_example(path, number, field["--text-column"], pair, label, identifier))
    _check_not_empty(path, examples, skipped)
    return examples, skipped


def _example(path: Path, number: int, text: str, pair: str | None, label: str | None,
             identifier: str | None = None) -> TextExample:
    location = where(path, number)
    check_length(text, location)
    if pair is not None:
        check_length(pair, location, "second text of the pair")
    return TextExample(location, text, pair, label, identifier)


def _json_cell(row: dict, column: str, path: Path, number: int, kinds: tuple[type, ...], expected: str) -> str:
    """`row[column]` of a JSON row as text, if it is of `kinds` (a boolean counts as neither a string nor a
    number unless `kinds` has bool): a list, an object, or a number that is not finite (1e400) is an error naming the
    line, where str() would have read Python's text of it ("['a', 'b']", "True", "inf")."""
    value = row[column]
    finite = not isinstance(value, float) or math.isfinite(value)
    if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds) or not finite:
        kind = "a number too large to read" if not finite else json_kind(value)
        raise BertkitError(f"{where(path, number)}: {column!r} is {kind}; write {expected}")
    return str(value)


def json_kind(value: object) -> str:
    """What a JSON value is, for a message: "a list", "an object", "a boolean (true/false)", "a number"."""
    return {list: "a list", dict: "an object", bool: "a boolean (true/false)", int: "a number",
            float: "a number"}.get(type(value), type(value).__name__)


def _any_cell(row: dict, column: str, path: Path, number: int, kinds: tuple[type, ...], expected: str) -> str:
    """`row[column]` of a CSV/TSV row (a string) or a table's (its text columns strings, read_rows checks)."""
    return str(row[column])


def _label(value: str, path: Path, number: int, column: str) -> str:
    label = value.strip()
    if not label:
        raise BertkitError(f"{where(path, number)}: empty label (the {column} field); every row of a training or "
                           "evaluation file needs one (use `bertkit predict` for unlabelled rows)")
    return label


def _table_rows(path: Path) -> tuple[tuple[int, list[str]], list[tuple[int, dict]], list[str]]:
    """(header line, columns), the rows after it as (line, {column: value}), and the skipped rows (those
    with another number of fields than the header: a stray tab or comma would shift every column)."""
    records = read_records(path)
    if not records:
        raise BertkitError(f"{path}: empty file; a CSV/TSV file needs a header row and data rows")
    (header_line, columns), *body = records
    kind = "tab" if format_suffix(path) == ".tsv" else "comma"
    rows, skipped = [], []
    for number, values in body:
        if len(values) == len(columns):
            rows.append((number, dict(zip(columns, values))))
        else:
            skipped.append(f"{where(path, number)}: {len(values)} {kind}-separated fields, the header has "
                           f"{len(columns)}")
    return (header_line, columns), rows, skipped


def _check_not_empty(path: Path, examples: list[TextExample], skipped: list[str]) -> None:
    """No examples is an error; examples with an empty text (or pair) are kept, counted and said once: each is
    read as [CLS] [SEP] alone (the server refuses an empty text; a file's row still gets its prediction)."""
    if not examples:
        reason = f"; all {len(skipped)} rows were skipped, first: {skipped[0]}" if skipped else ""
        raise BertkitError(f"{path}: no examples{reason}")
    empty = [e.guid for e in examples if not e.text.strip() or (e.text_pair is not None and not e.text_pair.strip())]
    if empty:
        log.warning("%s: %d of %d rows have an empty text (first: %s); each is read as [CLS] [SEP] alone, so its "
                    "prediction says nothing about it: fill them in or drop them", path, len(empty), len(examples),
                    empty[0])


def check_labels(examples: list[TextExample], labels: tuple[str, ...] | None,
                 ) -> tuple[list[TextExample], list[str]]:
    """The examples whose label is one of `labels`, and "file:line: reason" for each other one.

    Regression (`labels` None): every label must be a finite number, else `BertkitError`.
    """
    if labels is None:
        for example in examples:
            try:
                value = math.nan if example.label is None else float(example.label)
            except ValueError:
                value = math.nan
            if not math.isfinite(value):
                raise BertkitError(f"{example.guid}: regression label {example.label!r} is not a finite number")
        return list(examples), []
    known = [e for e in examples if e.label in labels]
    unknown = [f"{e.guid}: unknown label {e.label!r}; the known labels are {', '.join(map(repr, labels))} "
               "(from the task or the training file)" for e in examples if e.label not in labels]
    return known, unknown
