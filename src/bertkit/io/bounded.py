"""Reading a whole file with a bound: a user's path may be a stream (/dev/zero, a FIFO), a decompression bomb or
just far larger than what it should hold, and reading it whole would take the machine's memory before any check.

    read_bounded(path, limit, what) -> bytes     at most `limit` bytes (decompressed: .gz, .zst), else BertkitError

Design decision: the bound is checked on the bytes as read, before any decoding, with one extra byte to tell a
file of exactly `limit` bytes from a longer one; the error names the file, the bound and what the file should be.
Each caller's bound is a named constant next to the reader (docs/robustness.md lists them all).
"""

from __future__ import annotations

from pathlib import Path

from bertkit.errors import BertkitError


def read_bounded(path: str | Path, limit: int, what: str, decompress: bool = True) -> bytes:
    """The bytes of `path` (decompressed when its name ends in .gz or .zst and `decompress`), at most `limit` of
    them; a longer file is a BertkitError naming it and `what` it should be. OSError and decompression errors
    propagate for the caller to name."""
    path = Path(path)
    if decompress and path.suffix in (".gz", ".zst"):  # textlines.COMPRESSION_SUFFIXES
        from bertkit.io.textlines import open_decompressed  # here: textlines reads tables, whose JSON reads use this

        with open_decompressed(path) as stream:
            data = stream.read(limit + 1)
    else:
        with open(path, "rb") as handle:
            data = handle.read(limit + 1)
    if len(data) > limit:
        raise BertkitError(f"{path}: more than {limit:,} bytes, the most bertkit reads of {what}; is it the right file "
                           "(not a stream, a device or another file)?")
    return data

