"""Reading a corpus in bounded memory: plain text, gzip or JSONL, binary files detected, long lines cut.

Formats: plain text in the original's layout (one sentence per line, a blank line between
documents), the same gzip-compressed (`.gz`), and JSON Lines (`.jsonl`, `.ndjson`, `.jsonl.gz`) with
one document per line in a `"text"` field (its lines are its sentences); `expand_inputs` takes paths
and glob patterns. Each input file starts a new document (the original ran documents on across files).

Design decision: one corpus reader, `read_documents`, for every command that streams a corpus
(`bertkit tokenizer train` and `bertkit data pretraining`), so both read the same text from the same
file - a JSONL file's "text" fields, never its keys and braces - and apply the same rules: `text_files` counts
every file, names empty ones and skips binary or unreadable ones (`strict` raises instead);
`file_lines` reads one file (a leading UTF-8 byte order mark dropped), corrupt gzip data skipping the
rest of it the same way;
`decode_line` replaces invalid UTF-8 (counted) or raises naming the line. What they meet is
counted in a `FileCounts`, and what the document reader meets in `CorpusStats`, which each command's
statistics extend. It sits below both the tokenizer and the data layer (it imports only
`bertkit.errors`). A line is read at most `limit` bytes at a time: a longer one is cut there and the
rest is read in bounded pieces and dropped, so a 100 MB line costs `limit` bytes, not 100 MB; a
document longer than MAX_DOCUMENT_BYTES is split, so a 10 GB file without blank lines costs bounded
memory too. The rules for bad input (each counted, each tested in tests/data/test_pretraining_bad_input.py):

- invalid UTF-8: replaced by U+FFFD (which the tokenizer drops) and counted; `strict` raises with
  the file and line instead;
- a binary file (a NUL byte in its first 8 KiB) or an unreadable gzip file: skipped whole, counted
  and named; `strict` raises;
- an empty file: counted; the caller decides what no text at all means;
- JSONL lines that are not JSON objects with a string "text": skipped and counted; `strict` raises.
"""

from __future__ import annotations

import glob
import gzip
import json
import zlib
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from io import BufferedIOBase
from pathlib import Path

from bertkit.errors import BertkitError, where

BINARY_SNIFF_BYTES = 8192
"""A file with a NUL byte in its first 8 KiB is binary (as git and grep decide)."""
_GZIP_ERRORS = (EOFError, zlib.error, gzip.BadGzipFile)
"""What reading a truncated or corrupt .gz file raises part-way through."""
CORRUPT_GZIP = "corrupt gzip data (rest of file)"
"""The reason a file read up to its damage is named under in `FileCounts.skipped_files`."""


@dataclass
class FileCounts:
    """What reading text files met, each counted; a reader's statistics extend it."""

    files: int = 0
    input_bytes: int = 0
    """Bytes of the files as stored (a .gz file compressed)."""
    empty_files: list[str] = field(default_factory=list)
    skipped_files: dict[str, list[str]] = field(default_factory=dict)
    """Reason -> files skipped whole (binary, unreadable gzip) or from a point on (corrupt gzip data)."""
    invalid_utf8_lines: int = 0
    """Lines with invalid UTF-8, decoded with U+FFFD replacements."""


def text_files(paths: Iterable[Path], counts: FileCounts, strict: bool) -> Iterator[Path]:
    """The files that hold text, in order; each file counted, empty ones named, binary and unreadable
    ones skipped and named (`strict` raises instead)."""
    for path in paths:
        counts.files += 1
        size = path.stat().st_size
        counts.input_bytes += size
        reason = "empty" if size == 0 else _unreadable_reason(path)
        if reason == "empty":
            counts.empty_files.append(str(path))
        elif reason is not None:
            if strict:
                raise BertkitError(f"{path}: {reason}; remove it from --input (or drop --strict to skip it)")
            counts.skipped_files.setdefault(reason, []).append(str(path))
        else:
            yield path


@contextmanager
def file_lines(path: Path, limit: int, counts: FileCounts, strict: bool) -> Iterator[Iterator[tuple[bytes, bool]]]:
    """(line, was_cut) of one file (.gz decompressed), at most `limit` bytes each, to read inside the
    `with` block. Corrupt gzip data part-way ends the block there: the rest of the file is skipped,
    named in `counts` (`strict` raises instead)."""
    try:
        with _open_binary(path) as stream:
            yield _until_damage(_without_bom(_bounded_lines(stream, limit)), path, counts, strict)
    except _GZIP_ERRORS as exc:
        _damaged(path, exc, counts, strict)


