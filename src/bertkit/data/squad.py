"""SQuAD v1.1 / v2.0 reader: the SQuAD JSON, and the Hugging Face `squad` / `squad_v2` table layout.

Format: `{"version": ..., "data": [{"title", "paragraphs": [{"context", "qas": [{"id", "question",
"answers": [{"text", "answer_start"}], "is_impossible"}]}]}]}`; `is_impossible` (v2.0 only) marks a
question with no answer in its paragraph. The table layout (JSONL, also .gz/.zst; Parquet; a `datasets`
save_to_disk directory) has one question per row: `id`, `question`, `context` (`title` is not read) and
`answers`, `{"text": [...], "answer_start": [...]}` (in Arrow a struct of two lists); empty lists are an
unanswerable question, as `datasets`' squad_v2 has them. Both become the same `SquadExample`s, so
training and the scores of a table are those of its JSON.

Design decision: structural problems (not JSON, nesting too deep to parse, a missing key, a duplicate
id, a context or question longer than the tokenizer takes) raise `BertkitError` naming the JSON path or
question id. A training answer whose text is not found at its `answer_start` is skipped and reported as
"id: reason" (training needs exact character spans; the original `run_squad.py` skips these too);
evaluation only compares answer texts, so it keeps every question. A table row is checked as a JSON
question is: a missing or null value, or answers of another shape, is an error naming the row.

Reference: Rajpurkar et al. (2016, 2018); google-research/bert `run_squad.py` (`read_squad_examples`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertkit.errors import BertkitError, where
from bertkit.io.columnar import check_columns, is_table_input, read_rows
from bertkit.io.textfile import check_length, format_suffix, parse_json, read_json_rows, read_text


@dataclass(frozen=True)
class SquadExample:
    """One question; `answers` are (text, character start) pairs, empty for unanswerable questions."""

    qid: str
    question: str
    context: str
    answers: tuple[tuple[str, int], ...]
    is_impossible: bool


def read_squad(path: str | Path, training: bool, version_2_with_negative: bool, labelled: bool = True,
               ) -> tuple[list[SquadExample], list[str]]:
    """Questions of a SQuAD JSON file or table and the skipped ones ("id: reason"); see the module
    docstring. A table read without `labelled` (`bertkit predict`) needs no answers column."""
    path = Path(path)
    questions = _table_questions(path, labelled or training) if is_squad_table(path) else _json_questions(path)
    examples: list[SquadExample] = []
    skipped: list[str] = []
    seen: set[str] = set()
    for example in questions:
        if example.qid in seen:
            raise BertkitError(f"{path}: question id {example.qid!r} appears twice; ids must be unique")
        seen.add(example.qid)
        reason = _training_problem(example, version_2_with_negative) if training else None
        if reason:
            skipped.append(f"{path}: id {example.qid!r}: {reason}")
        else:
            examples.append(example)
    if not examples:
        detail = f"; all {len(skipped)} questions were skipped, first: {skipped[0]}" if skipped else ""
        raise BertkitError(f"{path}: no questions{detail}")
    return examples, skipped


def is_squad_table(path: Path) -> bool:
    """A .jsonl file, Parquet file or `datasets` directory (the table layout); a .json file is SQuAD JSON."""
    return is_table_input(path) or format_suffix(path) == ".jsonl"


def _json_questions(path: Path) -> Iterator[SquadExample]:
    for a, article in enumerate(_load(path)):
        for p, paragraph in enumerate(_field(path, article, "paragraphs", f"data[{a}]", list)):
            at = f"data[{a}].paragraphs[{p}]"
            context = check_length(_field(path, paragraph, "context", at, str), f"{path}: {at}", "context")
            for q, qa in enumerate(_field(path, paragraph, "qas", at, list)):
                yield _example(path, qa, context, f"{at}.qas[{q}]")


def _load(path: Path) -> list:
    expected = ("a SQuAD file is a JSON object with a 'data' list (JSON lines in the `datasets` squad layout: "
                "name the file .jsonl)")
    document = parse_json(read_text(path), str(path), expected)
    if not isinstance(document, dict):
        raise BertkitError(f"{path}: {expected}")
    return _field(path, document, "data", "top level", list)


def _field(path: Path, obj: object, key: str, at: str, kind: type | tuple[type, ...]) -> Any:
    if not isinstance(obj, dict) or not isinstance(obj.get(key), kind):
        name = " or ".join(k.__name__ for k in kind) if isinstance(kind, tuple) else kind.__name__
        raise BertkitError(f"{path}: {at} needs a {name} field {key!r}")
    return obj[key]


def _example(path: Path, qa: object, context: str, at: str) -> SquadExample:
    qid = str(_field(path, qa, "id", at, (str, int)))
    question = check_length(_field(path, qa, "question", f"{at} (id {qid!r})", str), f"{path}: id {qid!r}", "question")
    assert isinstance(qa, dict)  # _field checked it
    answers = []
    for i, answer in enumerate(qa.get("answers") or []):
        text = _field(path, answer, "text", f"{at}.answers[{i}] (id {qid!r})", str)
        start = _field(path, answer, "answer_start", f"{at}.answers[{i}] (id {qid!r})", int)
        answers.append((text, start))
    return SquadExample(qid, question, context, tuple(answers), bool(qa.get("is_impossible", False)))


def _training_problem(example: SquadExample, version_2_with_negative: bool) -> str | None:
    """Why a question cannot be a training example, or None. Training uses the first answer."""
    if example.is_impossible:
        return None if version_2_with_negative else \
            "unanswerable question in a v1.1 run; pass --version-2-with-negative for SQuAD 2.0"
    if not example.answers:
        return "no answers and not marked is_impossible"
    text, start = example.answers[0]
    found = example.context[start:start + len(text)]
    if found != text:
        return f"answer {text!r} does not match the context at character {start} (found {found!r})"
    if not text.strip():
        return "empty answer text"
    return None


TABLE_COLUMNS = ("id", "question", "context")
"""The columns every row of a table in the `datasets` squad layout needs; `answers` too when labelled."""


def _table_questions(path: Path, labelled: bool) -> Iterator[SquadExample]:
    columns = (*TABLE_COLUMNS, *(["answers"] if labelled else []))
    wanted = dict.fromkeys(columns, "the `datasets` squad layout")
    if is_table_input(path):
        rows = read_rows(path, wanted, text_columns=("question", "context"))
    else:
        rows = read_json_rows(path)
        if rows:
            check_columns(path, list(rows[0][1]), wanted)
    for number, row in rows:
        yield _table_example(where(path, number), row, labelled)


def _table_example(location: str, row: dict[str, Any], labelled: bool) -> SquadExample:
    null = next((c for c in (*TABLE_COLUMNS, *(["answers"] if labelled else [])) if row.get(c) is None), None)
    if null is not None:
        raise BertkitError(f"{location}: no {null!r} value; every question of the `datasets` squad layout needs "
                           "id, question, context and (to train or evaluate) answers")
    qid = row["id"]
    if not isinstance(qid, (str, int)) or isinstance(qid, bool) or not all(
            isinstance(row[c], str) for c in ("question", "context")):
        raise BertkitError(f"{location}: 'id' must be a string or integer, 'question' and 'context' strings")
    answers = _table_answers(location, row["answers"]) if labelled else ()
    return SquadExample(str(qid), check_length(row["question"], f"{location}: id {qid!r}", "question"),
                        check_length(row["context"], location, "context"), answers, labelled and not answers)


def _table_answers(location: str, value: Any) -> tuple[tuple[str, int], ...]:
    """{"text": [...], "answer_start": [...]} (`datasets`' squad; a list of {"text", "answer_start"} objects,
    the SQuAD JSON's, is read too) as (text, start) pairs; empty: unanswerable."""
    if isinstance(value, dict) and isinstance(value.get("text"), list) and isinstance(value.get("answer_start"), list) \
            and len(value["text"]) == len(value["answer_start"]):
        pairs = list(zip(value["text"], value["answer_start"]))
    elif isinstance(value, list) and all(isinstance(a, dict) for a in value):
        pairs = [(a.get("text"), a.get("answer_start")) for a in value]
    else:
        pairs = [(None, None)]
    if not all(isinstance(text, str) and isinstance(start, int) and not isinstance(start, bool)
               for text, start in pairs):
        raise BertkitError(f"{location}: 'answers' must be {{\"text\": [strings], \"answer_start\": [integers]}}, "
                           f"two lists of the same length (empty for no answer), as in `datasets`' squad; got "
                           f"{str(value)[:120]}")
    return tuple(pairs)
