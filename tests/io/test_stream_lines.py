"""stream_lines reads a text file's lines as they are asked for, and gives exactly what read_text's lines give:
universal newlines (a CRLF or CR split across two reads alike), a byte order mark dropped, the same bound."""

from __future__ import annotations

import gzip
import random

import pytest

from bertkit.data.text_inputs import iter_lines
from bertkit.errors import BertkitError
from bertkit.io import textfile
from bertkit.io.textfile import read_text, stream_lines, text_lines

PIECES = [b"a", b"bc", b"\n", b"\r", b"\r\n", "\u00e9".encode(), b" ", b"\xef\xbb\xbf", b"xyz" * 5]


@pytest.mark.parametrize("chunk", [1, 2, 3, 5, 1 << 16])
def test_the_lines_are_read_texts_whatever_the_reads(tmp_path, monkeypatch, chunk):
    monkeypatch.setattr(textfile, "STREAM_CHUNK_BYTES", chunk)
    rng = random.Random(chunk)
    for trial in range(300):
        data = (b"\xef\xbb\xbf" if trial % 3 == 0 else b"") + b"".join(
            rng.choice(PIECES) for _ in range(rng.randint(0, 30)))
        path = tmp_path / ("f.txt.gz" if trial % 5 == 0 else "f.txt")
        path.write_bytes(gzip.compress(data) if trial % 5 == 0 else data)
        assert list(stream_lines(path)) == text_lines(read_text(path)), data


def test_a_caller_that_stops_early_reads_no_further(tmp_path, monkeypatch):
    """Damage past what is asked for is never met: --max-unlabeled N read the whole file first (1.1 GB of memory
    for 60 MB), and --sample all of its lines for the first 256."""
    monkeypatch.setattr(textfile, "STREAM_CHUNK_BYTES", 64)
    path = tmp_path / "big.txt"
    path.write_bytes(b"good film\n" * 100 + b"\xff not UTF-8\n")
    lines = iter_lines(path, "--unlabeled")
    assert [next(lines)[1] for _ in range(3)] == ["good film"] * 3
    with pytest.raises(BertkitError, match=r"--unlabeled .*big.txt: line 101 \(byte 0 of the line\): not valid UTF-8"):
        list(iter_lines(path, "--unlabeled"))


def test_the_bound_on_bytes_holds(tmp_path, monkeypatch):
    monkeypatch.setattr(textfile, "MAX_DATA_FILE_BYTES", 1000)
    path = tmp_path / "long.txt"
    path.write_bytes(b"x" * 2000)
    with pytest.raises(BertkitError, match="more than 1,000 bytes"):
        list(stream_lines(path, "--sample"))


def test_a_line_longer_than_any_text_is_refused_as_it_grows_not_rescanned(tmp_path, monkeypatch):
    """Each read re-joined the whole pending line: 15 s for a 32 MB line, about 15 minutes at the bound."""
    monkeypatch.setattr(textfile, "MAX_TEXT_CHARS", 1000)
    monkeypatch.setattr(textfile, "STREAM_CHUNK_BYTES", 100)
    path = tmp_path / "minified.json"
    path.write_bytes(b"ok\n" + b"x" * 5000)
    lines = stream_lines(path, "--input")
    assert next(lines) == "ok"
    with pytest.raises(BertkitError, match=r"--input .*minified.json: line 2 is over 4,000 bytes"):
        next(lines)
