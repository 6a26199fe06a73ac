"""Reading a user's text file whole, with the one set of error messages every reader gives.

Design decision: the fine-tuning readers (GLUE/tables, CoNLL, SQuAD, SWAG) and feature extraction
read small files whole and strictly as UTF-8; a missing, unreadable or non-UTF-8 file is the user's
error, reported as `BertkitError` naming the file (and the flag, where one is given). The pre-training
corpus reader streams instead and has its own replace-and-count policy (`bertkit.data.corpus`).
"""

from __future__ import annotations

from pathlib import Path

from bertkit.errors import BertkitError


def read_text(path: str | Path, flag: str | None = None) -> str:
    """The whole file as a str; `flag` (e.g. "--input") is named in error messages."""
    path = Path(path)
    label = f"{flag} {path}" if flag else str(path)
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BertkitError(f"{label}: file not found") from None
    except IsADirectoryError:
        raise BertkitError(f"{label}: is a directory; give a file") from None
    except OSError as exc:
        raise BertkitError(f"{label}: cannot be read ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise BertkitError(f"{label}: not valid UTF-8 (byte {exc.start}); convert the file to UTF-8") from None
