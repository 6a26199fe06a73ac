"""Readers for sentence(-pair) classification data: the nine GLUE TSV layouts and generic CSV/TSV/JSONL.

Design decision: every reader returns `(examples, skipped)`. Rows that cannot be read (too few columns,
an empty text) are skipped and listed in `skipped` as "file:line: reason" so callers count and report
them; an unknown label or an empty split is a `BertkitError`, because training on it would be wrong.
GLUE files are split on tabs with no quote handling, as the original `run_classifier.py` reads them
(GLUE sentences contain unbalanced quotes).

Labels stay strings here; `bertkit.tasks.classification` maps them to ids (or floats for STS-B).

References: GLUE (Wang et al., 2018); the column layouts of the files written by the GLUE
`download_glue_data.py` script; google-research/bert `run_classifier.py`.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

from bertkit.data.textfile import read_text
from bertkit.errors import BertkitError, where


@dataclass(frozen=True)
class TextExample:
    """One classification example; `guid` is "file:line" so errors and predictions point back to it."""

    guid: str
    text: str
    text_pair: str | None
    label: str | None


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


def _read_lines(path: Path) -> list[str]:
    return read_text(path).splitlines()


def read_glue(path: str | Path, task: GlueTask, labelled: bool = True) -> tuple[list[TextExample], list[str]]:
    """Examples of one GLUE TSV file in `task`'s layout (with labels unless `labelled` is False)."""
    path = Path(path)
    examples: list[TextExample] = []
    skipped: list[str] = []
    needed = max(task.text_column, task.pair_column or 0, task.label_column if labelled else 0) + 1
    for number, line in enumerate(_read_lines(path), start=1):
        if (task.has_header and number == 1) or not line.strip():
            continue
        columns = line.split("\t")
        if len(columns) < needed:
            skipped.append(f"{where(path, number)}: {len(columns)} tab-separated columns, "
                           f"the {task.name} layout needs at least {needed}")
            continue
        pair = columns[task.pair_column] if task.pair_column is not None else None
        label = columns[task.label_column].strip() if labelled else None
        examples.append(TextExample(where(path, number), columns[task.text_column], pair, label))
    _check_not_empty(path, examples, skipped)
    if labelled:
        check_labels(examples, task.labels)
    return examples, skipped


def read_table(path: str | Path, text_column: str, text_pair_column: str | None = None,
               label_column: str | None = None) -> tuple[list[TextExample], list[str]]:
    """Examples from a CSV or TSV file with a header row, or a JSONL file, by column name / key."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json"):
        rows = _jsonl_rows(path)
    elif suffix in (".csv", ".tsv"):
        rows = _table_rows(path, "\t" if suffix == ".tsv" else ",")
    else:
        raise BertkitError(f"{path}: unknown format {suffix!r}; use .csv, .tsv (with a header row) or .jsonl")
    examples: list[TextExample] = []
    skipped: list[str] = []
    wanted = [c for c in (text_column, text_pair_column, label_column) if c is not None]
    for number, row in rows:
        missing = [c for c in wanted if row.get(c) is None]
        if missing:
            if not examples and not skipped:  # absent from the first row: a wrong column name
                raise BertkitError(f"{where(path, number)}: no column {missing[0]!r}; columns are "
                                   f"{', '.join(map(repr, row))}; choose with --text-column/--label-column")
            skipped.append(f"{where(path, number)}: missing {', '.join(map(repr, missing))}")
            continue
        pair = str(row[text_pair_column]) if text_pair_column else None
        label = str(row[label_column]).strip() if label_column else None
        examples.append(TextExample(where(path, number), str(row[text_column]), pair, label))
    _check_not_empty(path, examples, skipped)
    return examples, skipped


def _jsonl_rows(path: Path) -> list[tuple[int, dict]]:
    rows = []
    for number, line in enumerate(_read_lines(path), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise BertkitError(f"{where(path, number)}: not valid JSON ({exc.msg}); "
                               "JSONL needs one JSON object per line") from None
        if not isinstance(row, dict):
            raise BertkitError(f"{where(path, number)}: expected a JSON object, got {type(row).__name__}")
        rows.append((number, row))
    return rows


def _table_rows(path: Path, delimiter: str) -> list[tuple[int, dict]]:
    lines = _read_lines(path)
    if not lines:
        raise BertkitError(f"{path}: empty file; a CSV/TSV file needs a header row and data rows")
    reader = csv.reader(lines, delimiter=delimiter)
    header = next(reader)
    rows = []
    for values in reader:
        if any(v.strip() for v in values):
            # Short rows leave the trailing columns missing (None) so they are reported, not padded.
            rows.append((reader.line_num, dict(zip(header, values))))
    return rows


def _check_not_empty(path: Path, examples: list, skipped: list[str]) -> None:
    if not examples:
        reason = f"; all {len(skipped)} rows were skipped, first: {skipped[0]}" if skipped else ""
        raise BertkitError(f"{path}: no examples{reason}")


def check_labels(examples: list[TextExample], labels: tuple[str, ...] | None) -> None:
    """Raise on the first label outside `labels` (or, for regression, not a number)."""
    for example in examples:
        if labels is None:
            try:
                float(example.label)
            except (TypeError, ValueError):
                raise BertkitError(f"{example.guid}: regression label {example.label!r} is not a number") from None
        elif example.label not in labels:
            raise BertkitError(f"{example.guid}: unknown label {example.label!r}; the known labels are "
                               f"{', '.join(map(repr, labels))} (from the task or the training file)")
