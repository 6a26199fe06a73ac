"""Reading a pre-training corpus as a stream of documents, with every bad input counted.

Formats: plain text in the original's layout (one sentence per line, a blank line between
documents), the same gzip-compressed (`.gz`), and JSON Lines (`.jsonl`, `.jsonl.gz`) with one
document per line in a `"text"` field (its lines are its sentences). Each input file starts a new
document (the original ran documents on across files). `split_sentences` splits paragraphs with
pysbd for text that is not one sentence per line.

Design decision: the reader holds at most one document and one line at a time, and bounds both -
a line longer than `MAX_LINE_BYTES` is cut there by `bertkit.textlines` (the rest is read in bounded
pieces and dropped; no sentence that long survives truncation to max_seq_length anyway; `bertkit
tokenizer train` reads lines the same way), a document longer than
`MAX_DOCUMENT_BYTES` is split - so a 100 MB line or a 10 GB file without blank lines costs bounded
memory. Rules for bad input (each counted in `CorpusStats`, each tested):

- invalid UTF-8: replaced by U+FFFD (which the tokenizer drops) and counted; `strict` raises with
  the file and line instead;
- a binary file (a NUL byte in its first 8 KiB) or an unreadable gzip file: skipped whole, counted
  and named; `strict` raises;
- an empty file: counted; a corpus with no document at all raises `BertkitError`;
- JSONL lines that are not JSON objects with a string "text": skipped and counted; `strict` raises.

References: google-research/bert `create_pretraining_data.py` (input format); pysbd
(Sadvilkar & Neumann 2020, "PySBD: Pragmatic Sentence Boundary Disambiguation").
"""

from __future__ import annotations

import glob
import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from bertkit.errors import BertkitError, where
from bertkit.textlines import FileCounts, decode_line, file_lines, text_files
from bertkit.tokenizer import MAX_TEXT_CHARS

MAX_LINE_BYTES = MAX_TEXT_CHARS
"""Longest text line kept whole (1,000,000 bytes, so at most the characters one text the tokenizer
takes); longer lines are cut here, and JSONL sentences at as many characters."""
MAX_JSONL_LINE_BYTES = 64 << 20
"""Longest JSONL line parsed (64 MiB); a longer one cannot be parsed in part and is skipped."""
MAX_DOCUMENT_BYTES = 8 << 20
"""Longest document (8 MiB of text); longer ones are split into documents of about this size."""


@dataclass
class CorpusStats(FileCounts):
    """What the reader saw and what it did about bad input (files as `bertkit.textlines` counts them)."""

    text_bytes: int = 0
    """Bytes of (decompressed) text read so far."""
    lines: int = 0
    """Non-blank lines read (JSONL: documents)."""
    skipped_lines: Counter = field(default_factory=Counter)
    """Reason -> lines skipped."""
    lines_cut: int = 0
    """Lines (JSONL: sentences) longer than MAX_LINE_BYTES, cut there."""
    documents_split: int = 0
    """Documents longer than MAX_DOCUMENT_BYTES, split."""

    def to_dict(self) -> dict:
        return {"files": self.files, "input_bytes": self.input_bytes,
                "text_bytes": self.text_bytes, "lines": self.lines,
                "empty_files": self.empty_files, "skipped_files": self.skipped_files,
                "skipped_lines": dict(sorted(self.skipped_lines.items())),
                "invalid_utf8_lines": self.invalid_utf8_lines, "lines_cut": self.lines_cut,
                "documents_split": self.documents_split}


def expand_inputs(patterns: list[str]) -> list[Path]:
    """Files named by paths or glob patterns, in order, each once."""
    if not patterns:
        raise BertkitError("--input: give at least one text, .gz or .jsonl file (or a glob pattern)")
    paths: list[Path] = []
    for pattern in patterns:
        matches = sorted(glob.glob(pattern, recursive=True)) if glob.has_magic(pattern) else [pattern]
        if not matches:
            raise BertkitError(f"--input {pattern!r}: no file matches this pattern")
        for match in map(Path, matches):
            if match.is_dir():
                raise BertkitError(f"--input {match}: is a directory; pass its files, e.g. '{match}/*.txt'")
            if not match.is_file():
                raise BertkitError(f"--input {match}: file not found")
            if match not in paths:
                paths.append(match)
    return paths


