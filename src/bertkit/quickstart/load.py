"""How far the quickstart's speed probe can be trusted on a machine other programs are using.

    fastest_rates(probe, rounds)        the probe run up to `rounds` times, each rate its fastest
    machine_load(cpu_s, wall_s, threads) -> Load   the load average and the CPU share the probe got

Design decision: the time plan (plan.py) is made from rates measured in a few seconds, and a busy machine
makes those seconds slow: measured under load (load average 4-6 on 2 cores; docs/quickstart.md) the probe planned
about 8x too long and refused `--minutes 2`, which then ran in 137 s on the idle machine. Three things
follow. The probe runs several times and each rate keeps its fastest round (the machine's capability,
not the moment's load); it stops early once two rounds agree within SETTLED, and starts no round after
PROBE_MAX_S (a busy machine's rounds are slow too; the probing time counts as spent in the plan). The
load is measured and said in the plan: the 1-minute load average against the cores this process may use,
and the share of its threads' wall time the probe actually got on a CPU (process CPU time / (wall time x
threads)). And
the measurement's uncertainty is a number the plan uses: on an idle machine rates still moved 1.4x
between days (3.2 vs 4.4 steps/s, docs/quickstart.md), so IDLE_UNCERTAINTY; on a busy one the probe can
be BUSY_UNCERTAINTY slow. Within that factor the plan never refuses: it warns and plans for the budget
(plan.plan_time).
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from bertkit.quickstart.plan import Rates

PROBE_ROUNDS = 3
"""Most times the probe runs."""
PROBE_MAX_S = 20.0
"""No probe round starts after this many seconds of probing (one round takes ~4 s on 2 idle cores, ~20 s at
load 3 on them)."""
SETTLED = 0.1
"""Two rounds whose every rate is within this fraction of the other's end the probing."""
IDLE_UNCERTAINTY = 1.5
"""How much faster than measured an idle machine may turn out (1.4x measured between two days)."""
BUSY_UNCERTAINTY = 8.0
"""How much faster than measured a busy machine may turn out (8x measured; docs/quickstart.md)."""
MIN_PROBE_S = 0.5
"""A probe shorter than this says nothing about the CPU share it got."""
BUSY_CPU_SHARE = 0.5
"""A probe that got less than this share of its threads' wall time on a CPU ran on a busy machine."""


@dataclass(frozen=True)
class Load:
    """The machine's load while the probe ran."""

    load_1min: float | None
    """os.getloadavg()'s 1-minute average (runnable threads, this process's included); None where unknown."""
    cores: int
    """CPUs this process may run on."""
    cpu_share: float | None
    """Process CPU time / (wall time x torch threads) over the probe; None when not measured."""

    @property
    def busy(self) -> bool:
        crowded = self.load_1min is not None and self.load_1min > self.cores
        starved = self.cpu_share is not None and self.cpu_share < BUSY_CPU_SHARE
        return crowded or starved

    @property
    def uncertainty(self) -> float:
        """How much faster than measured the machine may be: the factor the measurement cannot rule out."""
        return BUSY_UNCERTAINTY if self.busy else IDLE_UNCERTAINTY

    def describe(self) -> str:
        average = "load average unknown" if self.load_1min is None else f"load average {self.load_1min:.1f}"
        share = "" if self.cpu_share is None else f", the probe got {self.cpu_share:.0%} of its threads' time"
        state = "busy" if self.busy else "idle"
        return f"{state}: {average} on {self.cores} cores{share}"


def machine_load(cpu_s: float | None, wall_s: float | None, threads: int) -> Load:
    """The Load of this machine now, with the probe's CPU share from its CPU and wall seconds."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:
        average: float | None = os.getloadavg()[0]
    except (AttributeError, OSError):  # not on every platform
        average = None
    share = None
    if cpu_s is not None and wall_s is not None and wall_s >= MIN_PROBE_S:
        share = cpu_s / (wall_s * min(threads, cores))
    return Load(average, cores, share)


def fastest_rates(probe: Callable[[], Rates], rounds: int = PROBE_ROUNDS, max_s: float = PROBE_MAX_S) -> Rates:
    """Each rate's fastest of up to `rounds` calls of `probe`, stopping once two calls agree (SETTLED) and
    starting no call after `max_s` seconds."""
    started = time.perf_counter()
    best = probe()
    for _ in range(rounds - 1):
        if time.perf_counter() - started > max_s:
            break
        rates = probe()
        pairs = list(zip(dataclasses.astuple(best), dataclasses.astuple(rates)))
        best = Rates(*(max(a, b) for a, b in pairs))
        if all(abs(a - b) <= SETTLED * max(a, b) for a, b in pairs):
            break
    return best
