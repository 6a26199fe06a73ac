"""Reading text files line by line in bounded memory: plain or gzip, binary files detected, long lines cut.

Design decision: one line reader for every command that streams a corpus (`bertkit tokenizer train`
and `bertkit data pretraining`), so both apply the same rules to the same file: `text_files` counts
every file, names empty ones and skips binary or unreadable ones (`strict` raises instead);
`file_lines` reads one file (a leading UTF-8 byte order mark dropped), corrupt gzip data skipping the
rest of it the same way;
`decode_line` replaces invalid UTF-8 (counted) or raises naming the line. What they meet is
counted in a `FileCounts`, which each reader's own statistics extend. It sits below both the
tokenizer and the data layer (it imports only `bertkit.errors`). A line is read at most `limit`
bytes at a time: a longer one is cut there and the rest is read in bounded pieces and dropped, so a
100 MB line costs `limit` bytes, not 100 MB; callers decide what a cut line means.
"""

from __future__ import annotations

import gzip
import zlib
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
            yield _without_bom(_bounded_lines(stream, limit))
    except _GZIP_ERRORS as exc:
        if strict:
            raise BertkitError(f"{path}: corrupt gzip data ({exc}); fix or remove the file") from None
        counts.skipped_files.setdefault("corrupt gzip data (rest of file)", []).append(str(path))


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
