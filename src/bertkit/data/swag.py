"""Multiple-choice data: the SWAG CSV layout and a JSONL layout for any number of choices.

SWAG CSV columns (header row): `video-id, fold-ind, startphrase, sent1, sent2, gold-source, ending0
... ending3, label`; the test split has no `label`. The context is `sent1`; each choice is `sent2`
(the start of the second sentence) followed by an ending. JSONL: one object per line with `context`,
optional `question` (prefix of every ending), `endings` (a list) and optional integer `label`. Parquet
files and `datasets` directories in either layout (columns named as the CSV's header or the JSONL's keys).

Design decision: both layouts become the same `ChoiceExample(context, start, endings, label)` so the
task code sees one shape; every example in a file must have the same number of choices. A row that
cannot be read is an error naming its line (a multiple-choice file has no optional rows); the CSV is
read with standard quoting, strictly (`bertkit.io.textfile.read_records`).

Reference: Zellers et al. (2018), SWAG; Devlin et al. (2018), section 4.4.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bertkit.errors import BertkitError, where
from bertkit.io.columnar import column_names, is_table_input, read_rows
from bertkit.io.textfile import check_length, format_suffix, parse_json, read_records, read_text, text_lines


@dataclass(frozen=True)
class ChoiceExample:
    guid: str
    """"file:line", for errors and predictions."""
    context: str
    start: str
    """Text every ending continues (SWAG's sent2), '' when none."""
    endings: tuple[str, ...]
    label: int | None

    def second_segment(self, ending: str) -> str:
        """The text paired with the context for one choice: `start` followed by the ending."""
        return f"{self.start} {ending}" if self.start else ending


def read_choices(path: str | Path, labelled: bool = True) -> list[ChoiceExample]:
    """Examples of a SWAG .csv or a .jsonl file, or a table in either layout (see the module docstring)."""
    path = Path(path)
    if is_table_input(path):
        examples = _table(path, labelled)
    elif format_suffix(path) == ".csv":
        examples = _swag_csv(path, labelled)
    elif format_suffix(path) in (".jsonl", ".json"):
        examples = _jsonl(path, labelled)
    else:
        raise BertkitError(f"{path}: unknown format {path.suffix!r}; use SWAG .csv, .jsonl, .parquet or a "
                           "`datasets` directory")
    if not examples:
        raise BertkitError(f"{path}: no examples")
    counts = {len(e.endings) for e in examples}
    if len(counts) > 1:
        odd = next(e for e in examples if len(e.endings) != len(examples[0].endings))
        raise BertkitError(f"{odd.guid}: {len(odd.endings)} choices, but the first example has "
                           f"{len(examples[0].endings)}; every example needs the same number")
    return examples


def _label(value: object, choices: int, location: str) -> int:
    try:
        label = int(str(value).strip())
    except ValueError:
        raise BertkitError(f"{location}: label {value!r} is not a choice index") from None
    if not 0 <= label < choices:
        raise BertkitError(f"{location}: label {label} is outside 0..{choices - 1}")
    return label


def _example(location: str, context: str, start: str, endings: tuple[str, ...], label: int | None) -> ChoiceExample:
    example = ChoiceExample(location, check_length(context, location, "context"), start, endings, label)
    for ending in endings:
        check_length(example.second_segment(ending), location, "start and ending")
    return example


def _swag_csv(path: Path, labelled: bool) -> list[ChoiceExample]:
    records = read_records(path)
    header = records[0][1] if records else []
    endings = sorted((c for c in header if c.startswith("ending")), key=lambda c: int(c[6:] or 0))
    required = ["sent1", "sent2", *(["label"] if labelled else [])]
    missing = [c for c in required if c not in header]
    if missing or not endings:
        raise BertkitError(f"{path}: SWAG CSV header lacks {', '.join(missing) or 'ending0..'}; "
                           f"found {', '.join(header)}")
    examples = []
    for number, values in records[1:]:
        location = where(path, number)
        if len(values) != len(header):
            raise BertkitError(f"{location}: {len(values)} fields, the header has {len(header)}; quote a field "
                               "that holds a comma")
        row = dict(zip(header, values))
        label = _label(row["label"], len(endings), location) if labelled else None
        examples.append(_example(location, row["sent1"], row["sent2"], tuple(row[c] for c in endings), label))
    return examples


def _jsonl(path: Path, labelled: bool) -> list[ChoiceExample]:
    examples = []
    for number, line in enumerate(text_lines(read_text(path)), start=1):
        if not line.strip():
            continue
        location = where(path, number)
        row = parse_json(line, location, "JSONL needs one JSON object per line")
        if not isinstance(row, dict) or not isinstance(row.get("context"), str) \
                or not isinstance(row.get("endings"), list) or len(row["endings"]) < 2:
            raise BertkitError(f"{location}: expected an object with 'context' (string) and 'endings' "
                               "(a list of at least two strings)")
        if labelled and "label" not in row:
            raise BertkitError(f"{location}: no 'label' (the index of the right ending)")
        label = _label(row["label"], len(row["endings"]), location) if labelled else None
        examples.append(_example(location, row["context"], str(row.get("question", "")),
                                 tuple(str(e) for e in row["endings"]), label))
    return examples


def _table(path: Path, labelled: bool) -> list[ChoiceExample]:
    """A Parquet file or `datasets` directory in the JSONL layout (context, endings as a list, optional
    question) or SWAG's (sent1, sent2, ending0..; as the `datasets` swag dataset has it); a row that
    cannot be read is an error naming it, as in the other layouts."""
    names = column_names(path)
    endings = sorted((c for c in names if c.startswith("ending") and c[6:].isdigit()), key=lambda c: int(c[6:]))
    if "endings" in names:
        wanted = ["context", "endings", *(["question"] if "question" in names else [])]
    elif "sent1" in names and endings:
        wanted = ["sent1", "sent2", *endings]
    else:
        raise BertkitError(f"{path}: a multiple-choice table needs 'context' and 'endings' (a list) columns, or "
                           f"SWAG's sent1, sent2, ending0, ending1, ...; the columns are {', '.join(map(repr, names))}")
    wanted += ["label"] if labelled else []
    texts = tuple(c for c in wanted if c not in ("endings", "label"))
    rows = read_rows(path, dict.fromkeys(wanted, "a multiple-choice column"), texts, use_class_names=False)
    return [_table_example(path, number, row, endings, labelled) for number, row in rows]


def _table_example(path: Path, number: int, row: dict, endings: list[str], labelled: bool) -> ChoiceExample:
    location = where(path, number)
    null = next((column for column, value in row.items() if value is None), None)
    if null is not None:
        raise BertkitError(f"{location}: column {null!r} is null (row {number}, the first is 1); every row of a "
                           "multiple-choice file needs all its fields")
    if "endings" in row:
        choices = row["endings"]
        if not isinstance(choices, list) or len(choices) < 2 or not all(isinstance(c, str) for c in choices):
            raise BertkitError(f"{location}: column 'endings' must hold a list of at least two strings")
        context, start = row["context"], row.get("question") or ""
    else:
        choices, context, start = [row[c] for c in endings], row["sent1"], row["sent2"]
    label = _label(row["label"], len(choices), location) if labelled else None
    return _example(location, context, start, tuple(choices), label)
