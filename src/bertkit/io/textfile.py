"""Reading a user's text file whole, with the one set of error messages every reader gives: the file,
its lines, its delimited records, JSON, and the length check on each text.

Design decision: the fine-tuning readers (GLUE/tables, CoNLL, SQuAD, SWAG) and feature extraction
read small files whole and strictly as UTF-8; a missing, unreadable or non-UTF-8 file is the user's
error, reported as `BertkitError` naming the file (and the flag, where one is given). Lines end at
line feeds only (`str.splitlines` would also cut at U+2028, U+0085 and form feeds, which occur inside
real text and would split a row in two); a carriage return before a line feed (Windows' CRLF) is not
part of the line, and a leading UTF-8 byte order mark (Excel and Notepad write one) is not text, so
U+FEFF never reaches a column name or a JSON parser. `.tsv` records are split on tabs with no quote
processing, as GLUE's files are written and Google's `run_classifier.py` reads them (`csv.QUOTE_NONE`):
a field that starts with `"` is plain text. `.csv` records use standard CSV quoting, read strictly, so
a quote left open is an error naming its line instead of silently joining the rows after it; records that
hold line breaks inside quoted fields are said once per file and process (fine-tuning reads its training
file twice: for the label set and for the examples), again only when the text changes. The
pre-training corpus reader streams instead and has its own replace-and-count policy (`bertkit.data.corpus`).
A file whose name ends in .gz or .zst is decompressed first (`format_suffix` names its format:
train.jsonl.zst is JSONL); tables (Parquet, `datasets` directories) are read by `bertkit.io.columnar`.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import logging
from collections.abc import Iterator
from io import BufferedIOBase
from pathlib import Path
from typing import Any, BinaryIO

from bertkit.errors import BertkitError, where
from bertkit.io.bounded import read_bounded
from bertkit.io.textlines import COMPRESSION_SUFFIXES, DECOMPRESSION_ERRORS, open_decompressed

log = logging.getLogger(__name__)

MAX_DATA_FILE_BYTES = 256 << 20
"""Largest file (decompressed) `read_text` reads whole: tables of labelled examples are tens of MB (MNLI's train
is 80 MB); past this, a stream, a decompression bomb or the wrong file would take the memory first. Larger data
goes in Parquet or a `datasets` directory, read in batches."""
STREAM_CHUNK_BYTES = 1 << 16
"""What `stream_lines` reads at a time."""
MAX_TEXT_CHARS = 1_000_000
"""Longest text read or encoded in one piece (the tokenizer's limit per call, `bertkit.tokenizer.MAX_TEXT_CHARS`).
Bounds time (~1 s on the Rust path, a few seconds in Python) and memory (offset tracking costs ~100 bytes per
character); longer text raises."""


def format_suffix(path: Path) -> str:
    """The ending that names the file's format, in lower case, under a .gz or .zst one (train.jsonl.zst: .jsonl)."""
    suffixes = [suffix.lower() for suffix in path.suffixes[-2:]]
    if suffixes and suffixes[-1] in COMPRESSION_SUFFIXES:
        suffixes.pop()
    return suffixes[-1] if suffixes else ""


def read_text(path: str | Path, flag: str | None = None) -> str:
    """The whole file as a str (decompressed when its name ends in .gz or .zst), without a leading byte order
    mark; `flag` (e.g. "--input") is named in error messages."""
    path = Path(path)
    label = f"{flag} {path}" if flag else str(path)
    with _read_errors(path, label):
        data = read_bounded(path, MAX_DATA_FILE_BYTES, "a file it reads whole (a fine-tuning or input table; "
                            "give a larger one as Parquet or a `datasets` directory)")
    try:  # decoded as Path.read_text would: universal newlines, a BOM at the start dropped
        return io.TextIOWrapper(io.BytesIO(data), encoding="utf-8-sig").read()
    except UnicodeDecodeError:
        raise BertkitError(f"{label}: {_invalid_utf8_at(data)}: not valid UTF-8; convert the file to UTF-8") from None


@contextlib.contextmanager
def _read_errors(path: Path, label: str) -> Iterator[None]:
    """A failure to read `path` as one line naming `label` (the flag and file) and what to do."""
    try:
        yield
    except DECOMPRESSION_ERRORS as exc:
        raise BertkitError(f"{label}: corrupt {path.suffix[1:]} data ({exc}); fix or replace the file") from None
    except FileNotFoundError:
        raise BertkitError(f"{label}: file not found") from None
    except IsADirectoryError:
        raise BertkitError(f"{label}: is a directory; give a file") from None
    except OSError as exc:
        raise BertkitError(f"{label}: cannot be read ({exc.strerror})") from None


def stream_lines(path: str | Path, flag: str | None = None) -> Iterator[str]:
    """The lines `text_lines(read_text(path))` gives (universal newlines, a leading byte order mark dropped),
    read as they are asked for: a caller that stops after N lines reads about N lines of a large file. The same
    bound on the bytes read and the same errors as `read_text`, a line that is not UTF-8 named by its number."""
    path = Path(path)
    label = f"{flag} {path}" if flag else str(path)
    with _read_errors(path, label), open_decompressed(path) as stream:
        for number, line in enumerate(_byte_lines(stream, label), start=1):
            yield _decoded(line, label, number)


def _byte_lines(stream: BufferedIOBase | BinaryIO, label: str) -> Iterator[bytes]:
    """The stream's lines as bytes, without their line ends. Each chunk is scanned once: chunks without a line end
    wait in `pending` until one comes, so a long line costs its length, and one past 4 bytes a character of the
    longest text is refused as it grows."""
    rest, pending, waiting, read, count = b"", [], 0, 0, 0
    for chunk in _chunks(stream):
        read += len(chunk)
        if read > MAX_DATA_FILE_BYTES:
            raise BertkitError(f"{label}: more than {MAX_DATA_FILE_BYTES:,} bytes, the most bertkit reads of a text "
                               "file; give a larger one as Parquet or a `datasets` directory")
        if b"\n" not in chunk and b"\r" not in chunk:
            pending.append(chunk)
            waiting += len(chunk)
            if len(rest) + waiting > 4 * MAX_TEXT_CHARS:  # UTF-8: at most 4 bytes a character
                raise BertkitError(f"{label}: line {count + 1} is over {4 * MAX_TEXT_CHARS:,} bytes, longer than the "
                                   f"{MAX_TEXT_CHARS:,} characters one text may have; split it into shorter lines")
            continue
        *lines, rest = _universal_lines(b"".join([rest, *pending, chunk]))
        pending, waiting, count = [], 0, count + len(lines)
        yield from lines
    *lines, rest = _universal_lines(b"".join([rest, *pending]))
    yield from lines
    if rest:  # the last line, without a line end, or ended by a CR
        yield rest.removesuffix(b"\r")


def _chunks(stream: BufferedIOBase | BinaryIO) -> Iterator[bytes]:
    """The stream's bytes in chunks, a leading UTF-8 byte order mark left out."""
    if first := stream.read(3).removeprefix(b"\xef\xbb\xbf"):
        yield first
    while chunk := stream.read(STREAM_CHUNK_BYTES):
        yield chunk


def _universal_lines(data: bytes) -> list[bytes]:
    """`data` cut at \\n, \\r\\n and a lone \\r, as universal newlines cut it; the last item is what follows the
    last line end (a CR at the very end stays on it: the next bytes may make it a CRLF)."""
    held = data.endswith(b"\r")
    lines = (data[:-1] if held else data).replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
    if held:
        lines[-1] += b"\r"
    return lines


def _decoded(line: bytes, label: str, number: int) -> str:
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BertkitError(f"{label}: line {number} (byte {exc.start} of the line): not valid UTF-8; convert the "
                           "file to UTF-8") from None


def _invalid_utf8_at(data: bytes) -> str:
    """'line L (byte B)' of the first byte of `data` that is not UTF-8 (the decoder's own position is within the
    chunk it was decoding, so it is found again in the whole)."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        return f"line {line} (byte {exc.start})"
    return "somewhere"  # (not reached: the same bytes failed to decode)


def text_lines(text: str) -> list[str]:
    """The lines of a file's text, cut at line feeds only, each without the carriage return of a CRLF
    ending (see the module docstring)."""
    lines = [line.removesuffix("\r") for line in text.split("\n")]
    return lines[:-1] if lines and not lines[-1] else lines


def parse_json(text: str, location: str, expected: str) -> Any:
    """`json.loads` with its failures (bad syntax, nesting deeper than Python's recursion limit, huge
    integers) as one `BertkitError` naming `location` and what the file should hold (`expected`)."""
    try:
        return json.loads(text)
    except RecursionError:
        raise BertkitError(f"{location}: JSON nested too deeply to read; {expected}") from None
    except ValueError as exc:  # json.JSONDecodeError, or an integer too long to convert
        raise BertkitError(f"{location}: not valid JSON ({exc}); {expected}") from None


def read_json_rows(path: Path) -> list[tuple[int, dict]]:
    """(line, object) of a JSONL file, or of a JSON file holding one array of objects (`[{...}, ...]`, as
    `json.dump` and pandas' `to_json(orient="records")` write them), told apart by the first character."""
    text = read_text(path)
    if text.lstrip().startswith("["):
        return _json_array_rows(path, text)
    rows = []
    for number, line in enumerate(text_lines(text), start=1):
        if not line.strip():
            continue
        row = parse_json(line, where(path, number), "JSONL needs one JSON object per line")
        if not isinstance(row, dict):
            raise BertkitError(f"{where(path, number)}: expected a JSON object, got {type(row).__name__}")
        rows.append((number, row))
    return rows


def _json_array_rows(path: Path, text: str) -> list[tuple[int, dict]]:
    """The objects of a JSON array, each with the line where it starts (read one element at a time, so an
    error names the element's line)."""
    decoder = json.JSONDecoder()
    expected = "a JSON file needs one array of objects, [{...}, {...}], or one object per line (JSONL)"
    rows: list[tuple[int, dict]] = []
    index = text.index("[") + 1
    while True:
        index = _skip_space(text, index)
        if text.startswith("]", index) and not rows:
            break
        number = text.count("\n", 0, index) + 1
        try:
            row, index = decoder.raw_decode(text, index)
        except RecursionError:
            raise BertkitError(f"{where(path, number)}: JSON nested too deeply to read; {expected}") from None
        except ValueError as exc:
            raise BertkitError(f"{where(path, number)}: not valid JSON ({exc}); {expected}") from None
        if not isinstance(row, dict):
            raise BertkitError(f"{where(path, number)}: expected a JSON object in the array, got {type(row).__name__}")
        rows.append((number, row))
        index = _skip_space(text, index)
        if text.startswith(",", index):
            index += 1
        elif text.startswith("]", index):
            break
        else:
            raise BertkitError(f"{where(path, text.count(chr(10), 0, index) + 1)}: expected ',' or ']' after the "
                               f"array's element {len(rows)}; {expected}")
    if _skip_space(text, index + 1) != len(text):
        raise BertkitError(f"{where(path, text.count(chr(10), 0, index) + 1)}: text after the array's closing "
                           f"']'; {expected}")
    return rows


def _skip_space(text: str, index: int) -> int:
    while index < len(text) and text[index] in " \t\r\n":
        index += 1
    return index


def check_length(text: str, location: str, what: str = "text") -> str:
    """`text` unchanged, or a `BertkitError` naming `location` when it is longer than the tokenizer takes."""
    if len(text) > MAX_TEXT_CHARS:
        raise BertkitError(f"{location}: the {what} has {len(text):,} characters, over the {MAX_TEXT_CHARS:,} "
                           "one text may have; split it into shorter examples")
    return text


def read_records(path: Path) -> list[tuple[int, list[str]]]:
    """Non-blank records of a .tsv or .csv file (also .gz or .zst) as (line number where the record starts,
    fields)."""
    text = read_text(path)
    if format_suffix(path) == ".tsv":
        return [(number, line.split("\t")) for number, line in enumerate(text_lines(text), start=1)
                if line.strip()]
    return _csv_records(path, text)


def _csv_records(path: Path, text: str) -> list[tuple[int, list[str]]]:
    records: list[tuple[int, list[str]]] = []
    multiline: list[int] = []
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    previous_limit = csv.field_size_limit(MAX_TEXT_CHARS)  # the default, 128 KiB, is below a text's limit
    start = 1
    try:
        for fields in reader:
            if any(field.strip() for field in fields):
                records.append((start, fields))
                if reader.line_num > start:
                    multiline.append(start)
            start = reader.line_num + 1
    except csv.Error as exc:
        raise BertkitError(_csv_problem(path, start, reader.line_num, str(exc))) from None
    finally:
        csv.field_size_limit(previous_limit)
    if multiline and _first_time(path, text):
        log.warning("%s: %d records hold line breaks inside quoted fields (the first starts at line %d); if "
                    "that is not intended, a quote left open joined rows", path, len(multiline), multiline[0])
    return records


_SAID: set[tuple[str, int]] = set()
"""The files (path, hash of the text) whose line breaks inside quoted fields were said."""


def _first_time(path: Path, text: str) -> bool:
    """True the first time this text of the file is asked about in this process."""
    key = (str(path.resolve()), hash(text))
    if key in _SAID:
        return False
    _SAID.add(key)
    return True


def _csv_problem(path: Path, start: int, end: int, error: str) -> str:
    if "field larger than field limit" in error:
        return (f"{where(path, end)}: a field over {MAX_TEXT_CHARS:,} characters, the most one text may have; "
                "split it into shorter examples")
    return (f"{where(path, start)}: malformed CSV quoting in the record starting here (read up to line {end}: "
            f"{error}); a quoted field must end with a quote and double the quotes inside it (\"\"), or save "
            "the file as tab-separated .tsv, which is read without quote processing")
