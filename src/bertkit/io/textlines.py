"""Reading a corpus in bounded memory: plain text, JSONL, Parquet or `datasets` files, compressed or not,
binary files detected, long lines cut.

Formats: plain text in the original's layout (one sentence per line, a blank line between
documents), JSON Lines (`.jsonl`, `.ndjson`) with one document per line in a `"text"` field (its lines
are its sentences), either of them compressed with gzip (`.gz`) or zstd (`.zst`), and tables - Parquet
(`.parquet`) and the Arrow files of a Hugging Face `datasets` directory (`.arrow`, `bertkit.io.columnar`) -
with one document per row in a "text" column (its lines are its sentences, as for JSONL). `text_column`
names another field or column. `expand_inputs` takes paths, glob patterns and directories: a directory
is its files of these formats in sorted order, recursively (a `save_to_disk` directory as its shards);
other files there are skipped and named. Each input file starts a new document (the original ran
documents on across files).

Design decision: one corpus reader, `read_documents`, for every command that streams a corpus
(`bertkit tokenizer train` and `bertkit data pretraining`), so both read the same text from the same
file - a JSONL file's "text" fields, never its keys and braces - and apply the same rules: `text_files`
counts every file, names empty ones and skips binary or unreadable ones (`strict` raises instead);
`file_lines` reads one file (a leading UTF-8 byte order mark dropped), corrupt gzip or zstd data
skipping the rest of it the same way; `decode_line` replaces invalid UTF-8 (counted) or raises naming
the line. What they meet is counted in a `FileCounts`, and what the document reader meets in
`CorpusStats`, which each command's statistics extend. It sits below both the tokenizer and the data
layer (it imports only `bertkit.errors` and `bertkit.io.columnar`). A line is read at most `limit` bytes
at a time: a longer one is cut there and the rest is read in bounded pieces and dropped, so a 100 MB
line costs `limit` bytes, not 100 MB; a document longer than MAX_DOCUMENT_BYTES is split, so a 10 GB
file without blank lines costs bounded memory too; compressed files are decompressed as a stream, and
tables are read a batch of rows at a time (a row is held whole). The rules for bad input (each counted,
each tested in tests/data/test_pretraining_bad_input.py and tests/data/test_input_formats.py):

- invalid UTF-8: replaced by U+FFFD (which the tokenizer drops) and counted; `strict` raises with
  the file and line instead;
- a binary file (a NUL byte in its first 8 KiB; not asked of Parquet and Arrow files, which hold NUL
  bytes) or a file that cannot be decompressed or opened as a table: skipped whole, counted and named;
  corrupt data part-way skips the rest of the file the same way; `strict` raises;
- an empty file: counted; the caller decides what no text at all means;
- JSONL lines that are not JSON objects with a string "text", and table rows whose text is null:
  skipped and counted; `strict` raises;
- a table without the text column, or whose text column does not hold strings: an error naming the file,
  the column and the columns there are (the wrong --text-column, not a bad row).
"""

from __future__ import annotations

import glob
import gzip
import io
import json
import zlib
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from io import BufferedIOBase
from pathlib import Path

import zstandard

from bertkit.errors import BertkitError, where
from bertkit.io.columnar import (
    UnreadableFile,
    check_columns,
    check_text_column,
    column_batches,
    dataset_files,
    is_columnar,
    schema,
)

BINARY_SNIFF_BYTES = 8192
"""A file with a NUL byte in its first 8 KiB is binary (as git and grep decide)."""
DECOMPRESSION_ERRORS = (EOFError, zlib.error, gzip.BadGzipFile, zstandard.ZstdError)
"""What reading a truncated or corrupt .gz or .zst file raises part-way through."""
CORRUPT_GZIP = "corrupt gzip data (rest of file)"
"""The reason a file read up to its damage is named under in `FileCounts.skipped_files`."""
CORRUPT_ZSTD = "corrupt zstd data (rest of file)"
CORRUPT_TABLE = "corrupt Parquet/Arrow data (rest of file)"
ZSTD_INPUT_BYTES = 4096
"""Compressed bytes of a .zst file decompressed at a time (what one step may expand to is bounded by it)."""


