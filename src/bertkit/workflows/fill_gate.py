"""The fill gate of CPU training attention, measured on the run's own step: the least share of real tokens at which a
training batch runs bmm attention over the padded batch rather than SDPA over each sequence's real tokens.

    measured_gate(model, precision, rows, length) -> FillGate | None

Why measured: `BatchedBmm` (bertkit.model.attention) runs every layer on the padded batch, so the padding costs the
dense layers what bmm saves in attention, and where the two break even depends on the machine, the width, the
length and the precision. The attention probe (bertkit.runtime.probe) times attention alone, on two rows one a
quarter padding; the gate without this measurement is that probe's least fill (`attention.MIN_BMM_FILL`, 87.5%). On
the 2-core AMD EPYC a corpus of short documents (75% of its positions real) ran bmm 1.06-1.17x faster than SDPA at
bert-mini's 16 x 64, where the fixed gate sent 94% of its batches to SDPA (docs/performance.md).

How: a copy of the run's encoder cut to its first layers (`step_probe.cut_encoder`), at the run's micro-batch rows x
length, forward + backward in the run's precision, its attention dispatch's gate set to 0 (bmm at every fill) and
above 1 (SDPA at every fill), on batches with FILLS real tokens (87.5% down to 50% in sixteenths; the first row
full, as a batch padded to its longest row is, the others alike), both sides alternating over 3-6 rounds (more while
the two fastest of a side differ by more than 10%), each side's fastest round counting. Measured from the fullest
fill down, stopping at the first fill where bmm was not MIN_WIN (3%) faster, or once the measurement passed
MAX_SECONDS (bert-base's steps are long): the gate is the least fill at which bmm won there and at every fuller one;
1.0 (full batches only) when it lost at the fullest. The cut copy runs every position of its last layer and no
gradient checkpointing, so where the run does either, padding costs it a little less than measured. Cached with the
step probe's timings (keyed by the machine, versions, threads, shape, precision and the kernels); an unsteady
measurement (a busy machine) serves its run and is not cached; one that fails is a warning, and the fixed gate
stands. Nothing is measured - the fixed gate stands - with BERTKIT_PROBE_FILE set (fixed choices: the test suite,
identical machines), BERTKIT_CPU_KERNELS=0, on a GPU, for one-row batches, for a frozen encoder (its batches never
run training's kernels), for encoders of different shapes in one model, or where the probe chose SDPA at the run's
length and precision anyway. The gate is measured at the run's length and applies to every batch of the run (most
are that long). """

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bertkit.model.accelerate import cpu_kernels_enabled
from bertkit.model.attention import Dispatch
from bertkit.model.bert import BertModel
from bertkit.runtime import probe, step_probe

log = logging.getLogger(__name__)

FILL_GATE_VERSION = 1
FILLS = (0.875, 0.8125, 0.75, 0.6875, 0.625, 0.5625, 0.5)
"""The fills timed, fullest first: the fixed gate's, then down to half the batch padding in sixteenths (on the 2-core
AMD EPYC at bert-mini's 16 x 64, bmm won by 16-19% at 75% and tied at 62.5%: a coarser grid loses what lies between)."""
MIN_WIN = 1.03
"""bmm wins at a fill when SDPA's step takes at least this times bmm's: near the break-even the two tie, and a margin
keeps noise from moving the gate between measurements (and a resume from listing a change that is none)."""
MAX_SECONDS = 5.0
"""After a fill whose timings took the measurement past this, the lower fills are not timed (a wide model's steps
are long): the gate is then the least fill timed that bmm won."""
ROUNDS, MAX_ROUNDS = 3, 6
"""Timed rounds of each side at a fill: at least ROUNDS, more (up to MAX_ROUNDS) until each side's two fastest agree
within 10%."""


@dataclass(frozen=True)
class FillGate:
    """The timings of one measurement: per fill, (SDPA seconds, bmm seconds) of the cut encoder's step."""

    rows: int
    length: int
    precision: str
    seconds: dict[float, tuple[float, float]]
    steady: bool

    @property
    def gate(self) -> float:
        """The least measured fill at which bmm was at least MIN_WIN faster there and at every fuller one; 1.0 if at
        none."""
        gate = 1.0
        for fill in sorted(self.seconds, reverse=True):
            if not _bmm_wins(*self.seconds[fill]):
                break
            gate = fill
        return gate

    def describe(self) -> str:
        times = "; ".join(f"{fill:.1%} real: SDPA {1e3 * sdpa:.1f} ms, bmm {1e3 * bmm:.1f} ms"
                          for fill, (sdpa, bmm) in sorted(self.seconds.items(), reverse=True))
        return (f"bmm attention on batches at least {self.gate:.1%} real tokens ({self.precision} step of the first "
                f"layers at {self.rows} x {self.length}: {times})")


