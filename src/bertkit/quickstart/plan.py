"""The quickstart's time budget: how `--minutes` is split between pre-training and the fine-tunings.

Design decision: `--minutes` bounds the whole command, and the split is planned from numbers measured
on this machine, never assumed. The vocabulary and the data are built first and their time is simply
measured; then a few seconds of real training steps give this machine's pre-training steps/s,
fine-tuning steps/s and evaluation examples/s (bertkit.train.throughput), and `plan_time` - a pure
function of those numbers, tested with injected ones - gives fine-tuning what its recipe needs, with
fewer epochs (down to MIN_EPOCHS) and then fewer seeds (down to two, the fewest that show a spread)
when that would take more than FINETUNE_SHARE of the time, and gives pre-training all the rest: the
steps it gets are what decide whether pre-training pays (docs/quickstart.md). Epochs or seeds the user
set are kept as set. A budget too small for any pre-training is refused with the minutes it would need.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from bertkit.errors import BertkitError

FINETUNE_SHARE = 0.3
"""Most of the budget (after vocabulary and data) the fine-tunings get before they are made shorter."""
MIN_EPOCHS = 2
"""Fewest fine-tuning epochs a plan shortens to (random initialisation learns little in one)."""
MIN_SEEDS = 2
"""Fewest seeds a plan shortens to (one seed shows no spread)."""
REPORT_S = 8.0
"""Fill-mask, figures and report (measured 3-5 s on 2 cores)."""
RUN_OVERHEAD_S = 2.0
"""Per fine-tuning run: building the model and the features, saving the best model (measured ~1 s)."""
MIN_PRETRAIN_S = 20.0
"""Less pre-training than this is refused: it could not even warm up."""


@dataclass(frozen=True)
class Rates:
    """Throughputs measured on this machine just before planning."""

    pretrain_steps_per_s: float
    finetune_steps_per_s: float
    eval_examples_per_s: float


@dataclass(frozen=True)
class FinetuneWork:
    """What the fine-tunings must do: runs per seed (2 with the random-initialisation baseline), the
    training examples and batch size, and the examples evaluated per epoch (dev, plus test when dev
    improves: counted in full, to err on the long side)."""

    runs_per_seed: int
    train_examples: int
    batch_size: int
    eval_examples: int

    def seconds(self, epochs: float, seeds: int, rates: Rates) -> float:
        steps = math.ceil(self.train_examples / self.batch_size) * epochs
        per_run = (steps / rates.finetune_steps_per_s + epochs * self.eval_examples / rates.eval_examples_per_s
                   + RUN_OVERHEAD_S)
        return per_run * self.runs_per_seed * seeds


@dataclass(frozen=True)
class TimePlan:
    """The split of the budget, and the estimates behind it (all in seconds)."""

    total_s: float
    spent_s: float
    """Vocabulary and data, measured."""
    pretrain_s: float
    finetune_s: float
    """Estimated."""
    report_s: float
    finetune_epochs: float
    seeds: tuple[int, ...]
    rates: Rates
    shortened: str = ""
    """What the plan made shorter than the recipe, in words ('' when nothing)."""

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> TimePlan:
        return cls(**{**data, "seeds": tuple(data["seeds"]), "rates": Rates(**data["rates"])})

    def describe(self) -> str:
        return (f"{self.total_s / 60:g} min: vocabulary + data {self.spent_s:.0f} s (done), pre-training "
                f"{self.pretrain_s:.0f} s (~{self.pretrain_s * self.rates.pretrain_steps_per_s:,.0f} steps at "
                f"{self.rates.pretrain_steps_per_s:.2f} steps/s measured), fine-tuning ~{self.finetune_s:.0f} s "
                f"({self.finetune_epochs:g} epochs x {len(self.seeds)} seeds), report ~{self.report_s:.0f} s"
                + (f"; {self.shortened}" if self.shortened else ""))


def plan_time(total_s: float, spent_s: float, rates: Rates, work: FinetuneWork, epochs: float,
              seeds: tuple[int, ...], epochs_fixed: bool = False, seeds_fixed: bool = False) -> TimePlan:
    """Split `total_s` (of which `spent_s` are gone) between pre-training and fine-tuning (see module doc)."""
    available = total_s - spent_s - REPORT_S
    share = FINETUNE_SHARE * available
    planned_epochs, planned_seeds = epochs, seeds
    while (not epochs_fixed and planned_epochs > MIN_EPOCHS
           and work.seconds(planned_epochs, len(planned_seeds), rates) > share):
        planned_epochs = max(MIN_EPOCHS, planned_epochs - 1)
    while (not seeds_fixed and len(planned_seeds) > MIN_SEEDS
           and work.seconds(planned_epochs, len(planned_seeds), rates) > share):
        planned_seeds = planned_seeds[:-1]
    finetune_s = work.seconds(planned_epochs, len(planned_seeds), rates)
    pretrain_s = available - finetune_s
    if pretrain_s < MIN_PRETRAIN_S:
        needed = (total_s - pretrain_s + max(MIN_PRETRAIN_S, 300.0)) / 60
        raise BertkitError(f"--minutes {total_s / 60:g} is too short here: vocabulary and data took {spent_s:.0f} s "
                           f"and the fine-tunings need ~{finetune_s:.0f} s at this machine's measured speed, which "
                           f"leaves no time to pre-train; give --minutes {math.ceil(needed)} or more (or fewer "
                           "--seeds / --finetune-epochs / --train-examples)")
    changes = []
    if planned_epochs != epochs:
        changes.append(f"fine-tuning epochs {epochs:g} -> {planned_epochs:g}")
    if planned_seeds != seeds:
        changes.append(f"seeds {','.join(map(str, seeds))} -> {','.join(map(str, planned_seeds))}")
    shortened = (", ".join(changes) + " to leave pre-training most of the time") if changes else ""
    return TimePlan(total_s, spent_s, pretrain_s, finetune_s, REPORT_S, planned_epochs, planned_seeds, rates, shortened)