def read_documents(paths: list[Path], stats: CorpusStats, strict: bool = False) -> Iterator[list[str]]:
    """Documents (lists of non-empty, stripped lines) of all files in order; `stats.text_bytes`
    tells how far the reading got."""
    for path in text_files(paths, stats, strict):
        yield from _file_documents(path, stats, strict)


def _is_jsonl(path: Path) -> bool:
    suffixes = path.suffixes[-2:] if path.suffix == ".gz" else path.suffixes[-1:]
    return bool(suffixes) and suffixes[0] in (".jsonl", ".ndjson")


def _file_documents(path: Path, stats: CorpusStats, strict: bool) -> Iterator[list[str]]:
    jsonl = _is_jsonl(path)
    with file_lines(path, MAX_JSONL_LINE_BYTES if jsonl else MAX_LINE_BYTES, stats, strict) as lines:
        yield from (_jsonl_documents if jsonl else _text_documents)(path, lines, stats, strict)


def _text_documents(path: Path, lines, stats: CorpusStats, strict: bool) -> Iterator[list[str]]:
    document: list[str] = []
    document_bytes = 0
    for lineno, (raw, cut) in enumerate(lines, start=1):
        stats.text_bytes += len(raw)
        text = decode_line(raw, path, lineno, stats, strict).strip()
        if not text:
            if document:
                yield document
            document, document_bytes = [], 0
            continue
        stats.lines += 1
        stats.lines_cut += cut
        document.append(text)
        document_bytes += len(raw)
        if document_bytes >= MAX_DOCUMENT_BYTES:
            stats.documents_split += 1
            yield document
            document, document_bytes = [], 0
    if document:
        yield document


def _jsonl_documents(path: Path, lines, stats: CorpusStats, strict: bool) -> Iterator[list[str]]:
    for lineno, (raw, cut) in enumerate(lines, start=1):
        stats.text_bytes += len(raw)
        problem = "JSONL line over 64 MiB" if cut else None
        text = ""
        if problem is None:
            line = decode_line(raw, path, lineno, stats, strict).strip()
            if not line:
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                record, problem = None, "JSONL line is not valid JSON"
            if problem is None:
                value = record.get("text") if isinstance(record, dict) else None
                if isinstance(value, str):
                    text = value
                else:
                    problem = "JSONL record without a string 'text' field"
        if problem is not None:
            if strict:
                raise BertkitError(f"{where(path, lineno)}: {problem}; each line must be "
                                   '{"text": "..."} (or drop --strict to skip such lines)')
            stats.skipped_lines[problem] += 1
            continue
        stats.lines += 1
        yield from _split_document([s.strip() for s in text.split("\n") if s.strip()], stats)


def _split_document(sentences: list[str], stats: CorpusStats) -> Iterator[list[str]]:
    document: list[str] = []
    size = 0
    for sentence in sentences:
        if len(sentence) > MAX_LINE_BYTES:  # (characters; a text line's cut counts bytes)
            sentence = sentence[:MAX_LINE_BYTES]
            stats.lines_cut += 1
        document.append(sentence)
        size += len(sentence)
        if size >= MAX_DOCUMENT_BYTES:
            stats.documents_split += 1
            yield document
            document, size = [], 0
    if document:
        yield document


@lru_cache(maxsize=1)
def _segmenter():
    import pysbd  # imported only when --split-sentences is used

    return pysbd.Segmenter(language="en", clean=False)


def split_sentences(lines: list[str]) -> list[str]:
    """Sentences of each line (a paragraph), by pysbd's English rules."""
    segmenter = _segmenter()
    return [s.strip() for line in lines for s in segmenter.segment(line) if s.strip()]
