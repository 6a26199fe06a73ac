"""The quickstart's time budget: how `--minutes` is split between pre-training and the fine-tunings.

Design decision: `--minutes` bounds the whole command, and the split is planned from numbers measured
on this machine, never assumed. The vocabulary and the data are built first and their time is simply
measured; then a few seconds of real training steps give this machine's pre-training steps/s,
fine-tuning steps/s and evaluation examples/s (bertkit.train.throughput), and `plan_time` - a pure
function of those numbers, tested with injected ones - gives fine-tuning what its recipe needs, with
fewer epochs (down to MIN_EPOCHS) and then fewer seeds (down to two, the fewest that show a spread)
when that would take more than FINETUNE_SHARE of the time, and gives pre-training all the rest: the
steps it gets are what decide whether pre-training pays (docs/quickstart.md). Epochs or seeds the user
set are kept as set. A budget too small for any pre-training at the measured rates is planned anyway when
a machine up to `uncertainty` times faster than measured would fit it (the factor the measurement cannot
rule out, quickstart/load.py: a busy machine's probe runs slow): the plan then assumes the smallest such
speed-up and says so in `warning`. Beyond that factor the budget is refused with the minutes it would need.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import asdict, dataclass
from typing import Any

from bertkit.errors import BertkitError
from bertkit.io.jsonfile import finite_number

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
    """Set-up, vocabulary, data and the speed probe, measured."""
    pretrain_s: float
    finetune_s: float
    """Estimated."""
    report_s: float
    finetune_epochs: float
    seeds: tuple[int, ...]
    rates: Rates
    shortened: str = ""
    """What the plan made shorter than the recipe, in words ('' when nothing)."""
    speedup: float = 1.0
    """The plan's rates are the measured ones times this (> 1 only when the measured ones left no time to
    pre-train and the measurement's uncertainty allows it)."""
    load: str = ""
    """The machine's load while the rates were measured, in words (quickstart/load.py)."""
    warning: str = ""
    """Why the command may take longer than the budget ('' when the plan fits the measured rates)."""
    probe_s: float = 0.0
    """Of spent_s, the speed probe the rates come from."""

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> TimePlan:
        """The plan plan.json keeps; a BertkitError when it is not one `to_json` wrote (a field missing, unknown or
        of another type, a number not finite or negative, a rate not positive), so no edit is planned with."""
        try:
            rates = Rates(**{name: _number(value, name, positive=True) for name, value in data["rates"].items()})
            seeds = tuple(data["seeds"])
            if not all(isinstance(seed, int) and not isinstance(seed, bool) for seed in seeds):
                raise TypeError(f"seeds {seeds!r}")
            kinds = {field.name: field.type for field in dataclasses.fields(cls)}
            values: dict[str, Any] = {
                name: value if kinds[name] == "str" and isinstance(value, str) else _number(value, name)
                for name, value in data.items() if name not in ("rates", "seeds")}
            return cls(**values, seeds=seeds, rates=rates)
        except (KeyError, TypeError, AttributeError) as exc:
            raise BertkitError(f"not a time plan bertkit writes ({type(exc).__name__}: {exc})") from None

    def describe(self) -> str:
        rate = self.rates.pretrain_steps_per_s
        assumed = f", planned at {self.speedup:.1f}x that" if self.speedup > 1 else ""
        return (f"{self.total_s / 60:g} min: set-up, vocabulary and data {self.spent_s - self.probe_s:.0f} s and the "
                f"speed probe {self.probe_s:.0f} s (done), pre-training "
                f"{self.pretrain_s:.0f} s (up to ~{self.pretrain_s * rate * self.speedup:,.0f} steps at the "
                f"{rate:.2f} steps/s measured on one batch{assumed}; evaluations and the data's varying shapes take "
                f"part of it), fine-tuning ~{self.finetune_s:.0f} s "
                f"({self.finetune_epochs:g} epochs x {len(self.seeds)} seeds), report ~{self.report_s:.0f} s"
                + (f"; {self.shortened}" if self.shortened else "") + (f"; machine {self.load}" if self.load else ""))


