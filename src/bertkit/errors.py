"""The one exception type for errors a user can cause.

Bad files, bad flags, bad requests and bad checkpoints raise `BertkitError` with a message that
names the file/line/flag and says what to do. The CLI prints the message on one line and exits
non-zero without a traceback; the server turns it into a 4xx answer. Programming errors (bugs)
stay ordinary Python exceptions so they keep their traceback.
"""

from __future__ import annotations


class BertkitError(Exception):
    """A user-caused error: its message names the culprit (file, line, flag) and the fix."""


def where(path: object, line: int | None = None) -> str:
    """Format a location for error messages: 'file.txt' or 'file.txt:12'."""
    return f"{path}:{line}" if line is not None else f"{path}"
