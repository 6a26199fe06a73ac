"""The one exception type for errors a user can cause.

Bad files, bad flags, bad requests and bad checkpoints raise `BertkitError` with a message that
names the file/line/flag and says what to do. The CLI prints the message on one line and exits
non-zero without a traceback; the server turns it into a 4xx answer. Programming errors (bugs)
stay ordinary Python exceptions so they keep their traceback.

`ModelFault` is a model that computes NaN or infinite values (altered weights or kept scales): the server
answers 500 and is not ready, a command stops in one line; never a number that is not one.

`Interrupted` is how a command that was stopped by SIGINT/SIGTERM ends: it has saved what it could,
and the CLI prints its message with the command that continues the run and exits 130 (SIGINT) or 143
(SIGTERM), so `bertkit pretrain ... && bertkit finetune ...` stops too. It derives from
KeyboardInterrupt, so no `except Exception` on the way up can swallow it.
"""

from __future__ import annotations


class BertkitError(Exception):
    """A user-caused error: its message names the culprit (file, line, flag) and the fix."""


class ModelFault(Exception):
    """The model computed what cannot be given as an answer (NaN or infinite outputs): not the request's fault
    (a 500-class answer, a failed readiness), and never answered as numbers. Its message names the cause to check."""


class Interrupted(KeyboardInterrupt):
    """A command stopped by a signal, after saving. `resume_flag` continues it (e.g. '--resume auto')."""

    def __init__(self, message: str, signum: int, resume_flag: str | None = None) -> None:
        super().__init__(message)
        self.signum, self.resume_flag = signum, resume_flag

    @property
    def exit_code(self) -> int:
        """The shell's convention for death by signal: 128 + its number (SIGINT 130, SIGTERM 143)."""
        return 128 + self.signum


def where(path: object, line: int | None = None) -> str:
    """Format a location for error messages: 'file.txt' or 'file.txt:12'."""
    return f"{path}:{line}" if line is not None else f"{path}"
