"""SIGTERM and SIGINT during training: the loop finishes its step, saves and returns; a second request after a
grace window aborts.

Design decision: a signal only sets a flag (`StopSignal.requested`); the loop shares it with every process at
its next read of the step statistics, so all ranks stop after the same step and the checkpoint is whole.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import time
from typing import Any

from bertkit.errors import Interrupted

logger = logging.getLogger(__name__)

SIGNAL_WINDOW_S = 5.0
"""Signals this close to the first are the same request: under `srun torchrun` every process gets SIGTERM from
the scheduler and again from torchrun, milliseconds apart, and a Ctrl-C reaches every process of the group."""


class StopSignal:
    """SIGTERM/SIGINT set a flag; the loop finishes its step, saves and returns. The same request again within
    SIGNAL_WINDOW_S changes nothing; a later one aborts (a user who insists), leaving the newest checkpoint on
    disk as it was."""

    def __init__(self) -> None:
        self.requested = False
        self.signum: int | None = None
        self.first_at = 0.0
        self.previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested and time.monotonic() - self.first_at < SIGNAL_WINDOW_S:
            return  # the request already being served (a scheduler and torchrun both signal)
        if self.requested:
            signal.signal(signum, self.previous.get(signum, signal.SIG_DFL))
            raise Interrupted(f"stopped by a second {signal.Signals(signum).name} before the checkpoint of this "
                              "step was written; the newest checkpoint on disk is the one before", signum)
        self.requested, self.signum, self.first_at = True, signum, time.monotonic()
        logger.warning("received %s: finishing this step, saving a checkpoint, then stopping",
                       signal.Signals(signum).name)

    def __enter__(self) -> StopSignal:
        with contextlib.suppress(ValueError):  # not the main thread: leave signals alone
            for signum in (signal.SIGTERM, signal.SIGINT):
                self.previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)