def _number(value: Any, name: str, positive: bool = False) -> float:
    """`value` as a finite number >= 0 (> 0 when `positive`); TypeError naming the field otherwise."""
    if not finite_number(value, 0) or (positive and value == 0):
        raise TypeError(f"{name} is {value!r}")
    return value


def plan_time(total_s: float, spent_s: float, rates: Rates, work: FinetuneWork, epochs: float,
              seeds: tuple[int, ...], epochs_fixed: bool = False, seeds_fixed: bool = False,
              uncertainty: float = 1.0, load: str = "", probe_s: float = 0.0) -> TimePlan:
    """Split `total_s` (of which `spent_s` are gone, `probe_s` of them measuring `rates`) between pre-training
    and fine-tuning (see module doc); `uncertainty` is how much faster than `rates` the machine may be, `load`
    its load in words."""
    speedup = 1.0
    while True:
        plan = _split(total_s, spent_s, rates, speedup, work, epochs, seeds, epochs_fixed, seeds_fixed, load)
        if plan.pretrain_s >= MIN_PRETRAIN_S:
            break
        if speedup >= uncertainty:
            at_measured = _split(total_s, spent_s, rates, 1.0, work, epochs, seeds, epochs_fixed, seeds_fixed, load)
            needed = (total_s - at_measured.pretrain_s + max(MIN_PRETRAIN_S, 300.0)) / 60
            machine = f" (machine {load})" if load else ""
            raise BertkitError(
                f"--minutes {total_s / 60:g} is too short here: vocabulary and data took {spent_s:.0f} s and the "
                f"fine-tunings need ~{at_measured.finetune_s:.0f} s at this machine's measured speed{machine}, "
                f"which leaves no time to pre-train even if the machine is {uncertainty:g}x faster than measured; "
                f"give --minutes {math.ceil(needed)} or more (or fewer --seeds / --finetune-epochs / "
                "--train-examples, or --max-steps for a step budget)")
        speedup = min(uncertainty, speedup * SPEEDUP_STEP)
    if speedup > 1:
        slow_finetune_s = work.seconds(plan.finetune_epochs, len(plan.seeds), rates)
        slow_s = spent_s + plan.pretrain_s + slow_finetune_s + REPORT_S
        plan = dataclasses.replace(plan, warning=(
            f"at the speed measured now the fine-tunings alone need ~{slow_finetune_s:.0f} s, which "
            f"leaves no time to pre-train in --minutes {total_s / 60:g}; the machine is {load or 'measured'}, so "
            f"the measurement may be up to {uncertainty:g}x slow: planned for the budget assuming "
            f"{speedup:.1f}x the measured speed; if the machine stays this slow, the command takes ~"
            f"{slow_s / 60:.1f} min"))
    return dataclasses.replace(plan, probe_s=probe_s)


SPEEDUP_STEP = 1.25
"""Each try at a plan that fits assumes the machine this much faster than the last (up to the uncertainty)."""


def _split(total_s: float, spent_s: float, measured: Rates, speedup: float, work: FinetuneWork, epochs: float,
           seeds: tuple[int, ...], epochs_fixed: bool, seeds_fixed: bool, load: str) -> TimePlan:
    """The plan at `speedup` times the measured rates (pretrain_s may be short: plan_time checks)."""
    rates = Rates(*(rate * speedup for rate in dataclasses.astuple(measured)))
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
    changes = []
    if planned_epochs != epochs:
        changes.append(f"fine-tuning epochs {epochs:g} -> {planned_epochs:g}")
    if planned_seeds != seeds:
        changes.append(f"seeds {','.join(map(str, seeds))} -> {','.join(map(str, planned_seeds))}")
    shortened = (", ".join(changes) + " to leave pre-training most of the time") if changes else ""
    return TimePlan(total_s, spent_s, available - finetune_s, finetune_s, REPORT_S, planned_epochs, planned_seeds,
                    measured, shortened, speedup, load)