@dataclass
class FileCounts:
    """What reading text files met, each counted; a reader's statistics extend it."""

    files: int = 0
    input_bytes: int = 0
    """Bytes of the files as stored (a .gz file compressed)."""
    empty_files: list[str] = field(default_factory=list)
    skipped_files: dict[str, list[str]] = field(default_factory=dict)
    """Reason -> files skipped whole (binary, unreadable gzip, zstd or table) or from a point on (corrupt data);
    a directory's files of other formats too."""
    invalid_utf8_lines: int = 0
    """Lines with invalid UTF-8, decoded with U+FFFD replacements."""

    def skipped_said(self) -> str:
        """The files skipped and why, for an error that says nothing was read: "REASON: a, b, c; REASON: d"."""
        return "; ".join(f"{reason}: {', '.join(files[:3])}" for reason, files in self.skipped_files.items())


def text_files(paths: Iterable[Path], counts: FileCounts, strict: bool) -> Iterator[Path]:
    """The files that hold text, in order; each file counted, empty ones named, binary and unreadable
    ones skipped and named (`strict` raises instead)."""
    for path in paths:
        counts.files += 1
        size = path.stat().st_size
        counts.input_bytes += size
        reason = "empty" if size == 0 else _table_reason(path) if is_columnar(path) else _unreadable_reason(path)
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
    """(line, was_cut) of one file (.gz and .zst decompressed), at most `limit` bytes each, to read inside the
    `with` block. Corrupt compressed data part-way ends the block there: the rest of the file is skipped,
    named in `counts` (`strict` raises instead)."""
    try:
        with open_decompressed(path) as stream:
            yield _until_damage(_without_bom(_bounded_lines(stream, limit)), path, counts, strict)
    except DECOMPRESSION_ERRORS as exc:
        _damaged(path, exc, counts, strict)


def _until_damage(lines: Iterator[tuple[bytes, bool]], path: Path, counts: FileCounts, strict: bool,
                  ) -> Iterator[tuple[bytes, bool]]:
    """The lines up to corrupt compressed data, where they end as the file would (so a reader keeps the
    document it was reading: the text before the damage counts, as a cut-short plain file's would)."""
    try:
        yield from lines
    except DECOMPRESSION_ERRORS as exc:
        _damaged(path, exc, counts, strict)


def _damaged(path: Path, exc: BaseException, counts: FileCounts, strict: bool) -> None:
    zstd = path.suffix == ".zst"
    if strict:
        raise BertkitError(f"{path}: corrupt {'zstd' if zstd else 'gzip'} data ({exc}); fix or remove the file") \
            from None
    reason = CORRUPT_ZSTD if zstd else CORRUPT_GZIP
    if str(path) not in counts.skipped_files.get(reason, []):
        counts.skipped_files.setdefault(reason, []).append(str(path))


UTF8_BOM = b"\xef\xbb\xbf"
"""The byte order mark Excel, Notepad and PowerShell put at the start of UTF-8 files: not text."""


def _without_bom(lines: Iterator[tuple[bytes, bool]]) -> Iterator[tuple[bytes, bool]]:
    """The lines, the first without a leading UTF-8 byte order mark."""
    for index, (line, cut) in enumerate(lines):
        yield (line.removeprefix(UTF8_BOM) if index == 0 else line), cut


def open_decompressed(path: Path) -> BufferedIOBase:
    """The file's bytes, decompressed when its name ends in .gz or .zst."""
    if path.suffix == ".gz":
        return gzip.open(path, "rb")
    if path.suffix == ".zst":
        return io.BufferedReader(_ZstdReader(path))
    return open(path, "rb")


class _ZstdReader(io.RawIOBase):
    """A .zst file's bytes decompressed as a stream, its frames one after another (as `zstd -c a b`,
    pzstd and zstdmt write them). zstandard's own `stream_reader` ends quietly at a file cut short
    inside a frame; this raises ZstdError there, as gzip raises EOFError, so the damage is named."""

    def __init__(self, path: Path) -> None:
        self._file = open(path, "rb")  # noqa: SIM115 (closed by close(), as io.FileIO closes its file)
        self._zstd = zstandard.ZstdDecompressor()
        self._frame = self._zstd.decompressobj()
        self._in_frame = False
        self._pending = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # (a writable buffer: a memoryview of BufferedReader's)
        while not self._pending:
            data = self._file.read(ZSTD_INPUT_BYTES)
            if not data:
                if self._in_frame:
                    raise zstandard.ZstdError("the file ends inside a frame (cut short)")
                return 0
            self._pending = memoryview(self._decompress(data))
        size = min(len(buffer), len(self._pending))
        buffer[:size] = self._pending[:size]
        self._pending = self._pending[size:]
        return size

    def _decompress(self, data: bytes) -> bytes:
        out = []
        while data:
            if self._frame.eof:  # the next frame starts here
                self._frame = self._zstd.decompressobj()
            out.append(self._frame.decompress(data))
            data = self._frame.unused_data if self._frame.eof else b""
        self._in_frame = not self._frame.eof
        return b"".join(out)

    def close(self) -> None:
        self._file.close()
        super().close()