def _until_damage(lines: Iterator[tuple[bytes, bool]], path: Path, counts: FileCounts, strict: bool,
                  ) -> Iterator[tuple[bytes, bool]]:
    """The lines up to corrupt gzip data, where they end as the file would (so a reader keeps the document
    it was reading: the text before the damage counts, as a cut-short plain file's would)."""
    try:
        yield from lines
    except _GZIP_ERRORS as exc:
        _damaged(path, exc, counts, strict)


def _damaged(path: Path, exc: BaseException, counts: FileCounts, strict: bool) -> None:
    if strict:
        raise BertkitError(f"{path}: corrupt gzip data ({exc}); fix or remove the file") from None
    if str(path) not in counts.skipped_files.get(CORRUPT_GZIP, []):
        counts.skipped_files.setdefault(CORRUPT_GZIP, []).append(str(path))


UTF8_BOM = b"\xef\xbb\xbf"
"""The byte order mark Excel, Notepad and PowerShell put at the start of UTF-8 files: not text."""


def _without_bom(lines: Iterator[tuple[bytes, bool]]) -> Iterator[tuple[bytes, bool]]:
    """The lines, the first without a leading UTF-8 byte order mark."""
    for index, (line, cut) in enumerate(lines):
        yield (line.removeprefix(UTF8_BOM) if index == 0 else line), cut


def _open_binary(path: Path) -> BufferedIOBase:
    """The file's bytes, decompressed when its name ends in .gz."""
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


def _unreadable_reason(path: Path) -> str | None:
    """Why the file cannot be read as text ("binary file (NUL bytes)", "unreadable gzip file", ...), or None."""
    try:
        with _open_binary(path) as stream:
            head = stream.read(BINARY_SNIFF_BYTES)
    except _GZIP_ERRORS:
        return "unreadable gzip file"
    except OSError as exc:
        return f"unreadable file ({exc.strerror})"
    return "binary file (NUL bytes)" if b"\x00" in head else None


def _bounded_lines(stream: BufferedIOBase, limit: int) -> Iterator[tuple[bytes, bool]]:
    """(line, was_cut) with at most `limit` bytes per line; the rest of a longer line is dropped."""
    while True:
        line = stream.readline(limit)
        if not line:
            return
        cut = len(line) == limit and not line.endswith(b"\n")
        if cut:
            while True:  # drop the rest of the line in bounded pieces
                rest = stream.readline(limit)
                if not rest or rest.endswith(b"\n"):
                    break
            line = _trim_partial_character(line)
        yield line, cut


def _trim_partial_character(data: bytes) -> bytes:
    """Drop a UTF-8 character cut in half at the end (a cut line is not invalid UTF-8)."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte < 0x80:
            return data
        if byte >= 0xC0:  # lead byte: complete if its sequence length fits
            needed = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return data if needed <= back else data[:-back]
    return data


def decode_line(line: bytes, path: Path, lineno: int, counts: FileCounts, strict: bool) -> str:
    """The line as text: invalid bytes become U+FFFD (counted), or raise naming the line when `strict`."""
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError as exc:
        if strict:
            raise BertkitError(f"{where(path, lineno)}: invalid UTF-8 at byte {exc.start} of the line; "
                               "fix the encoding (e.g. iconv -t UTF-8) or drop --strict to replace it") from None
        counts.invalid_utf8_lines += 1
        return line.decode("utf-8", errors="replace")


# --- documents ---------------------------------------------------------------------------------------

MAX_LINE_BYTES = 1_000_000
"""Longest text line kept whole (1,000,000 bytes, so at most the characters one text the tokenizer
takes, `bertkit.tokenizer.MAX_TEXT_CHARS`); longer lines are cut here, and JSONL sentences at as many
characters."""
MAX_JSONL_LINE_BYTES = 64 << 20
"""Longest JSONL line parsed (64 MiB); a longer one cannot be parsed in part and is skipped."""
MAX_DOCUMENT_BYTES = 8 << 20
"""Longest document (8 MiB of text); longer ones are split into documents of about this size."""


@dataclass
class CorpusStats(FileCounts):
    """What `read_documents` saw and what it did about bad input (files counted as `FileCounts`)."""

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
            except (ValueError, RecursionError):  # bad syntax, a huge integer, nesting past the recursion limit
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
