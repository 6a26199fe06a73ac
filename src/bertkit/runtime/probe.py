"""What runs fastest on this machine, measured: the choices behind `--precision auto` and the CPU
kernels, and the description of the machine that `bertkit doctor` and the benchmarks print.

Design decision: speed choices are measured on the machine that runs, never inferred from CPU flags. The same
2-core VM type has been an AMD EPYC where bf16 matrix multiplies are ~4.7x fp32 and an Intel Xeon with avx512_bf16
but no AMX where they are ~0.6x. The first time a machine meets a model width, a probe (about three seconds at
bert-mini's width, six at bert-base's, on one thread) times, at that width, a dense layer's forward + backward in
fp32 and under bf16 autocast (training), its inference forward by `F.linear` and by oneDNN with a packed weight in
fp32 and bf16 and with dynamic int8, attention by SDPA and by batched matrix multiplies at a few lengths, for
inference (forward) and for training (forward + backward, padded rows, without and with attention dropout), and
dropout by torch and by a counter-based mask (`bertkit.kernels.dropout`). The numbers are cached per machine (CPU
model, cores, torch threads, torch / oneDNN / bertkit versions, probe version) in the user's cache directory; a
corrupt or stale file is ignored and rewritten. `decide` turns numbers into choices and is a pure function, so its
rules are tested with injected timings: bf16 only when it is at least 1.2x fp32; a kernel fast path only where it
measured at least 1.1x faster. CUDA is not probed: bf16 where the GPU supports it.

It sits below the model (the model and training read its choices), so it imports only torch and bertkit's lowest
packages (kernels, io, config): the probe times the kernels itself (the same calls bertkit.model.accelerate makes;
tests/runtime/test_probe.py checks they agree).

Environment: BERTKIT_CACHE_DIR (default $XDG_CACHE_HOME/bertkit, else ~/.cache/bertkit);
BERTKIT_PROBE_FILE=path takes the measurements from that file (`bertkit doctor --json` writes one)
instead of measuring, for every width: identical machines, or fixed choices (the test suite does).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import math
import os
import platform
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from bertkit import __version__
from bertkit.errors import BertkitError
from bertkit.io.atomic import write_text_atomic
from bertkit.io.jsonfile import read_json_object
from bertkit.kernels import int8
from bertkit.runtime.attention_probe import (
    ATTENTION_LENGTHS,
    DROPOUT_P,
    DTYPES,
    attention_times,
    attention_training_times,
    dropout_times,
)

log = logging.getLogger(__name__)

PROBE_VERSION = 6  # bumped when what the probe measures changes: older cache files are then stale
BF16_MIN_SPEEDUP = 1.2  # bf16 is chosen only when clearly faster than fp32
FAST_PATH_MIN_SPEEDUP = 1.1  # a kernel fast path too: near-ties stay on PyTorch's default, stable across probes
DEFAULT_WIDTH = 768  # bert-base: the width probed when no model is given
PROBE_TOKENS = 128  # rows of the probe's dense layer; tokens of attention at each length
MIN_ROUNDS, MAX_ROUNDS, EXTRA_ROUNDS_S = 3, 10, 0.2  # timed runs of each candidate; time for more when busy
FLOAT_PRECISIONS = ("fp32", "bf16")
FLAGS_OF_INTEREST = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "avx_vnni",
                     "amx_tile", "amx_bf16", "amx_int8", "asimd", "bf16", "i8mm", "sve", "sve2")


# --- the machine ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Machine:
    """This machine as bertkit sees it: what the cache is keyed by (`cache_key`), and what every benchmark
    and `bertkit doctor` print first."""

    cpu: str
    cores: int
    threads: int
    flags: tuple[str, ...]
    torch: str
    onednn: str
    bertkit: str
    cuda: str | None

    def line(self) -> str:
        flags = " ".join(self.flags) or "none of interest"
        gpu = f"; CUDA {self.cuda}" if self.cuda else ""
        return (f"{self.cpu}, {self.cores} cores, {self.threads} torch threads, flags: {flags}; torch {self.torch}, "
                f"oneDNN {self.onednn}, bertkit {self.bertkit}{gpu}")


@functools.cache
def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo (empty where there is none, e.g. macOS)."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return {}
    fields: dict[str, str] = {}
    for line in text.splitlines():
        name, _, value = line.partition(":")
        fields.setdefault(name.strip(), value.strip())
    return fields


def machine() -> Machine:
    info = _cpuinfo()
    present = set((info.get("flags") or info.get("Features") or "").split())
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    onednn = re.search(r"MKL-DNN v([\w.]+)", torch.__config__.show())
    cuda = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return Machine(cpu=info.get("model name") or platform.processor() or platform.machine(), cores=cores,
                   threads=torch.get_num_threads(), flags=tuple(f for f in FLAGS_OF_INTEREST if f in present),
                   torch=torch.__version__, onednn=onednn.group(1) if onednn else "none", bertkit=__version__,
                   cuda=cuda)


# --- what the probe measures, and what follows from it ----------------------------------------------

@dataclass(frozen=True)
class Measurements:
    """The probe's numbers at one model width on one CPU thread. Rates are GFLOP/s of a (tokens, W) x
    (W, 4W) dense layer; 0 means the kernel does not run here."""

    width: int
    train: dict[str, float]
    """precision -> forward + backward (3 products), fp32 or under bf16 autocast."""
    linear: dict[str, float]
    """precision -> inference forward by F.linear, then GELU."""
    packed: dict[str, float]
    """precision -> inference forward by oneDNN with a packed weight and GELU fused."""
    int8: float
    """Inference forward by oneDNN's int8 kernel (`Int8Linear`: activations quantized per call), GELU fused."""
    attention: dict[str, list[tuple[int, float, float]]]
    """precision -> [(length, SDPA microseconds, bmm microseconds)]: W/64 heads of 64, PROBE_TOKENS tokens
    of sequences of that length, one call each."""
    seconds: float
    """How long the probe took."""
    attention_training: dict[str, list[tuple[int, float, float]]] = dataclasses.field(default_factory=dict)
    """precision -> [(length, SDPA microseconds, bmm microseconds)] of forward + backward, as training runs them:
    SDPA one call per sequence on its real tokens (`PerSequence`), bmm once over the padded rows with their key
    mask (`BatchedBmm`); at least two sequences of that length, one of them a quarter padding. Empty in a
    probe file written before it was measured: training then keeps SDPA."""
    attention_training_dropout: dict[str, list[tuple[int, float, float]]] = dataclasses.field(default_factory=dict)
    """The same with attention dropout DROPOUT_P: SDPA's own, bmm's counter-based (`kernels.dropout`)."""
    dropout: dict[str, tuple[float, float]] = dataclasses.field(default_factory=dict)
    """precision -> (F.dropout, counter-based dropout) microseconds, forward + backward at DROPOUT_P over a micro-
    batch's hidden states (`attention_probe.dropout_times`). Empty in an older probe file: torch's dropout runs."""
    steady: bool = True
    """Every candidate's two fastest runs agreed within 10%. An unsteady probe (a machine too busy to time:
    one seen measured bf16 at a seventh of its idle rate) serves the run that made it and is not cached."""

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> Measurements:
        """Checked: ValueError/TypeError/KeyError on anything but the shape `to_json` writes (rates positive and
        finite: a zero rate would divide the choices by zero)."""
        rates = {key: {p: _rate(data[key][p], positive=True) for p in FLOAT_PRECISIONS}
                 for key in ("train", "linear", "packed")}
        attention = {p: [(_count(n), _rate(s), _rate(b)) for n, s, b in data["attention"][p]] for p in FLOAT_PRECISIONS}
        trained, dropped = data.get("attention_training", {}), data.get("attention_training_dropout", {})
        attention_training = {p: [(_count(n), _rate(s), _rate(b)) for n, s, b in trained[p]]
                              for p in FLOAT_PRECISIONS if p in trained}
        with_dropout = {p: [(_count(n), _rate(s), _rate(b)) for n, s, b in dropped[p]]
                        for p in FLOAT_PRECISIONS if p in dropped}
        dropout = {p: _pair(data["dropout"][p]) for p in FLOAT_PRECISIONS if p in data.get("dropout", {})}
        return cls(width=_count(data["width"]), int8=_rate(data["int8"]), attention=attention,
                   attention_training=attention_training, attention_training_dropout=with_dropout, dropout=dropout,
                   seconds=_rate(data["seconds"]), steady=data.get("steady", True) is True, **rates)