def _unreadable_reason(path: Path) -> str | None:
    """Why the file cannot be read as text ("binary file (NUL bytes)", "unreadable gzip file", ...), or None."""
    try:
        with open_decompressed(path) as stream:
            head = stream.read(BINARY_SNIFF_BYTES)
            if _wide_text(head):  # before the NUL test: a byte-order mark may come without a NUL in the head
                return UTF16_OR_32
            if b"\x00" in head:
                return "binary file (NUL bytes)"
            # Lines ended by CR alone read as one line (cut at MAX_LINE_BYTES, or one sentence); a stray CR inside
            # a long first line is not that, so look for a line feed as far as the reader would.
            if b"\n" not in head and head.count(b"\r") > 1 and not _line_feed_within(stream, MAX_LINE_BYTES):
                return LONE_CR
            return None
    except DECOMPRESSION_ERRORS:
        return f"unreadable {'zstd' if path.suffix == '.zst' else 'gzip'} file"
    except OSError as exc:
        return f"unreadable file ({exc.strerror})"


def _line_feed_within(stream: BufferedIOBase, budget: int) -> bool:
    """Whether a line feed comes within the next `budget` bytes of `stream` (damage on the way: say yes, and
    leave the file to the reader, which reads up to the damage)."""
    try:
        while budget > 0:
            chunk = stream.read(min(budget, 1 << 16))
            if not chunk:
                return False
            if b"\n" in chunk:
                return True
            budget -= len(chunk)
    except DECOMPRESSION_ERRORS:
        return True
    return False


LONE_CR = "lines ended by CR alone, as classic Mac OS wrote them (convert them, e.g. tr '\\r' '\\n')"


UTF16_OR_32 = ("UTF-16 or UTF-32 text, not UTF-8 (convert it to UTF-8, e.g. iconv -f UTF-16 -t UTF-8, or -f UTF-32 "
               "for UTF-32)")


def _wide_text(head: bytes) -> bool:
    """Whether `head` starts like UTF-16 or UTF-32 text, which is text in an encoding the readers do not take, not
    binary: a byte-order mark, ASCII with NUL bytes between its characters, or (a BOM-less UTF-16 file in another
    script: Cyrillic, Greek, CJK) a head that holds NUL bytes and reads as UTF-16 text in one byte order."""
    if head.startswith((b"\xff\xfe", b"\xfe\xff", b"\x00\x00\xfe\xff")):
        return True
    sample = head[:512]
    if len(sample) >= 8 and any(sample) and (not any(sample[1::2]) or not any(sample[0::2])):
        return True
    return b"\x00" in head and any(_reads_as_utf16(head, order) for order in ("utf-16-le", "utf-16-be"))


def _reads_as_utf16(head: bytes, encoding: str) -> bool:
    """Whether `head` decodes as `encoding` to printable text and whitespace only, with a space or line end in it.
    Binary data does not: 3% of random 16-bit units are lone surrogates (a decoding error) and 10% private-use or
    unassigned (not printable), so a few hundred of them never pass."""
    sample = head[:4096]
    try:
        text = sample[:len(sample) - len(sample) % 2].decode(encoding)
    except UnicodeDecodeError as exc:  # a pair cut by the head's end is still text
        if exc.start < len(sample) - 4:
            return False
        text = sample[:exc.start].decode(encoding)
    return (len(text) >= 64 and any(ch in " \n" for ch in text)
            and all(ch.isprintable() or ch in "\n\r\t" for ch in text))


def _table_reason(path: Path) -> str | None:
    """Why a Parquet or Arrow file cannot be read ("unreadable Parquet file"), or None (its schema reads)."""
    try:
        schema(path)
    except UnreadableFile:
        return f"unreadable {'Parquet' if path.suffix.lower() == '.parquet' else 'Arrow'} file"
    return None


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
MAX_JSONL_LINE_BYTES = 16 << 20
"""Longest JSONL line parsed (16 MiB, twice a document's MAX_DOCUMENT_BYTES: json.loads takes some 25 times a
line's bytes at worst); a longer one cannot be parsed in part and is skipped and counted."""
MAX_DOCUMENT_BYTES = 8 << 20
"""Longest document (8 MiB of text); longer ones are split into documents of about this size."""