def measured_gate(model: nn.Module, precision: str, rows: int | None, length: int | None) -> FillGate | None:
    """The gate measured for `model`'s training step (from the cache when it was measured before), or None where
    nothing is measured (module docstring). `model`'s encoders are left as they were."""
    encoders = [m for m in model.modules() if isinstance(m, BertModel)]
    encoder = encoders[0] if encoders else None
    dispatch = getattr(encoder, "attention", None)
    if encoder is None or not isinstance(dispatch, Dispatch) or dispatch.cpu is None:
        return None
    choices = dispatch.cpu
    if _fixed_choices() or not cpu_kernels_enabled() or precision not in probe.DTYPES:
        return None
    if encoder.embeddings.word.weight.device.type != "cpu" or any(e.config != encoder.config for e in encoders):
        return None  # (encoders of other shapes would each need their own gate: they keep the fixed one)
    if not any(p.requires_grad for p in encoder.embeddings.parameters()):
        return None  # a frozen encoder's batches never run training's kernels (bertkit.model.attention.Dispatch)
    rows, length = step_probe.probe_shape(encoder.config, rows, length)
    dropout = encoder.config.attention_probs_dropout_prob > 0.0
    if rows < 2 or not choices.bmm_for_training(probe.DTYPES[precision], length, dropout):
        return None
    key = {**step_probe.cache_key(encoder.config, "fill-gate", rows, length), "precision": precision,
           "kernels": step_probe.kernel_key(encoder), "fill_gate": FILL_GATE_VERSION, "fills": list(FILLS)}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    if digest in _measured:  # a second model of the same run (the planner's, then the run's; fine-tuning's seeds)
        return _measured[digest]
    path = probe.cache_dir() / f"fill-{digest}.json"
    measured, source = _read(path, key), f"cached in {path}"
    if measured is None:
        try:
            measured, source = measure(encoder, dispatch, precision, rows, length), "measured now"
        except Exception as exc:  # noqa: BLE001  # a measurement must not stop the run it serves (nor hang its ranks)
            log.warning("the fill gate could not be measured (%s: %s); the fixed gate stands", type(exc).__name__, exc)
            return None
        if measured.steady:
            _write(path, key, measured)
        else:
            source = "measured now, unsteady (a busy machine?): not cached"
    log.info("fill gate for training attention on this CPU: %s [%s]", measured.describe(), source)
    _measured[digest] = measured
    return measured


_measured: dict[str, FillGate] = {}


def _fixed_choices() -> bool:
    """Whether the machine's choices are fixed (BERTKIT_PROBE_FILE): then nothing is measured."""
    return bool(os.environ.get("BERTKIT_PROBE_FILE"))


def measure(encoder: BertModel, dispatch: Dispatch, precision: str, rows: int, length: int) -> FillGate:
    """Time the cut encoder's step with bmm and with SDPA at each fill, fullest first, until bmm is not faster."""
    cut = step_probe.cut_encoder(encoder, step_probe.probe_layers(encoder.config))
    seconds: dict[float, tuple[float, float]] = {}
    steady = True
    cpu = probe.CpuShare(torch.get_num_threads())
    started_all = time.perf_counter()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        ids = torch.randint(0, encoder.config.vocab_size, (rows, length))
        for fill in FILLS:
            mask = _mask(rows, length, fill)
            steps = {gate: _step(cut, Dispatch(dispatch.cpu, gate), ids, mask, precision) for gate in (2.0, 0.0)}
            samples: dict[float, list[float]] = {gate: [] for gate in steps}
            for step in steps.values():
                step()  # warm-up
            for rounds in range(1, MAX_ROUNDS + 1):
                for gate, step in steps.items():
                    started = time.perf_counter()
                    step()
                    samples[gate].append(time.perf_counter() - started)
                if rounds >= ROUNDS and all(map(_steady, samples.values())):
                    break
            steady = steady and all(map(_steady, samples.values()))
            seconds[fill] = (min(samples[2.0]), min(samples[0.0]))
            if not _bmm_wins(*seconds[fill]) or time.perf_counter() - started_all > MAX_SECONDS:
                break
    return FillGate(rows, length, precision, seconds, steady and not cpu.busy())


def _bmm_wins(sdpa: float, bmm: float) -> bool:
    return sdpa >= MIN_WIN * bmm


def _steady(times: list[float]) -> bool:
    """Whether the two fastest rounds agree within 10%, as they do at once on an idle machine."""
    first, second = sorted(times)[:2]
    return second <= 1.1 * first


def _mask(rows: int, length: int, fill: float) -> torch.Tensor:
    """(rows, length) attention mask with about `fill` of its positions real: the first row full, the others
    alike (each at least one token)."""
    others = max(1, round((fill * rows * length - length) / (rows - 1)))
    lengths = torch.tensor([length] + [min(length, others)] * (rows - 1))
    return (torch.arange(length) < lengths[:, None]).long()


def _step(cut: Any, attention: Dispatch, ids: torch.Tensor, mask: torch.Tensor,
          precision: str) -> Callable[[], None]:
    def train_step() -> None:
        cut.train()
        cut.attention = attention
        with torch.enable_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            hidden = cut(ids, None, mask).last_hidden_state
        hidden.float().square().mean().backward()
        cut.zero_grad(set_to_none=True)
    return train_step


def _read(path: Path, key: dict) -> FillGate | None:
    def parse(data: dict) -> FillGate:
        seconds = {float(fill): (float(sdpa), float(bmm)) for fill, (sdpa, bmm) in data["seconds"].items()}
        return FillGate(int(data["rows"]), int(data["length"]), str(data["precision"]), seconds, True)
    return step_probe.read_cached(path, key, parse, "fill-gate")


def _write(path: Path, key: dict, measured: FillGate) -> None:
    record = {"key": key, "rows": measured.rows, "length": measured.length, "precision": measured.precision,
              "seconds": {str(fill): list(times) for fill, times in measured.seconds.items()}}
    step_probe.write_cached(path, record, "fill-gate")
