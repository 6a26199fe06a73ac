"""Reading a whole file with a bound: a user's path may be a stream (/dev/zero, a FIFO), a decompression bomb or
just far larger than what it should hold, and reading it whole would take the machine's memory before any check.

    read_bounded(path, limit, what) -> bytes     at most `limit` bytes (decompressed: .gz, .zst), else BertkitError
    file_present(path) -> bool                  whether a file bertkit reads beside a model or in a run is there

Design decision: the bound is checked on the bytes as read, before any decoding, with one extra byte to tell a
file of exactly `limit` bytes from a longer one; the error names the file, the bound and what the file should be.
Each caller's bound is a named constant next to the reader (docs/robustness.md lists them all).
"""

from __future__ import annotations

import os
import stat
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


def file_present(path: str | Path) -> bool:
    """Whether the file `path` (one bertkit reads beside a model or keeps in a run: config.json, vocab.txt,
    tokenizer_config.json, modules.json, weights, run records) is there. False when nothing is; True for a
    regular file or a link to one; a BertkitError naming it when something else is: a directory, a device, a
    FIFO, a socket or a link to nothing. Neither is the file nor its absence: read, a FIFO waits forever and a
    device streams; taken for absent, a model would load without that file's settings, or a run resume unchecked."""
    path = Path(path)
    try:
        mode = path.stat().st_mode
    except (FileNotFoundError, NotADirectoryError):
        if os.path.lexists(path):
            raise BertkitError(f"{path}: a link to {os.readlink(path)}, which does not exist; put the file there "
                               "or remove the link") from None
        return False
    except OSError as exc:
        raise BertkitError(f"{path}: cannot be read ({exc.strerror}); check its permissions") from None
    if stat.S_ISREG(mode):
        return True
    kind = ("a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else
            "a socket" if stat.S_ISSOCK(mode) else "a device")
    raise BertkitError(f"{path}: {kind}, not a file; put the file bertkit wrote (or the model's own) there, or "
                       "remove it")