@dataclass
class CorpusStats(FileCounts):
    """What `read_documents` saw and what it did about bad input (files counted as `FileCounts`)."""

    text_bytes: int = 0
    """Bytes of (decompressed) text read so far."""
    lines: int = 0
    """Non-blank lines read (JSONL and tables: documents)."""
    skipped_lines: Counter = field(default_factory=Counter)
    """Reason -> lines skipped."""
    lines_cut: int = 0
    """Lines (JSONL: sentences) longer than MAX_LINE_BYTES, cut there."""
    documents_split: int = 0
    """Documents longer than MAX_DOCUMENT_BYTES, split."""
    undivided_files: list[str] = field(default_factory=list)
    """Text files of two or more lines with no blank line between them: each was read as one document."""

    def to_dict(self) -> dict:
        return {"files": self.files, "input_bytes": self.input_bytes,
                "text_bytes": self.text_bytes, "lines": self.lines,
                "empty_files": self.empty_files, "skipped_files": self.skipped_files,
                "skipped_lines": dict(sorted(self.skipped_lines.items())),
                "invalid_utf8_lines": self.invalid_utf8_lines, "lines_cut": self.lines_cut,
                "documents_split": self.documents_split, "undivided_files": self.undivided_files}


TEXT_SUFFIXES = (".txt", ".text")
JSONL_SUFFIXES = (".jsonl", ".ndjson")
COMPRESSION_SUFFIXES = (".gz", ".zst")
NOT_A_CORPUS_FORMAT = "not a corpus format (.txt, .jsonl, .parquet, .arrow, + .gz/.zst) in a directory --input"
HIDDEN = "hidden (name starts with '.') in a directory --input"
DEFAULT_TEXT_COLUMN = "text"


def corpus_format(path: Path) -> str | None:
    """"text", "jsonl" or "table" by the file's name (.txt, .jsonl, .parquet, ...; text and JSONL also with
    .gz or .zst), None for another name. A file named on the command line is read as text then; a
    directory's files only when they have one of these names."""
    suffixes = [suffix.lower() for suffix in path.suffixes[-2:]]
    if suffixes and suffixes[-1] in (".parquet", ".arrow"):
        return "table"
    if suffixes and suffixes[-1] in COMPRESSION_SUFFIXES:
        suffixes.pop()
    kind = suffixes[-1] if suffixes else ""
    return "jsonl" if kind in JSONL_SUFFIXES else "text" if kind in TEXT_SUFFIXES else None


def expand_inputs(patterns: list[str], counts: FileCounts, flag: str = "--input") -> list[Path]:
    """Files named by paths, glob patterns or directories (their corpus files in sorted order, recursively;
    a `datasets` directory's shards), in order, each once; the other files of a directory are named in
    `counts.skipped_files`. Errors name `flag`, the option the patterns came from."""
    if not patterns:
        raise BertkitError(f"{flag}: give at least one text, .jsonl or .parquet file (or .gz/.zst), a directory "
                           "or a glob pattern")
    paths: list[Path] = []
    seen: set[Path] = set()
    for pattern in patterns:
        matches = sorted(glob.glob(pattern, recursive=True)) if glob.has_magic(pattern) else [pattern]
        if not matches:
            raise BertkitError(f"{flag} {pattern!r}: no file matches this pattern")
        for match in map(Path, matches):
            if match.is_dir():
                found = _directory_files(match, counts, set())
                if not found:
                    raise BertkitError(f"{flag} {match}: a directory without a corpus file in it (.txt, .jsonl, "
                                       ".parquet, .arrow, or .txt/.jsonl with .gz or .zst)")
            elif match.is_file():
                found = [match]
            else:
                raise BertkitError(f"{flag} {match}: file not found")
            paths.extend(path for path in found if path not in seen)
            seen.update(found)
    return paths


def _directory_files(directory: Path, counts: FileCounts, visited: set[Path]) -> list[Path]:
    """The corpus files of a directory and its subdirectories in sorted order (a `save_to_disk` directory:
    its shards, in its order); the others are named in `counts`."""
    shards = dataset_files(directory)
    if shards is not None:
        return shards
    visited.add(directory.resolve())
    files: list[Path] = []
    for entry in sorted(directory.iterdir()):
        reason = HIDDEN if entry.name.startswith(".") else None
        if reason is None and entry.is_dir():
            if entry.resolve() not in visited:  # a symbolic link back up would never end
                files += _directory_files(entry, counts, visited)
            continue
        if reason is None and entry.is_file() and corpus_format(entry) is not None:
            files.append(entry)
            continue
        counts.skipped_files.setdefault(reason or NOT_A_CORPUS_FORMAT, []).append(str(entry))
    return files


