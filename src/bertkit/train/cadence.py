"""When the training loop stops, reads, logs, evaluates and saves: the budget and the cadence, as the loop's
settings and counters decide them (`bertkit.train.loop.fit` holds one of each).

Design decision: both are plain functions of the step, the elapsed time the last read brought back and the
settings, so every process of a run decides the same (the elapsed time is rank 0's, shared at each read).
"""

from __future__ import annotations

import math

import torch

from bertkit.errors import BertkitError
from bertkit.settings import TrainConfig
from bertkit.train.resume import Counters

NO_BUDGET = "no training budget: give --max-steps, --max-time or --epochs"


class Budget:
    """Total steps / time and the warmup fraction; gives the schedule its progress in [0, 1]."""

    def __init__(self, config: TrainConfig, steps_per_epoch: int, counters: Counters) -> None:
        if config.max_steps is None and config.max_time_s is None and config.num_epochs is None:
            raise BertkitError(NO_BUDGET)
        self.max_steps = config.max_steps
        if config.num_epochs is not None:
            epoch_steps = max(1, math.ceil(config.num_epochs * steps_per_epoch))
            self.max_steps = min(self.max_steps or epoch_steps, epoch_steps)
        self.max_time_s, self.counters = config.max_time_s, counters
        if self.max_steps is not None:
            warmup_steps = (config.warmup_steps if config.warmup_steps is not None
                            else round((config.warmup_ratio or 0.0) * self.max_steps))
            if warmup_steps > self.max_steps:
                raise BertkitError(f"--warmup-steps {warmup_steps} is longer than the run "
                                   f"({self.max_steps} steps); lower it")
            self.warmup = warmup_steps / self.max_steps
        elif config.warmup_steps is not None:
            raise BertkitError("--warmup-steps needs a step budget; under --max-time alone use "
                               "--warmup-ratio (a fraction of the time)")
        else:
            self.warmup = config.warmup_ratio or 0.0

    def progress(self, step: int) -> float:
        # Under a time budget the elapsed time is rank 0's, shared every step, so all ranks agree.
        by_steps = step / self.max_steps if self.max_steps else 0.0
        by_time = self.counters.elapsed_s / self.max_time_s if self.max_time_s else 0.0
        return min(1.0, max(by_steps, by_time))

    def done(self, step: int) -> bool:
        return self.progress(step) >= 1.0

    def steps_done(self, step: int) -> bool:
        """Whether the step budget alone is spent (known on the host without reading the device)."""
        return self.max_steps is not None and step >= self.max_steps


class Cadence:
    """When the loop refreshes the progress bar, reads the steps' statistics back to the host, evaluates and
    saves: every N steps, and at the end of every epoch as the data source marks it (the step that consumed the
    epoch's last global batch), so a run resumed with another number of processes, whose epochs may have one
    step more or fewer, still evaluates where each epoch ends."""

    def __init__(self, config: TrainConfig, steps_per_epoch: int, counters: Counters,
                 device: torch.device | None = None) -> None:
        self.config, self.steps_per_epoch, self.counters = config, steps_per_epoch, counters
        shortest = min(config.eval_every or steps_per_epoch, steps_per_epoch)
        self.log_every = config.log_every or max(1, shortest // 10)
        on_gpu = device is not None and device.type == "cuda"
        self.read_every = config.read_every or (self.log_every if on_gpu else 1)
        """Steps between reads of the statistics (--read-every; unset: every log step on a GPU, where each read
        waits for the device, and every step on a CPU, where a read costs nothing)."""

    def reads(self, step: int) -> bool:
        return step % self.read_every == 0

    def evaluates(self, step: int, ends_epoch: bool) -> bool:
        every, epochs = self.config.eval_every, self.config.eval_every_epoch
        return bool(every and step % every == 0) or (epochs and ends_epoch)

    def saves(self, step: int) -> bool:
        every, on_eval = self.config.save_every, self.config.save_on_eval
        return bool(every and step % every == 0) or (on_eval and self.counters.last_eval_step == step)
