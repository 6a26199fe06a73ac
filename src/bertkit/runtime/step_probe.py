"""`--precision auto` on a CPU, decided from the step itself: the run's encoder layers at the run's shape,
timed in fp32 and in bf16, the faster chosen.

Why not only the dense-layer probe (bertkit.runtime.probe): a training step is more than dense layers. On a 2-core
AMD EPYC the probe's dense layer ran 2.24x faster under bf16 autocast, yet bert-mini's whole pre-training step was
7% slower in bf16 than in fp32 (attention, LayerNorm, GELU, dropout and the dtype casts autocast adds do not speed
up, and some slow down). So here the step is timed: a copy of the model's encoder cut to its first PROBE_LAYERS
layers (every layer is alike; embeddings and heads are a few percent of a step; the embeddings train too, so that a
backward runs through every layer as in the run's step), on rows x length random tokens (the run's micro-batch and
sequence length, at most MAX_TOKENS tokens). Training times forward + backward (dropout as configured, under bf16
autocast or none); inference times the copy's forward cast to bf16 or fp32. The encoder is found by its shape
(`config`, `embeddings`, `layers`), not its class, so that bertkit.runtime.device, which every layer imports, can
use this module without importing bertkit.model. Rounds alternate between the two precisions after a warm-up of
each, and each precision's fastest round counts, so load on a shared machine hits both alike; bf16 is chosen when
it is at least MIN_SPEEDUP (1.05x) faster, so auto is within 5% of the faster of the two. The step is timed only
where the dense probe found bf16 faster (elsewhere bf16 cannot win), so a probe costs about ten steps of two layers
on at most MAX_TOKENS tokens: a few seconds at bert-base's width on 2 cores, once per machine and shape.

Timings are cached like the dense probe's (bertkit.runtime.probe.cache_dir, keyed by the machine, the versions, the
torch threads, the model's shape, rows, length and purpose, and the CPU kernels it was given, attention and dropout:
`bertkit.workflows.prepare.use_measured_kernels` installs them before the step is timed); an unsteady probe (the
two fastest rounds more than 10% apart, or its threads on a CPU less than half its wall time, `probe.CpuShare`: a
busy machine) serves its run and is not cached. With BERTKIT_PROBE_FILE set (fixed choices: identical machines, the
test suite) no step is timed and the dense probe's choice stands.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Callable
from copy import deepcopy
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar, runtime_checkable

import torch
from torch import nn

from bertkit.config import BertConfig
from bertkit.errors import BertkitError
from bertkit.io.atomic import write_text_atomic
from bertkit.io.jsonfile import read_json_object
from bertkit.runtime import probe

log = logging.getLogger(__name__)

STEP_PROBE_VERSION = 3
PROBE_LAYERS = 2
MAX_TOKENS = 1024
DEFAULT_ROWS, DEFAULT_LENGTH = 8, 128
MIN_SPEEDUP = 1.05
ROUNDS = 3
PURPOSES = ("training", "inference")


@dataclass(frozen=True)
class StepTimings:
    """The fastest round of each precision, in seconds, for one shape and purpose."""

    purpose: str
    rows: int
    length: int
    layers: int
    seconds: dict[str, float]
    steady: bool

    @property
    def speedup(self) -> float:
        """fp32 time / bf16 time (0 when bf16 does not run here)."""
        bf16 = self.seconds.get("bf16", 0.0)
        return self.seconds["fp32"] / bf16 if bf16 > 0 else 0.0

    @property
    def precision(self) -> str:
        return "bf16" if self.speedup >= MIN_SPEEDUP else "fp32"

    def reason(self, total_layers: int) -> str:
        times = ", ".join(f"{p} {1e3 * s:.1f} ms" for p, s in self.seconds.items() if s > 0)
        return (f"{self.precision} (the {self.purpose} step of {self.layers} of {total_layers} layers at "
                f"{self.rows} x {self.length} tokens: {times}, bf16 {self.speedup:.2f}x; bf16 needs {MIN_SPEEDUP}x)")


@runtime_checkable
class Encoder(Protocol):
    """What the step probe needs of a BERT encoder: `bertkit.model.BertModel` is one (tests check it). Named by
    its shape because the model layer imports runtime, not the other way round."""

    @property
    def config(self) -> BertConfig: ...

    @property
    def embeddings(self) -> nn.Module: ...

    @property
    def layers(self) -> nn.ModuleList: ...


def find_encoder(model: nn.Module) -> Encoder | None:
    """The first BERT encoder inside `model` (the task models keep it as `.bert`), or None."""
    return next((m for m in model.modules() if isinstance(m, Encoder) and isinstance(m.config, BertConfig)
                 and isinstance(m.layers, nn.ModuleList) and len(m.layers) > 0), None)


def auto_precision(model: nn.Module, purpose: str = "training", rows: int | None = None,
                   length: int | None = None) -> str | None:
    """fp32 or bf16 for this model's step on this CPU (logged with its timings), or None where the step is
    not timed (BERTKIT_PROBE_FILE set, or no BERT encoder in `model`): the caller's dense-probe choice then
    stands. The step is timed only where the dense probe found bf16's matrix multiplies faster: where
    they are not, bf16 cannot win the step (its other work does not speed up either), and on CPUs without
    bf16 instructions one bf16 step can take tens of times an fp32 one, too long to time."""
    encoder = find_encoder(model)
    if encoder is None or os.environ.get("BERTKIT_PROBE_FILE"):
        return None
    config = encoder.config
    if probe.auto_precision(torch.device("cpu"), config.hidden_size, purpose) == "fp32":
        return "fp32"
    try:
        timings, source = step_timings(encoder, purpose, rows, length)
    except Exception as exc:  # noqa: BLE001  # a probe must not stop the run it serves (e.g. a model that cannot be copied)
        log.warning("the step probe could not time this model (%s: %s); the dense probe's bf16 stands",
                    type(exc).__name__, exc)
        return "bf16"
    log.info("precision auto for %s, checked on the step: %s [%s; step probe %s]", purpose,
             timings.reason(config.num_hidden_layers), probe.machine().cpu, source)
    return timings.precision


_measured: dict[str, tuple[StepTimings, str]] = {}


def step_timings(encoder: Encoder, purpose: str = "training", rows: int | None = None, length: int | None = None,
                 refresh: bool = False) -> tuple[StepTimings, str]:
    """(timings of `encoder`'s step, where they came from): this process's memory, the cache, or a probe now."""
    if purpose not in PURPOSES:
        raise ValueError(f"purpose {purpose!r}: use one of {PURPOSES}")
    config = encoder.config
    rows, length = probe_shape(config, rows, length)
    key = {**cache_key(config, purpose, rows, length), "kernels": kernel_key(encoder)}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    if not refresh and digest in _measured:
        return _measured[digest]
    path = probe.cache_dir() / f"step-{digest}.json"
    cached = None if refresh else _read(path, key)
    if cached is not None:
        _measured[digest] = (cached, f"cached in {path}")
        return _measured[digest]
    timings = measure(encoder, purpose, rows, length)
    if timings.steady:
        _write(path, key, timings)
        source = "measured now"
    else:
        log.warning("the step probe's timings did not settle (a busy machine?): its choice serves this run and is "
                    "not cached")
        source = "measured now, unsteady (not cached)"
    _measured[digest] = (timings, source)
    return _measured[digest]


def probe_shape(config: BertConfig, rows: int | None, length: int | None) -> tuple[int, int]:
    """The run's rows and length (defaults 8 x 128), the length within the model's positions, the rows cut
    so that the probe holds at most MAX_TOKENS tokens."""
    length = max(8, min(length or DEFAULT_LENGTH, config.max_position_embeddings))
    rows = max(1, min(rows or DEFAULT_ROWS, MAX_TOKENS // length))
    return rows, length


def cache_key(config: BertConfig, purpose: str, rows: int, length: int) -> dict:
    shape = {k: getattr(config, k) for k in ("hidden_size", "num_attention_heads", "intermediate_size", "hidden_act",
                                             "hidden_dropout_prob", "attention_probs_dropout_prob")}
    return {**probe.cache_key(config.hidden_size), "step_probe": STEP_PROBE_VERSION, "purpose": purpose,
            "threads": torch.get_num_threads(), "rows": rows, "length": length, "layers": probe_layers(config),
            **shape}


def kernel_key(encoder: Encoder) -> dict[str, dict[str, list[int]] | list[str]]:
    """The measured training kernels the encoder was given: its dispatch's attention choices (precision -> lengths
    where it runs bmm attention, without and with attention dropout; empty for the plain dispatch) and the
    precisions its dropouts draw counter-based masks in. A step timed with other kernels is another measurement."""
    choices = getattr(getattr(encoder, "attention", None), "cpu", None)
    modules = [*encoder.embeddings.modules(), *encoder.layers.modules()]
    dropouts = [getattr(m, "choices", None) for m in modules if isinstance(m, nn.Dropout)]
    counter = next((c.counter_dropout for c in dropouts if c is not None), ())
    return {name: {p: list(lengths) for p, lengths in sorted(getattr(choices, name, {}).items())}
            for name in ("bmm_training", "bmm_training_dropout")} | {"counter_dropout": sorted(counter)}


def probe_layers(config: BertConfig) -> int:
    return min(PROBE_LAYERS, config.num_hidden_layers)


def measure(encoder: Encoder, purpose: str, rows: int, length: int) -> StepTimings:
    """Time the step of a copy of `encoder` cut to its first layers (see the module docstring); the
    encoder itself, the global RNG and the grad mode are left as they were."""
    config = encoder.config
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        ids = torch.randint(0, config.vocab_size, (rows, length))
        steps = {p: _step(cut_encoder(encoder, probe_layers(config)), ids, purpose, p) for p in probe.FLOAT_PRECISIONS}
        working = {}
        for precision, step in steps.items():
            try:
                step()  # warm-up (oneDNN primitives, the allocator)
                working[precision] = step
            except (RuntimeError, NotImplementedError) as exc:
                log.debug("step probe: %s does not run here (%s)", precision, exc)
        samples: dict[str, list[float]] = {p: [] for p in working}
        cpu = probe.CpuShare(torch.get_num_threads())
        for _ in range(ROUNDS):
            for precision, step in working.items():
                started = time.perf_counter()
                step()
                samples[precision].append(time.perf_counter() - started)
    seconds = {p: min(samples.get(p) or [0.0]) for p in probe.FLOAT_PRECISIONS}
    steady = all(sorted(times)[1] <= 1.1 * sorted(times)[0] for times in samples.values()) and not cpu.busy()
    return StepTimings(purpose, rows, length, probe_layers(config), seconds, steady)


def cut_encoder(found: Encoder, layers: int) -> nn.Module:
    """A copy of the encoder with its first `layers` layers and no pooler, on the CPU. Its embeddings require
    gradients as the run's do: the attention dispatch runs training's kernels only where a backward will run
    through the embeddings' output (`bertkit.model.attention.Dispatch`)."""
    encoder: Any = found  # the module itself: its layers and pooler are swapped for the copy
    pooler, encoder.pooler = getattr(encoder, "pooler", None), None
    kept, encoder.layers = encoder.layers, nn.ModuleList(list(encoder.layers)[:layers])
    try:
        copy = deepcopy(encoder).cpu()
    finally:
        encoder.layers, encoder.pooler = kept, pooler
    copy.gradient_checkpointing = False
    return copy


