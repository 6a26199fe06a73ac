"""Reading text files line by line in bounded memory: plain or gzip, binary files detected, long lines cut.

Design decision: one line reader for every command that streams a corpus (`bertkit tokenizer train`
and `bertkit data pretraining`), so both apply the same rules to the same file. It sits below both
the tokenizer and the data layer (it imports only `bertkit.errors`). A line is read at most `limit`
bytes at a time: a longer one is cut there and the rest is read in bounded pieces and dropped, so a
100 MB line costs `limit` bytes, not 100 MB. Callers count what they are told (cut lines, invalid
UTF-8, unreadable files); this module decides nothing about policy beyond the cut.
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from bertkit.errors import BertkitError, where

BINARY_SNIFF_BYTES = 8192
"""A file with a NUL byte in its first 8 KiB is binary (as git and grep decide)."""
GZIP_ERRORS = (EOFError, zlib.error, gzip.BadGzipFile)
"""What reading a truncated or corrupt .gz file raises part-way through."""


def open_binary(path: Path) -> BinaryIO:
    """The file's bytes, decompressed when its name ends in .gz."""
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


def unreadable_reason(path: Path) -> str | None:
    """Why the file cannot be read as text ("binary file (NUL bytes)", "unreadable gzip file", ...), or None."""
    try:
        with open_binary(path) as stream:
            head = stream.read(BINARY_SNIFF_BYTES)
    except GZIP_ERRORS:
        return "unreadable gzip file"
    except OSError as exc:
        return f"unreadable file ({exc.strerror})"
    return "binary file (NUL bytes)" if b"\x00" in head else None


def bounded_lines(stream: BinaryIO, limit: int) -> Iterator[tuple[bytes, bool]]:
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


def decode_line(line: bytes, path: Path, lineno: int, strict: bool) -> tuple[str, bool]:
    """(text, had invalid UTF-8): invalid bytes become U+FFFD, or raise naming the line when `strict`."""
    try:
        return line.decode("utf-8"), False
    except UnicodeDecodeError as exc:
        if strict:
            raise BertkitError(f"{where(path, lineno)}: invalid UTF-8 at byte {exc.start} of the line; "
                               "fix the encoding (e.g. iconv -t UTF-8) or drop --strict to replace it") from None
        return line.decode("utf-8", errors="replace"), True