def _pair(value: object) -> tuple[float, float]:  # two timings; ValueError for anything else
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise ValueError(f"not two timings: {value!r}")
    return _rate(value[0]), _rate(value[1])


def _rate(value: object, positive: bool = False) -> float:
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0
            or (positive and value == 0)):
        raise ValueError(f"not a measurement: {value!r}")
    return float(value)


def _count(value: object) -> int:
    """A width or a length: a whole number from 1 to 2**20 (1e400 is no width)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 1 <= value <= 1 << 20 \
            or int(value) != value:
        raise ValueError(f"not a width or length: {value!r}")
    return int(value)


@dataclass(frozen=True)
class Choices:
    """What `auto` and the CPU kernels do on this machine, and why (one line each)."""

    train_precision: str
    inference_precision: str
    packed_linear: tuple[str, ...]
    """Precisions in which oneDNN with a packed weight beat F.linear (by FAST_PATH_MIN_SPEEDUP)."""
    bmm_attention: dict[str, tuple[int, ...]]
    """precision -> the probed lengths at which batched matmul attention beat SDPA (likewise)."""
    reasons: tuple[str, ...]
    bmm_training: dict[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    """precision -> the probed lengths at which it beat SDPA in training, forward + backward (likewise)."""
    bmm_training_dropout: dict[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    """The same with attention dropout (bmm's mask counter-based)."""
    counter_dropout: tuple[str, ...] = ()
    """Precisions in which the counter-based dropout (`kernels.dropout`) beat F.dropout (likewise)."""

    def packed(self, dtype: torch.dtype) -> bool:
        return _name(dtype) in self.packed_linear

    def bmm(self, dtype: torch.dtype, length: int) -> bool:
        """Whether bmm attention is faster at `length`: the verdict of the nearest probed length (log scale)."""
        return _nearest(length) in self.bmm_attention.get(_name(dtype), ())

    def bmm_anywhere(self, dtype: torch.dtype) -> bool:
        """Whether bmm attention beat SDPA in `dtype` at any probed length."""
        return bool(self.bmm_attention.get(_name(dtype)))

    def bmm_for_training(self, dtype: torch.dtype, length: int, dropout: bool = False) -> bool:
        """Whether bmm attention's forward + backward is faster at `length` (the nearest probed length's verdict),
        without attention dropout or with it."""
        verdicts = self.bmm_training_dropout if dropout else self.bmm_training
        return _nearest(length) in verdicts.get(_name(dtype), ())

    def dropout_by_counter(self, dtype: torch.dtype) -> bool:
        """Whether the counter-based dropout is the faster in `dtype`."""
        return _name(dtype) in self.counter_dropout


def _nearest(length: int) -> int:
    """The probed length nearest to `length`, on a log scale."""
    return min(ATTENTION_LENGTHS, key=lambda probed: abs(math.log2(probed / max(length, 1))))


def _name(dtype: torch.dtype) -> str:
    return next((name for name, d in DTYPES.items() if d == dtype), str(dtype))


def decide(m: Measurements) -> Choices:
    """The choices that follow from the measurements (pure: tested with injected numbers)."""
    packed = tuple(p for p in FLOAT_PRECISIONS if m.packed[p] >= FAST_PATH_MIN_SPEEDUP * m.linear[p] > 0)
    bmm = {p: _bmm_wins(m.attention[p]) for p in FLOAT_PRECISIONS}
    bmm_training = {p: _bmm_wins(m.attention_training.get(p, [])) for p in FLOAT_PRECISIONS}
    bmm_dropout = {p: _bmm_wins(m.attention_training_dropout.get(p, [])) for p in FLOAT_PRECISIONS}
    counter = tuple(p for p, (torch_us, ours) in m.dropout.items() if 0 < FAST_PATH_MIN_SPEEDUP * ours <= torch_us)
    inference = {p: inference_rate(m, p) for p in FLOAT_PRECISIONS}
    train, train_reason = _faster_precision(m.train, f"{m.width}-wide dense layer, forward + backward")
    served, served_reason = _faster_precision(inference, f"{m.width}-wide dense layer at inference")
    reasons = [f"training: {train_reason}", f"inference: {served_reason}"]
    for p in FLOAT_PRECISIONS:
        verdict = "taken" if p in packed else f"not taken, needs {FAST_PATH_MIN_SPEEDUP}x"
        reasons.append(f"packed oneDNN linear in {p}: {verdict} ({m.packed[p]:.0f} vs F.linear {m.linear[p]:.0f} "
                       "GFLOP/s)")
        lengths = ", ".join(map(str, bmm[p]))
        reasons.append(f"bmm attention in {p}: taken near {lengths} tokens, where it beat SDPA" if bmm[p] else
                       f"bmm attention in {p}: not taken (not {FAST_PATH_MIN_SPEEDUP}x faster than SDPA at any "
                       "probed length)")
        for verdicts, measured, what in ((bmm_training, m.attention_training, ""),
                                         (bmm_dropout, m.attention_training_dropout, f" with dropout {DROPOUT_P}")):
            if measured.get(p):
                lengths = ", ".join(map(str, verdicts[p]))
                reasons.append(f"bmm attention for training{what} in {p}: taken near {lengths} tokens, where its "
                               "forward + backward beat SDPA's" if verdicts[p] else
                               f"bmm attention for training{what} in {p}: not taken (not {FAST_PATH_MIN_SPEEDUP}x "
                               "faster than SDPA at any probed length)")
        if p in m.dropout:
            torch_us, ours = m.dropout[p]
            reasons.append(f"counter-based dropout in {p}: {'taken' if p in counter else 'not taken'} ({ours:.0f} vs "
                           f"torch's {torch_us:.0f} us, forward + backward; needs {FAST_PATH_MIN_SPEEDUP}x)")
    if m.int8 > 0:
        reasons.append(f"int8 (opt-in, --precision int8): {m.int8:.0f} GFLOP/s, "
                       f"{m.int8 / max(inference.values()):.2f}x the faster float precision")
    return Choices(train, served, packed, bmm, tuple(reasons), bmm_training, bmm_dropout, counter)


def _bmm_wins(times: list[tuple[int, float, float]]) -> tuple[int, ...]:
    """The lengths at which bmm attention was at least FAST_PATH_MIN_SPEEDUP x faster than SDPA."""
    return tuple(n for n, sdpa, batched in times if 0 < FAST_PATH_MIN_SPEEDUP * batched <= sdpa)


def inference_rate(m: Measurements, precision: str) -> float:
    """GFLOP/s of the dense layer that inference runs in this float precision: the packed oneDNN call
    where it wins by FAST_PATH_MIN_SPEEDUP, else F.linear."""
    packed, linear = m.packed[precision], m.linear[precision]
    return packed if packed >= FAST_PATH_MIN_SPEEDUP * linear else linear


def _faster_precision(rates: dict[str, float], what: str) -> tuple[str, str]:
    fp32, bf16 = rates["fp32"], rates["bf16"]
    speedup = bf16 / fp32 if fp32 > 0 else math.inf if bf16 > 0 else 0.0
    chosen = "bf16" if speedup >= BF16_MIN_SPEEDUP else "fp32"
    return chosen, (f"{chosen} ({what}: bf16 {bf16:.0f} vs fp32 {fp32:.0f} GFLOP/s = {speedup:.2f}x; "
                    f"bf16 needs {BF16_MIN_SPEEDUP}x)")


# --- the probe ------------------------------------------------------------------------------------

def measure(width: int = DEFAULT_WIDTH) -> Measurements:
    """Time the candidates at this model width on one CPU thread (three to six seconds on an idle core, by width).

    One thread, because the choices compare kernels, not the machine's parallel scaling, and one thread
    measures them reliably on a shared machine: there, two OpenMP threads wait for each other at every
    op whenever one is descheduled, and on this project's busy 2-core VM 2-thread probes timed bf16
    slower than fp32, which it beats about 2x on one thread. Leaves the thread count, the global RNG,
    autocast and grad modes as they were."""
    start = time.perf_counter()
    width = max(64, width)
    generator = torch.Generator().manual_seed(0)
    weight, bias = torch.randn(4 * width, width, generator=generator) / width ** 0.5, torch.zeros(4 * width)
    x = torch.randn(PROBE_TOKENS, width, generator=generator)
    flops = 2 * PROBE_TOKENS * width * 4 * width
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    cpu = CpuShare(1)
    try:
        with torch.autocast("cpu", enabled=False), torch.inference_mode(False):
            train_s, train_steady = _fastest(_training_steps(x, weight, bias))
            with torch.no_grad():
                inference_s, inference_steady = _fastest(_inference_calls(x, weight, bias))
                attention = attention_times(width, generator, PROBE_TOKENS, _fastest)
            with torch.enable_grad(), torch.random.fork_rng(devices=[]):  # dropout draws from the global CPU RNG
                attention_training = attention_training_times(width, generator, PROBE_TOKENS, _fastest)
                with_dropout = attention_training_times(width, generator, PROBE_TOKENS, _fastest, DROPOUT_P)
                dropout = dropout_times(width, generator, PROBE_TOKENS, _fastest)
        train = {p: flops * 3 / s / 1e9 for p, s in train_s.items()}
        inference = {k: flops / s / 1e9 for k, s in inference_s.items()}
    finally:
        torch.set_num_threads(threads)
    return Measurements(width=width, train={p: train.get(p, 0.0) for p in FLOAT_PRECISIONS},
                        linear={p: inference.get(f"linear {p}", 0.0) for p in FLOAT_PRECISIONS},
                        packed={p: inference.get(f"packed {p}", 0.0) for p in FLOAT_PRECISIONS},
                        int8=inference.get("int8", 0.0), attention=attention,
                        attention_training=attention_training, attention_training_dropout=with_dropout,
                        dropout=dropout, seconds=time.perf_counter() - start,
                        steady=train_steady and inference_steady and not cpu.busy())


BUSY_CPU_SHARE = 0.5
"""A probe whose threads got less than this share of its wall time on a CPU ran on a busy machine: its timings
serve the run that took them and are not cached (a machine consistently busy times every candidate slow, and
alike, so agreement between rounds alone does not show it)."""


class CpuShare:
    """The share of wall time this process's `threads` spent on a CPU between `start()` and `share()`:
    process CPU time / (wall time x threads)."""

    def __init__(self, threads: int) -> None:
        self.threads = max(1, threads)
        self.cpu, self.wall = time.process_time(), time.perf_counter()

    def share(self) -> float:
        wall = time.perf_counter() - self.wall
        return (time.process_time() - self.cpu) / (wall * self.threads) if wall > 0 else 1.0

    def busy(self) -> bool:
        return self.share() < BUSY_CPU_SHARE


def _fastest(candidates: dict[str, Callable[[], object]]) -> tuple[dict[str, float], bool]:
    """Best seconds of each candidate over interleaved rounds, so that load hits all alike: at least
    MIN_ROUNDS, then more (up to MAX_ROUNDS, for at most EXTRA_ROUNDS_S) until each one's two fastest
    runs agree within 10%, as they do at once on an idle machine; and whether they did. A candidate that
    fails on its first call (a kernel missing on this build or CPU) is left out."""
    working = {}
    for name, run in candidates.items():
        try:
            run()
            working[name] = run
        except (RuntimeError, NotImplementedError, AttributeError):
            log.debug("probe: %s does not run here", name)
    samples: dict[str, list[float]] = {name: [] for name in working}
    deadline = math.inf
    for rounds in range(1, MAX_ROUNDS + 1):
        for name, run in working.items():
            begin = time.perf_counter()
            run()
            samples[name].append(time.perf_counter() - begin)
        if rounds == MIN_ROUNDS:
            deadline = time.perf_counter() + EXTRA_ROUNDS_S
        if rounds >= MIN_ROUNDS and (time.perf_counter() > deadline or all(map(_steady, samples.values()))):
            break
    return {name: min(times) for name, times in samples.items()}, all(map(_steady, samples.values()))


def _steady(times: list[float]) -> bool:
    first, second = sorted(times)[:2]
    return second <= 1.1 * first


def _training_steps(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> dict[str, Callable[[], object]]:
    """Forward + backward of one dense layer (gradients of input and weight), as the training loop runs it."""
    x, weight, bias = (t.clone().requires_grad_() for t in (x, weight, bias))

    def step(dtype: torch.dtype) -> Callable[[], object]:
        def run() -> object:
            with torch.enable_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
                y = F.linear(x, weight, bias)
            return torch.autograd.grad(y, (x, weight), torch.ones_like(y))
        return run
    return {p: step(dtype) for p, dtype in DTYPES.items()}


def _inference_calls(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> dict[str, Callable[[], object]]:
    calls: dict[str, Callable[[], object]] = {}
    for p, dtype in DTYPES.items():
        xd, wd, bd = x.to(dtype), weight.to(dtype), bias.to(dtype)
        # mypy cannot infer a lambda whose defaults bind the loop's tensors
        calls[f"linear {p}"] = lambda xd=xd, wd=wd, bd=bd: F.gelu(F.linear(xd, wd, bd))  # type: ignore[misc]
        calls[f"packed {p}"] = _packed_call(xd, wd, bd)
    calls["int8"] = _int8_call(x, weight, bias)
    return calls


def _packed_call(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> Callable[[], object]:
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(weight)
    except (RuntimeError, NotImplementedError, AttributeError) as exc:  # no oneDNN on this build or CPU
        return _missing(str(exc))
    return lambda: torch.ops.mkldnn._linear_pointwise(x, packed, bias, "gelu", [], "none")


def _missing(reason: str) -> Callable[[], object]:
    """A candidate that cannot run here: its first call raises, and `_fastest` leaves it out."""
    def run() -> object:
        raise RuntimeError(reason)
    return run


def _int8_call(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> Callable[[], object]:
    try:
        packed = int8.pack(weight, bias)
    except (RuntimeError, NotImplementedError, AttributeError) as exc:  # no oneDNN int8 kernels here
        return _missing(str(exc))
    return lambda: int8.linear(x, packed, ("gelu", "none"))


# --- the cache --------------------------------------------------------------------------------------

def cache_dir() -> Path:
    """$BERTKIT_CACHE_DIR, else $XDG_CACHE_HOME/bertkit, else ~/.cache/bertkit."""
    if os.environ.get("BERTKIT_CACHE_DIR"):
        return Path(os.environ["BERTKIT_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "bertkit"


def cache_key(width: int, host: Machine | None = None) -> dict:
    """What a cached measurement must match to be used: the machine (CPU model, cores, versions), the
    width and the probe's version. Not the thread count: the probe runs on one thread."""
    fields = dataclasses.asdict(host or machine())
    del fields["flags"], fields["cuda"], fields["threads"]
    return {**fields, "width": max(64, width), "probe": PROBE_VERSION}


def cache_file(key: dict) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / f"probe-{digest}.json"


def read_cache(path: Path, key: dict) -> Measurements | None:
    """The cached measurements, or None when the file is missing, corrupt or for another key (stale)."""
    try:
        data = read_json_object(path)
        if data["key"] != key:
            log.info("ignoring %s: measured for another machine or version", path)
            return None
        return Measurements.from_json(data["measurements"])
    except (BertkitError, ValueError, TypeError, KeyError) as exc:
        if not path.exists():
            return None
        log.warning("ignoring the unreadable probe cache %s (%s); measuring again", path, exc)
        return None


def write_cache(path: Path, key: dict, measured: Measurements) -> None:
    """Written atomically; a cache directory that cannot be written costs a probe per process, no more."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, json.dumps({"key": key, "measurements": measured.to_json()}, indent=1))
    except OSError as exc:
        log.warning("cannot write the probe cache %s (%s); set BERTKIT_CACHE_DIR to a writable directory", path, exc)


# --- what the rest of bertkit calls -----------------------------------------------------------------

_lock = threading.Lock()
_measured: dict[int, tuple[Measurements, str]] = {}  # width -> (measurements, where they came from)


def measurements(width: int = DEFAULT_WIDTH, refresh: bool = False) -> tuple[Measurements, str]:
    """(measurements at this width, where they came from: "BERTKIT_PROBE_FILE ...", "cached in ..." or
    "measured now"): from this process's memory, the probe file, the cache, or a fresh probe."""
    width = max(64, width)
    with _lock:
        if refresh or width not in _measured:
            _measured[width] = _load_or_measure(width, refresh)
            choices.cache_clear()
        return _measured[width]


def reset() -> None:
    """Forget this process's measurements and choices, e.g. after BERTKIT_PROBE_FILE changed."""
    with _lock:
        _measured.clear()
        choices.cache_clear()
        _log_choice.cache_clear()


def _load_or_measure(width: int, refresh: bool) -> tuple[Measurements, str]:
    given = os.environ.get("BERTKIT_PROBE_FILE")
    if given:
        return _probe_file(Path(given)), f"BERTKIT_PROBE_FILE {given}"
    key = cache_key(width)
    path = cache_file(key)
    cached = None if refresh else read_cache(path, key)
    if cached is not None:
        return cached, f"cached in {path}"
    measured = measure(width)
    if not measured.steady:
        log.warning("the probe's timings did not settle (a busy machine?): its choices serve this run and are "
                    "not cached; `bertkit doctor --refresh` measures again")
        return measured, "measured now, unsteady (not cached)"
    write_cache(path, key, measured)
    return measured, "measured now"


def _probe_file(path: Path) -> Measurements:
    try:
        data = read_json_object(path)
        return Measurements.from_json(data["measurements"])
    except (BertkitError, ValueError, TypeError, KeyError) as exc:
        raise BertkitError(f"BERTKIT_PROBE_FILE {path}: not a probe result ({exc}); write one with "
                           "`bertkit doctor --json > FILE`, or unset the variable to measure") from None


@functools.cache
def choices(width: int = DEFAULT_WIDTH) -> Choices:
    """The decisions for this width, made once per process (the attention backends ask on every forward)."""
    return decide(measurements(width)[0])


def model_width(model: nn.Module) -> int:
    """The width to probe for a model: the most common input size of its nn.Linear layers (BERT's
    hidden size), DEFAULT_WIDTH when it has none."""
    sizes = [m.in_features for m in model.modules() if isinstance(m, nn.Linear)]
    return max(set(sizes), key=sizes.count) if sizes else DEFAULT_WIDTH


def auto_precision(device: torch.device, width: int = DEFAULT_WIDTH, purpose: str = "training") -> str:
    """What `--precision auto` runs for `purpose` ("training" or "inference"): on CUDA bf16 where the GPU
    supports it, on a CPU the faster of fp32 and bf16 as measured (bf16 only at >= 1.2x), else fp32."""
    if device.type == "cuda":
        supported = torch.cuda.is_bf16_supported()
        _log_choice(purpose, 0, f"{purpose}: " + ("bf16 (this CUDA device supports it)" if supported else
                                                  "fp32 (this CUDA device has no bf16)"), probed=False)
        return "bf16" if supported else "fp32"
    if device.type != "cpu":
        return "fp32"
    chosen = choices(width)
    precision = chosen.train_precision if purpose == "training" else chosen.inference_precision
    _log_choice(purpose, width, chosen.reasons[0 if purpose == "training" else 1])
    return precision


@functools.cache
def _log_choice(purpose: str, width: int, reason: str, probed: bool = True) -> None:
    """One line per choice and process: what auto chose for `purpose`, why, and (CPU) from which probe."""
    chosen = reason.split(": ", 1)[1]
    if not probed:
        log.info("precision auto for %s: %s", purpose, chosen)
        return
    _measured, source = measurements(width)
    log.info("precision auto for %s: %s [%s; probe %s]", purpose, chosen, machine().cpu, source)


def matmul_gflops(precision: str, width: int = DEFAULT_WIDTH, purpose: str = "training",
                  threads: int | None = None) -> float:
    """The rate (GFLOP/s) of a dense layer of this width on the CPU in `precision` (fp32, bf16; int8 for
    inference) on `threads` threads (default: torch's): what a recipe divides model FLOPs by to estimate
    step time. Training counts forward + backward under the loop's autocast; inference the kernel it
    runs (`inference_rate`). The probe's one-thread rate times the threads: matrix multiplies scale
    about linearly over idle cores, so on a busy machine this is an upper bound."""
    measured = measurements(width)[0]
    if precision == "int8":
        rate = measured.int8
    elif purpose == "training":
        rate = measured.train[precision]
    else:
        rate = inference_rate(measured, precision)
    return rate * (threads or torch.get_num_threads())
