"""SQuAD v1.1 / v2.0 JSON reader.

Format: `{"version": ..., "data": [{"title", "paragraphs": [{"context", "qas": [{"id", "question",
"answers": [{"text", "answer_start"}], "is_impossible"}]}]}]}`; `is_impossible` (v2.0 only) marks a
question with no answer in its paragraph.

Design decision: structural problems (not JSON, nesting too deep to parse, a missing key, a duplicate
id, a context or question longer than the tokenizer takes) raise `BertkitError` naming the JSON path or
question id. A training answer whose text is not found at its `answer_start` is skipped and reported as
"id: reason" (training needs exact character spans; the original `run_squad.py` skips these too);
evaluation only compares answer texts, so it keeps every question.

Reference: Rajpurkar et al. (2016, 2018); google-research/bert `run_squad.py` (`read_squad_examples`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertkit.data.textfile import check_length, parse_json, read_text
from bertkit.errors import BertkitError


@dataclass(frozen=True)
class SquadExample:
    """One question; `answers` are (text, character start) pairs, empty for unanswerable questions."""

    qid: str
    question: str
    context: str
    answers: tuple[tuple[str, int], ...]
    is_impossible: bool


def read_squad(path: str | Path, training: bool, version_2_with_negative: bool,
               ) -> tuple[list[SquadExample], list[str]]:
    """Questions of a SQuAD file and the skipped ones ("id: reason"); see the module docstring."""
    path = Path(path)
    data = _load(path)
    examples: list[SquadExample] = []
    skipped: list[str] = []
    seen: set[str] = set()
    for a, article in enumerate(data):
        for p, paragraph in enumerate(_field(path, article, "paragraphs", f"data[{a}]", list)):
            at = f"data[{a}].paragraphs[{p}]"
            context = check_length(_field(path, paragraph, "context", at, str), f"{path}: {at}", "context")
            for q, qa in enumerate(_field(path, paragraph, "qas", at, list)):
                example = _example(path, qa, context, f"{at}.qas[{q}]")
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


def _load(path: Path) -> list:
    document = parse_json(read_text(path), str(path), "a SQuAD file is a JSON object with a 'data' list")
    if not isinstance(document, dict):
        raise BertkitError(f"{path}: a SQuAD file is a JSON object with a 'data' list")
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