def _step(model: nn.Module, ids: torch.Tensor, purpose: str, precision: str) -> Callable[[], None]:
    if purpose == "inference":  # the copy cast to the precision, as the predictors run it
        model = model.to(probe.DTYPES[precision]).eval()

        def forward() -> None:
            with torch.inference_mode():
                model(ids)
        return forward

    def train_step() -> None:
        model.train()
        with torch.enable_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            hidden = model(ids).last_hidden_state
        hidden.float().square().mean().backward()
        model.zero_grad(set_to_none=True)
    return train_step


def _read(path: Path, key: dict) -> StepTimings | None:
    def parse(data: dict) -> StepTimings:
        t = data["timings"]
        return StepTimings(str(t["purpose"]), int(t["rows"]), int(t["length"]), int(t["layers"]),
                           {str(p): float(s) for p, s in t["seconds"].items()}, bool(t["steady"]))
    return read_cached(path, key, parse, "step-probe")


def _write(path: Path, key: dict, timings: StepTimings) -> None:
    write_cached(path, {"key": key, "timings": asdict(timings)}, "step-probe")


T = TypeVar("T")


def read_cached(path: Path, key: dict, parse: Callable[[dict], T], what: str) -> T | None:
    """A measurement cached at `path` (a JSON object whose "key" is `key`, parsed by `parse`), or None: no file,
    another key, or an unreadable one (said as a warning naming `what`, then measured again)."""
    try:
        data = read_json_object(path)
        return parse(data) if data["key"] == key else None
    except (BertkitError, ValueError, TypeError, KeyError, AttributeError) as exc:
        if path.exists():
            log.warning("ignoring the unreadable %s cache %s (%s); measuring again", what, path, exc)
        return None


def write_cached(path: Path, record: dict, what: str) -> None:
    """Write a measurement's `record` (with its "key") atomically; a cache that cannot be written is a warning."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, json.dumps(record, indent=1))
    except OSError as exc:
        log.warning("cannot write the %s cache %s (%s); set BERTKIT_CACHE_DIR to a writable directory", what, path,
                    exc)