def plain_text_bytes(paths: list[Path]) -> int | None:
    """The bytes of text the files hold when none is compressed or a table (a progress bar's total), else
    None: their text's size is known only once read."""
    if any(path.suffix in COMPRESSION_SUFFIXES or is_columnar(path) for path in paths):
        return None
    return sum(path.stat().st_size for path in paths)


def read_documents(paths: list[Path], stats: CorpusStats, strict: bool = False,
                   text_column: str = DEFAULT_TEXT_COLUMN) -> Iterator[list[str]]:
    """Documents (lists of non-empty, stripped lines) of all files in order; `text_column` is the field of
    a JSONL record and the column of a table that holds a document. `stats.text_bytes` tells how far the
    reading got."""
    for path in text_files(paths, stats, strict):
        if is_columnar(path):
            yield from _table_documents(path, text_column, stats, strict)
        else:
            yield from _file_documents(path, stats, strict, text_column)


def _is_jsonl(path: Path) -> bool:
    suffixes = path.suffixes[-2:] if path.suffix in COMPRESSION_SUFFIXES else path.suffixes[-1:]
    return bool(suffixes) and suffixes[0] in JSONL_SUFFIXES


def _file_documents(path: Path, stats: CorpusStats, strict: bool, column: str) -> Iterator[list[str]]:
    if not _is_jsonl(path):
        with file_lines(path, MAX_LINE_BYTES, stats, strict) as lines:
            yield from _text_documents(path, lines, stats, strict)
        return
    with file_lines(path, MAX_JSONL_LINE_BYTES, stats, strict) as lines:
        yield from _jsonl_documents(path, lines, stats, strict, column)


def _table_documents(path: Path, column: str, stats: CorpusStats, strict: bool) -> Iterator[list[str]]:
    """One document per row of a Parquet or Arrow file, its lines the sentences (as a JSONL text's); a
    null text is skipped and counted, corrupt data part-way skips the rest of the file (`strict` raises)."""
    file_schema = schema(path)  # text_files has read it once: it is the file's footer or first message
    check_columns(path, file_schema.names, {column: "--text-column"})
    check_text_column(path, file_schema, column, "--text-column")
    row = 0
    try:
        for texts in column_batches(path, column):
            for text in texts:
                row += 1
                if not isinstance(text, str):
                    _null_text(path, row, column, stats, strict)
                    continue
                stats.text_bytes += len(text.encode("utf-8"))
                stats.lines += 1
                yield from _split_document(_sentences(text), stats)
    except UnreadableFile:
        if strict:
            raise
        stats.skipped_files.setdefault(CORRUPT_TABLE, []).append(str(path))


def _null_text(path: Path, row: int, column: str, stats: CorpusStats, strict: bool) -> None:
    if strict:
        raise BertkitError(f"{path}: row {row} (the first is 1) has no text: column {column!r} is null; give "
                           "every row a text, or drop --strict to skip such rows")
    stats.skipped_lines[f"table row with a null {column!r}"] += 1


def _sentences(text: str) -> list[str]:
    """The sentences of a JSONL or table document: its non-blank lines, stripped."""
    return [line.strip() for line in text.split("\n") if line.strip()]


def _text_documents(path: Path, lines, stats: CorpusStats, strict: bool) -> Iterator[list[str]]:
    document: list[str] = []
    document_bytes = 0
    first_line, divided = stats.lines, False
    for lineno, (raw, cut) in enumerate(lines, start=1):
        stats.text_bytes += len(raw)
        text = decode_line(raw, path, lineno, stats, strict).strip()
        if not text:
            if document:
                divided = True
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
    if not divided and stats.lines - first_line > 1:
        stats.undivided_files.append(str(path))
    if document:
        yield document


def _jsonl_documents(path: Path, lines, stats: CorpusStats, strict: bool, column: str) -> Iterator[list[str]]:
    for lineno, (raw, cut) in enumerate(lines, start=1):
        stats.text_bytes += len(raw)
        problem = "JSONL line over 16 MiB" if cut else None
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
                value = record.get(column) if isinstance(record, dict) else None
                if isinstance(value, str):
                    text = value
                else:
                    problem = f"JSONL record without a string {column!r} field"
        if problem is not None:
            if strict:
                raise BertkitError(f"{where(path, lineno)}: {problem}; each line must be "
                                   f"{json.dumps({column: '...'})} (or drop --strict to skip such lines)")
            stats.skipped_lines[problem] += 1
            continue
        stats.lines += 1
        yield from _split_document(_sentences(text), stats)


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
