"""CoNLL-2003 style tagging files: read sentences of (word, label) and write predictions back.

Format: one token per line, whitespace-separated columns, the word first and the label last; a blank
line ends a sentence; `-DOCSTART-` lines mark documents and carry no tokens. Unlabelled files (for
`bertkit predict`) have the word alone or any columns without a label when `labelled=False`.

Design decision: each sentence keeps its original lines, so predictions are written back as the input
line plus one column with the predicted tag — the layout conlleval reads (`word ... gold predicted`) —
and document markers are kept in place.

Reference: Tjong Kim Sang & De Meulder (2003), the CoNLL-2003 shared task data format.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bertkit.data.textfile import read_text
from bertkit.errors import BertkitError, where

DOCSTART = "-DOCSTART-"


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
    """-DOCSTART- lines just before this sentence, written back in place."""


def read_conll(path: str | Path, labelled: bool = True) -> list[TaggedSentence]:
    """Sentences of a CoNLL file; a token line without a label column is an error when `labelled`."""
    path = Path(path)
    text = read_text(path)
    sentences: list[TaggedSentence] = []
    current: TaggedSentence | None = None
    pending_docstarts: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        columns = line.split()
        if not columns or columns[0] == DOCSTART:
            if current is not None:
                sentences.append(current)
                current = None
            if columns:
                pending_docstarts.append(line)
            continue
        if labelled and len(columns) < 2:
            raise BertkitError(f"{where(path, number)}: token line {line!r} has no label column; a CoNLL "
                               "training/evaluation file needs 'word ... label' on every token line")
        if current is None:
            current = TaggedSentence([], [] if labelled else None, where(path, number), [], pending_docstarts)
            pending_docstarts = []
        current.words.append(columns[0])
        current.lines.append(line.rstrip("\n"))
        if labelled:
            current.labels.append(columns[-1])
    if current is not None:
        sentences.append(current)
    if not sentences:
        raise BertkitError(f"{path}: no sentences; expected one 'word ... label' line per token and a "
                           "blank line between sentences")
    return sentences


def check_tags(sentences: Sequence[TaggedSentence], labels: Sequence[str]) -> None:
    """Raise on the first label not in `labels` (the label set comes from the training file)."""
    known = set(labels)
    for sentence in sentences:
        for offset, label in enumerate(sentence.labels or ()):
            if label not in known:
                raise BertkitError(f"{sentence.location} (+{offset} lines): unknown label {label!r}; the training "
                                   f"file's labels are {', '.join(sorted(known))}")


def write_conll(path: str | Path, sentences: Sequence[TaggedSentence], predictions: Sequence[Sequence[str]]) -> None:
    """Each input line followed by a space and its predicted tag; sentences separated by blank lines."""
    out: list[str] = []
    for sentence, tags in zip(sentences, predictions, strict=True):
        for marker in sentence.preceding:
            out.extend([marker, ""])
        out.extend(f"{line} {tag}" for line, tag in zip(sentence.lines, tags, strict=True))
        out.append("")
    Path(path).write_text("\n".join(out) + "\n", encoding="utf-8")
