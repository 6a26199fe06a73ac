"""CoNLL-2003 style tagging files: read sentences of (word, label) and write predictions back.

Format: one token per line, whitespace-separated columns, the word first and the label last; a blank
line ends a sentence; `-DOCSTART-` lines mark documents and carry no tokens. Unlabelled files (for
`bertkit predict`) have the word alone or any columns without a label when `labelled=False`.

Design decision: each sentence keeps its original lines, so predictions are written back as the input
line plus one column with the predicted tag — the layout conlleval reads (`word ... gold predicted`) —
and document markers are kept in place. Tags are checked against the tagging scheme as they are read
(`O` or `B-TYPE`/`I-TYPE`, plus `E-`/`S-` for BIOES), so a file in another format (JSON, a POS column
last) fails at its own first line instead of turning its text into labels. The same sentences as table
rows (JSONL, Parquet, `datasets` directories) are read by `bertkit.data.tag_tables`.

Reference: Tjong Kim Sang & De Meulder (2003), the CoNLL-2003 shared task data format.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bertkit.errors import BertkitError, where
from bertkit.io.textfile import check_length, read_text, text_lines

DOCSTART = "-DOCSTART-"
SCHEME_PREFIXES = {"BIO": "BI", "IOB1": "BI", "BIOES": "BIES"}
"""Chunk prefixes of each tagging scheme; a tag is "O" or PREFIX-TYPE."""


@dataclass
class TaggedSentence:
    """Words of one sentence, their labels (None when unlabelled), and where it came from."""

    words: list[str]
    labels: list[str] | None
    location: str
    """"file:line" of the sentence's first token."""
    lines: list[str] = field(default_factory=list)
    """The original token lines, written back with the prediction appended."""
    preceding: list[str] = field(default_factory=list)
    """The lines between the previous sentence and this one (blank, whitespace-only and -DOCSTART- lines), as
    read, written back in place."""
    following: list[str] = field(default_factory=list)
    """The last sentence's: the lines after it to the end of the file, as read."""
    id: str | None = None
    """A table row's id (`bertkit.data.tag_tables`: its "id" column, else "file:row"), where its predictions
    go as JSONL; None for a CoNLL sentence, whose predictions are written back into its lines."""


def read_conll(path: str | Path, labelled: bool = True, scheme: str | None = None) -> list[TaggedSentence]:
    """Sentences of a CoNLL file; a token line without a label column is an error when `labelled`, and
    so is a label that is not a tag of `scheme` (BIO, IOB1, BIOES) when one is given."""
    path = Path(path)
    sentences: list[TaggedSentence] = []
    current: TaggedSentence | None = None
    between: list[str] = []  # the lines since the last token line: no line is lost from predictions.conll
    for number, line in enumerate(text_lines(read_text(path)), start=1):
        columns = line.split()
        if not columns or columns[0] == DOCSTART:
            if current is not None:
                sentences.append(current)
                current = None
            between.append(line)
            continue
        if labelled:
            _check_token_line(path, number, line, columns, scheme)
        if current is None:
            current = TaggedSentence([], [] if labelled else None, where(path, number), [], between)
            between = []
        current.words.append(check_length(columns[0], where(path, number), "word"))
        current.lines.append(line)
        if current.labels is not None:  # a list exactly when labelled
            current.labels.append(columns[-1])
    if current is not None:
        sentences.append(current)
    if sentences:
        sentences[-1].following = between
    else:
        raise BertkitError(f"{path}: no sentences; expected one 'word ... label' line per token and a "
                           "blank line between sentences")
    return sentences


def _as_written(line: str) -> str:
    """A line between sentences as predictions.conll has it: -DOCSTART- with the "O" conlleval reads, else blank."""
    return f"{line} O" if line.split()[:1] == [DOCSTART] else ""


def _check_token_line(path: Path, number: int, line: str, columns: list[str], scheme: str | None) -> None:
    if len(columns) < 2:
        raise BertkitError(f"{where(path, number)}: token line {line[:80]!r} has no label column; a CoNLL "
                           "training/evaluation file needs 'word ... label' on every token line")
    tag = columns[-1]
    if scheme is not None and not is_scheme_tag(tag, scheme):
        raise BertkitError(f"{where(path, number)}: label {tag[:80]!r} is not a {scheme} tag "
                           f"({scheme_tags(scheme)}); is this a CoNLL file with the tag last on every token "
                           "line? (--tag-scheme is BIO, IOB1 or BIOES)")


def is_scheme_tag(tag: str, scheme: str) -> bool:
    """Whether `tag` is "O" or PREFIX-TYPE with a chunk prefix of `scheme` (BIO, IOB1, BIOES)."""
    return tag == "O" or (len(tag) > 2 and tag[1] == "-" and tag[0] in SCHEME_PREFIXES[scheme])


def scheme_tags(scheme: str) -> str:
    """The tags of `scheme` for messages: "O, B-TYPE, I-TYPE"."""
    return ", ".join(["O", *(f"{prefix}-TYPE" for prefix in SCHEME_PREFIXES[scheme])])


def check_tags(sentences: Sequence[TaggedSentence], labels: Sequence[str]) -> tuple[list[TaggedSentence], list[str]]:
    """The sentences whose tags are all in `labels` (the training file's), and "file:line: reason" naming the
    first unknown tag of each other one."""
    known = set(labels)
    kept, skipped = [], []
    for sentence in sentences:
        labels = sentence.labels or []
        unknown = next((k for k, label in enumerate(labels) if label not in known), None)
        if unknown is None:
            kept.append(sentence)
            continue
        if sentence.id is None:  # read_conll's "file:line" of the first token; one token per line
            path, first = sentence.location.rsplit(":", 1)
            at = where(path, int(first) + unknown)
        else:  # a table row: "file:row"
            at = f"{sentence.location}: token {unknown + 1}"
        skipped.append(f"{at}: label {labels[unknown]!r} is not one of the model's labels "
                       f"({', '.join(sorted(known))}), which come from the training file")
    return kept, skipped


def write_conll(path: str | Path, sentences: Sequence[TaggedSentence], predictions: Sequence[Sequence[str]]) -> None:
    """Each token line followed by a space and its predicted tag, and one line for each other line read, so the
    output lines up with the input line for line (`paste`) and is conlleval's input: a -DOCSTART- line gets " O"
    (conlleval wants as many fields on it as on a token line), a whitespace-only line is written blank (one tab
    is a field to conlleval). A sentence with no lines before it that follows another (one not read from a file)
    gets a blank line, conlleval's sentence boundary."""
    out: list[str] = []
    for sentence, tags in zip(sentences, predictions, strict=True):
        if out and not sentence.preceding:
            out.append("")
        out.extend(_as_written(line) for line in sentence.preceding)
        out.extend(f"{line} {tag}" for line, tag in zip(sentence.lines, tags, strict=True))
    out.extend(_as_written(line) for line in (sentences[-1].following if sentences else []))
    Path(path).write_text("".join(line + "\n" for line in out), encoding="utf-8")
