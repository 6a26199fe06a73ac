"""The lever ladder (issue 49): the pre-training step of transformers, of bertkit before issue 49, and of bertkit
with each lever added, on the same real-text batches, one process; then, for the fastest bertkit variant, a
numerics run against the fp32-residual path, a profile that names the kernels, and the largest batch.

Parts (`run.py`): `ladder` (bert-base, 128 tokens: every rung + numerics + profile + largest batch), `large`
(bert-large, 128 tokens: the fastest variant) and `phase2` (bert-base, 512 tokens: the fastest variant on full
rows, then on real padded phase-2 data, unpadded, real tokens counted).

A step is what `bertkit.train.fit` runs (`_step`): forward + loss under bf16 autocast, backward, gradient clipping
at 1.0, a fused AdamW step; the static variants hand the non-finite guard to the optimizer on the device as the
loop does, the "before" variant reads the loss and the gradient norm on the host every step as the loop did.
transformers runs `BertForPreTraining(labels=..., next_sentence_label=...)` (SDPA attention, dense MLM head) with
the same clipping and fused AdamW, from identical initial weights.

Timing: batches on the device first; per variant, warm-up steps (the first compiles: its excess over a timed
step is reported as compile seconds), then `rounds` timed rounds of `steps` steps, each ended by a device
synchronisation; the median round counts; peak memory is the allocator's maximum over the timed rounds. Model
FLOPs by docs/performance.md's rule (`throughput.FLOP_RULE`), the same count for every variant, on real tokens.
Results are written after every rung, so a part stopped at its timeout keeps what it measured.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpu_check.throughput import DATASHEET, FLOP_RULE, datasheet_peak


@dataclass(frozen=True)
class Variant:
    """One rung: which implementation and which of issue 49's levers."""

    name: str
    impl: str = "bertkit"  # "bertkit" or "transformers"
    static: bool = False  # collate_static batches, no host read in the step (the loop's device-side guard)
    compile: bool = False  # the whole objective compiled (CompiledObjective)
    cuda_graphs: bool = False
    norm: bool = False  # fused dropout + residual + LayerNorm, bf16 residual stream
    gelu: bool = False  # fused bias + GELU
    loss: bool = False  # fused MLM loss

    def levers(self) -> dict[str, bool]:
        return {k: v for k, v in dataclasses.asdict(self).items() if isinstance(v, bool)}


LADDER = (
    Variant("transformers", impl="transformers"),
    Variant("bertkit before issue 49 (eager, host reads)"),
    Variant("+ static step, no host reads", static=True),
    Variant("+ fused dropout+residual+LayerNorm", static=True, norm=True),
    Variant("+ fused bias+GELU", static=True, norm=True, gelu=True),
    Variant("+ fused MLM loss (all kernels, eager)", static=True, norm=True, gelu=True, loss=True),
    Variant("whole step compiled (no kernels)", static=True, compile=True),
    Variant("whole step compiled + all kernels", static=True, compile=True, norm=True, gelu=True, loss=True),
    Variant("whole step compiled + CUDA graphs", static=True, compile=True, cuda_graphs=True),
)
REFERENCE = "whole step compiled (no kernels)"
"""The fp32-residual path the numerics run compares the fastest variant with (or, when the fastest is this one,
the same with all kernels)."""
DEFAULT_BEST = "whole step compiled + all kernels"

SHAPES: dict[str, dict[str, Any]] = {
    "ladder": {"model": "bert-base", "seq_length": 128, "batch": 256, "predictions": 20},
    "large": {"model": "bert-large", "seq_length": 128, "batch": 256, "predictions": 20},
    "phase2": {"model": "bert-base", "seq_length": 512, "batch": 64, "predictions": 80},
}
DRY_SHAPE = {"model": "bert-debug", "seq_length": 32, "batch": 4, "predictions": 5}
DRY_PHASE2 = {"model": "bert-debug", "seq_length": 64, "batch": 8, "predictions": 10}
"""Long enough that some of the corpus's instances are shorter than a row: the dry run unpads real padding."""
GPU_TIMING = {"warmup": 3, "steps": 5, "rounds": 3, "batches": 5, "numerics_steps": 300, "numerics_batches": 40}
DRY_TIMING = {"warmup": 1, "steps": 1, "rounds": 1, "batches": 2, "numerics_steps": 4, "numerics_batches": 2}
NUMERICS_TOLERANCE = {"window": 25, "noise_factor": 2.0, "floor_nats": 0.05, "final_relative": 0.02}
"""Loss curves agree when every `window`-step mean of the candidate stays within `noise_factor` x the largest gap
between two runs of the reference that differ only in their dropout seed (or `floor_nats`, if larger) of the
reference's, and the last window within `final_relative` of it: a difference no larger than dropout noise."""
VOCAB_SIZE = 30522


# --- building a variant -------------------------------------------------------------------------------------

@dataclass
class Built:
    variant: Variant
    model: Any
    optimizer: Any
    step: Callable[[dict, dict | None], Any]
    """step(batch on the device, totals on the device or None) -> the loss (a device tensor)."""
    batches: list[dict]
    totals: list[dict | None]
    objective: Any = None
    """The static variants' objective (compiled or not), which the numerics run trains again."""


def _initial_state(model_name: str, device: str) -> tuple[Any, dict]:
    """(config, the initial weights every variant starts from), seed 0."""
    import torch

    from bertkit.config import preset
    from bertkit.model import BertForPreTraining

    torch.manual_seed(0)
    model = BertForPreTraining(preset(model_name, vocab_size=VOCAB_SIZE))
    return model.config, {k: v.detach().clone() for k, v in model.state_dict().items()}


def build(variant: Variant, config: Any, state: dict, items_per_batch: list[list[dict]], shape: dict[str, Any],
          device: str, dry_run: bool) -> Built:
    import torch

    from bertkit.data import collate_pretraining, collate_static
    from bertkit.kernels.cross_entropy import masked_lm_loss
    from bertkit.model import BertForPreTraining
    from bertkit.model.fused import fuse_for_training
    from bertkit.tasks.pretraining import PretrainingObjective, pretraining_loss, weighted_mlm_loss
    from bertkit.train.compiled import CompiledObjective
    from bertkit.train.optim import build_optimizer

    def to_device(batch: dict) -> dict:
        return {k: v.to(device) for k, v in batch.items()}

    if variant.impl == "transformers":
        model = _transformers_model(config, state).to(device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        batches = [to_device(collate_pretraining(items)) for items in items_per_batch]
        return Built(variant, model.train(), optimizer, _transformers_step(model, optimizer), batches,
                     [None] * len(batches))
    model = BertForPreTraining(config)
    model.load_state_dict(state)
    model.to(device).train()
    fuse_for_training(model, norm=variant.norm, gelu=variant.gelu)
    optimizer = build_optimizer(model, "adamw", 1e-4, 0.01, (0.9, 0.999), 1e-6)
    if not variant.static:
        batches = [to_device(collate_pretraining(items)) for items in items_per_batch]
        return Built(variant, model, optimizer, _before_step(model, optimizer, pretraining_loss), batches,
                     [None] * len(batches))
    objective: Any = PretrainingObjective(mlm_loss=masked_lm_loss if variant.loss else weighted_mlm_loss)
    host = [collate_static(items, 0, shape["seq_length"], shape["predictions"]) for items in items_per_batch]
    totals = [{k: v.clamp(min=1).to(device, torch.float64) for k, v in objective.counts(b).items()} for b in host]
    if variant.compile:
        objective = CompiledObjective(objective, cuda_graphs=variant.cuda_graphs and not dry_run,
                                      backend="aot_eager" if dry_run else "inductor")
    return Built(variant, model, optimizer, _static_step(model, optimizer, objective), [to_device(b) for b in host],
                 totals, objective)


def _transformers_model(config: Any, state: dict) -> Any:
    """transformers' BertForPreTraining (its default attention, SDPA) with bertkit's initial weights, through
    bertkit's own checkpoint writer."""
    import tempfile

    import transformers

    from bertkit.model import BertForPreTraining

    ours = BertForPreTraining(config)
    ours.load_state_dict(state)
    with tempfile.TemporaryDirectory() as directory:
        ours.save_pretrained(directory)
        return transformers.BertForPreTraining.from_pretrained(directory)


def _params(model: Any) -> list:
    return [p for p in model.parameters() if p.requires_grad]


def _static_step(model: Any, optimizer: Any, objective: Any) -> Callable:
    """The loop's step with the guard on the device (bertkit.train.loop._optimizer_step)."""
    import torch

    params = _params(model)

    def step(batch: dict, totals: dict | None) -> Any:
        with torch.autocast(batch["input_ids"].device.type, dtype=torch.bfloat16):
            loss, _ = objective(model, batch, totals)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.grad_scale = None
        optimizer.found_inf = (~(torch.isfinite(loss) & torch.isfinite(norm))).to(torch.float32)
        optimizer.step()
        del optimizer.grad_scale, optimizer.found_inf
        optimizer.zero_grad(set_to_none=True)
        return loss.detach().clone()  # a CUDA graph's output is overwritten by its next replay
    return step


def _before_step(model: Any, optimizer: Any, loss_fn: Callable) -> Callable:
    """The loop's step before issue 49: metrics and the gradient norm read on the host every step."""
    import torch

    params = _params(model)

    def step(batch: dict, totals: dict | None) -> Any:
        with torch.autocast(batch["input_ids"].device.type, dtype=torch.bfloat16):
            loss, _ = loss_fn(model, batch)
        loss.backward()
        norm = float(torch.nn.utils.clip_grad_norm_(params, 1.0))
        if math.isfinite(float(loss)) and math.isfinite(norm):
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()
    return step


def _transformers_step(model: Any, optimizer: Any) -> Callable:
    import torch

    params = _params(model)

    def step(batch: dict, totals: dict | None) -> Any:
        with torch.autocast(batch["input_ids"].device.type, dtype=torch.bfloat16):
            loss = model(input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"],
                         attention_mask=batch["attention_mask"], labels=batch["mlm_labels"],
                         next_sentence_label=batch["nsp_labels"]).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()
    return step


# --- measuring -------------------------------------------------------------------------------------------

def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def time_variant(built: Built, timing: dict[str, int], device: str) -> dict[str, Any]:
    """Warm-up (compile), then timed rounds; ms per step, compile seconds, peak memory."""
    import torch

    pairs = list(zip(built.batches, built.totals))
    warmup_s = []
    for index in range(timing["warmup"]):
        started = time.perf_counter()
        loss = built.step(*pairs[index % len(pairs)])
        _sync(device)
        warmup_s.append(time.perf_counter() - started)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    rounds = []
    for _ in range(timing["rounds"]):
        _sync(device)
        started = time.perf_counter()
        for index in range(timing["steps"]):
            loss = built.step(*pairs[index % len(pairs)])
        _sync(device)
        rounds.append(time.perf_counter() - started)
    step_s = statistics.median(rounds) / timing["steps"]
    return {"ms_per_step": 1e3 * step_s, "compile_s": round(max(0.0, warmup_s[0] - step_s), 1),
            "warmup_s": [round(s, 3) for s in warmup_s], "round_s": [round(s, 4) for s in rounds],
            "last_loss": float(loss),
            "peak_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if device == "cuda" else None}


def model_flops(items_per_batch: list[list[dict]], config: Any) -> float:
    """Model FLOPs of one step, averaged over the batches (FLOP_RULE)."""
    d, layers, vocab = config.hidden_size, config.num_hidden_layers, config.vocab_size
    total = 0.0
    for items in items_per_batch:
        for item in items:
            t = len(item["input_ids"])
            masked = int((item["mlm_labels"] != -100).sum())
            total += layers * (24 * d * d * t + 4 * d * t * t)  # the encoder
            total += masked * (2 * d * d + 2 * d * vocab) + 2 * d * d + 4 * d  # the MLM head at masked tokens, NSP
    return 3 * total / len(items_per_batch)


def _peak(device: str, device_name: str) -> tuple[float, str]:
    import torch
    from peak import matmul_peak

    measured = matmul_peak(torch.bfloat16, device, size=None if device == "cuda" else 512)
    sheet = datasheet_peak(device_name, "bf16") if device == "cuda" else None
    return (sheet, f"datasheet dense bf16 of {device_name}") if sheet else (measured, "measured bf16 matmul")


def _release() -> None:
    """Give back what the last variant held (its references already dropped)."""
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def write_partial(options: dict[str, Any], details: dict[str, Any]) -> None:
    """What the part found so far, where the runner reads a part's result (kept if the part times out)."""
    path = options.get("result")
    if path:
        temporary = Path(path).with_suffix(".partial")
        temporary.write_text(json.dumps({"status": "timeout", "details": details, "error": "stopped before the end"},
                                        default=str))
        temporary.replace(path)


# --- the parts ---------------------------------------------------------------------------------------------

def run(options: dict[str, Any]) -> tuple[str, dict[str, Any], str | None]:
    """`options["shape"]`: "ladder", "large" or "phase2"."""
    import sys

    import torch

    from gpu_check.throughput import benchmark

    benchmark()  # puts benchmarks/ (peak.py) on sys.path
    dry_run, kind = options["dry_run"], options["shape"]
    device = "cpu" if dry_run else "cuda"
    shape = dict((DRY_PHASE2 if kind == "phase2" else DRY_SHAPE) if dry_run else SHAPES[kind])
    timing = DRY_TIMING if dry_run else GPU_TIMING
    device_name = torch.cuda.get_device_name() if device == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    config, state = _initial_state(shape["model"], device)
    peak, peak_source = _peak(device, device_name)
    details: dict[str, Any] = {
        "kind": kind, "model": shape["model"], "seq_length": shape["seq_length"], "batch": shape["batch"],
        "predictions": shape["predictions"], "device_name": device_name, "torch": torch.__version__,
        "python": sys.version.split()[0], "peak_tflops": peak, "peak_source": peak_source, "flop_rule": FLOP_RULE,
        "datasheet": [list(row) for row in DATASHEET], "results": {}, "errors": {}}
    if kind == "ladder":
        variants = LADDER
    else:
        best = options.get("best_levers") or next(v.levers() for v in LADDER if v.name == DEFAULT_BEST)
        variants = (Variant("fastest ladder variant", **best),)
        details["best_from_ladder"] = options.get("best_name") or f"{DEFAULT_BEST} (the ladder's result was absent)"
    from gpu_check.text_rows import full_rows

    items = [full_rows(shape["batch"], shape["seq_length"], shape["predictions"], seed=index)
             for index in range(timing["batches"])]
    flops = model_flops(items, config)
    details.update(model_tflop_per_step=flops / 1e12, tokens_per_step=shape["batch"] * shape["seq_length"])
    kept: dict[str, Built] = {}
    for variant in variants:
        if variant.cuda_graphs and device != "cuda":
            details["errors"][variant.name] = "skipped: CUDA graphs need a GPU"
            continue
        _measure(variant, config, state, items, shape, device, timing, flops, peak, details, kept, dry_run)
        write_partial(options, details)
    ours = {name: r for name, r in details["results"].items() if not name.startswith("transformers")}
    if not ours:
        return "failed", details, "no bertkit variant ran: " + json.dumps(details["errors"])[:1500]
    best_name = max(ours, key=lambda name: ours[name]["tokens_per_s"])
    details["best"] = {"name": best_name, "levers": ours[best_name]["levers"]}
    if "transformers" in details["results"]:
        details["best_vs_transformers"] = ours[best_name]["tokens_per_s"] / details["results"]["transformers"][
            "tokens_per_s"]
    write_partial(options, details)
    if kind == "ladder":
        _after_ladder(details, kept, config, state, shape, device, timing, options, dry_run)
    if kind == "phase2":
        _phase2_padded(details, kept, config, state, shape, device, timing, peak, options, dry_run)
    problems = [f"{name}: {error}" for name, error in details["errors"].items() if not error.startswith("skipped")]
    return ("failed" if problems else "passed"), details, "; ".join(problems)[:2000] or None


def _measure(variant: Variant, config: Any, state: dict, items: list, shape: dict, device: str,
             timing: dict, flops: float, peak: float, details: dict, kept: dict, dry_run: bool) -> None:
    import traceback

    built = None
    try:
        built = build(variant, config, state, items, shape, device, dry_run)
        result = time_variant(built, timing, device)
        seconds = result["ms_per_step"] / 1e3
        real_tokens = sum(len(i["input_ids"]) for batch in items for i in batch) / len(items)
        result.update(tokens_per_s=real_tokens / seconds, model_tflops=flops / seconds / 1e12,
                      mfu=flops / seconds / 1e12 / peak, levers=variant.levers())
        details["results"][variant.name] = result
        print(f"{variant.name}: {result['ms_per_step']:.1f} ms/step, {result['tokens_per_s']:,.0f} tok/s, "
              f"MFU {result['mfu']:.1%}, compile {result['compile_s']} s, peak {result['peak_memory_gib']} GiB",
              flush=True)
        if variant.impl == "bertkit":  # the numerics run and the profile reuse the fastest (compiled) steps
            kept[variant.name] = built
            built = None
    except Exception:  # noqa: BLE001 - one rung's failure is its result; the ladder goes on
        details["errors"][variant.name] = traceback.format_exc()[-2500:]
        print(f"{variant.name}: FAILED\n{details['errors'][variant.name]}", flush=True)
    finally:
        built = None
        _release()


def _after_ladder(details: dict, kept: dict, config: Any, state: dict, shape: dict, device: str, timing: dict,
                  options: dict, dry_run: bool) -> None:
    """Numerics (fastest vs the fp32-residual path), a profile of the fastest, its largest batch."""
    import traceback

    best = details["best"]["name"]
    for name, job in (("numerics", lambda: _numerics(details, kept, state, shape, device, timing)),
                      ("profile", lambda: _profile(kept.get(best), device, 1 if dry_run else 3)),
                      ("largest_batch", lambda: _largest_batch(details["best"]["levers"], config, state, shape,
                                                               device, dry_run))):
        try:
            details[name] = job()
        except Exception:  # noqa: BLE001 - reported, the others still run
            details["errors"][name] = traceback.format_exc()[-2500:]
        write_partial(options, details)


def _numerics(details: dict, kept: dict, state: dict, shape: dict, device: str, timing: dict) -> dict[str, Any]:
    """The fastest variant and the fp32-residual reference, trained from the same initial weights on the same
    real-text batches for `numerics_steps` steps, and the reference again with another dropout seed (what the
    noise alone moves); their loss curves compared (NUMERICS_TOLERANCE)."""
    best = details["best"]["name"]
    static = {name for name, built in kept.items() if built.variant.static}
    candidate = best if best != REFERENCE and best in static else DEFAULT_BEST
    if candidate not in kept or REFERENCE not in kept:
        raise RuntimeError(f"numerics need the steps {candidate!r} and {REFERENCE!r}; one failed")
    from bertkit.data import collate_static
    from gpu_check.text_rows import full_rows

    host = [collate_static(full_rows(shape["batch"], shape["seq_length"], shape["predictions"], seed=1000 + i), 0,
                           shape["seq_length"], shape["predictions"]) for i in range(timing["numerics_batches"])]
    steps = timing["numerics_steps"]
    curves = {"reference": _train_curve(kept[REFERENCE], state, host, steps, device, seed=0),
              "reference, another dropout seed": _train_curve(kept[REFERENCE], state, host, steps, device, seed=1),
              "candidate": _train_curve(kept[candidate], state, host, steps, device, seed=0)}
    window = min(NUMERICS_TOLERANCE["window"], steps)
    means = {name: [statistics.fmean(c[i:i + window]) for i in range(0, steps - window + 1, window)]
             for name, c in curves.items()}
    noise = max(abs(a - b) for a, b in zip(means["reference"], means["reference, another dropout seed"]))
    gaps = [abs(a - b) for a, b in zip(means["reference"], means["candidate"])]
    allowed = max(NUMERICS_TOLERANCE["noise_factor"] * noise, NUMERICS_TOLERANCE["floor_nats"])
    final = gaps[-1] / abs(means["reference"][-1])
    agree = max(gaps) <= allowed and final < NUMERICS_TOLERANCE["final_relative"]
    result = {"reference": REFERENCE, "candidate": candidate, "steps": steps, "tolerance": NUMERICS_TOLERANCE,
              "window_means": means, "seed_noise_nats": noise, "allowed_gap_nats": allowed,
              "max_window_gap": max(gaps), "final_relative_gap": final, "agree": agree,
              "first_last": {name: [c[0], c[-1]] for name, c in curves.items()}}
    if not agree:
        details["errors"]["numerics"] = (f"loss curves differ: max window gap {max(gaps):.3f} nats (allowed "
                                         f"{allowed:.3f}: the reference's own seed-to-seed gap {noise:.3f} x "
                                         f"{NUMERICS_TOLERANCE['noise_factor']:g}), final {final:.1%}")
    return result


def _train_curve(built: Built, state: dict, host: list[dict], steps: int, device: str, seed: int) -> list[float]:
    """Per-step losses of `built`'s objective trained from `state` with a fresh AdamW (peak 1e-4, 10% warmup,
    linear decay) over `host` batches in turn; `seed` seeds dropout."""
    import torch

    from bertkit.train.optim import build_optimizer, warmup_linear_decay

    built.model.load_state_dict(state)
    optimizer = build_optimizer(built.model, "adamw", 1e-4, 0.01, (0.9, 0.999), 1e-6)
    step = _static_step(built.model, optimizer, built.objective)  # the same (compiled) objective, a new optimizer
    torch.manual_seed(seed)
    losses = []
    for index in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = 1e-4 * warmup_linear_decay(index / steps, 0.1)
        batch = {k: v.to(device) for k, v in host[index % len(host)].items()}
        totals = {k: v.clamp(min=1).to(device, torch.float64) for k, v in _counts(batch).items()}
        losses.append(step(batch, totals))
    return [float(x) for x in torch.stack(losses).tolist()]


def _counts(batch: dict) -> dict:
    import torch

    return {"mlm": batch["masked_lm_weights"].sum().cpu(), "nsp": torch.tensor(len(batch["nsp_labels"]))}


KERNEL_KINDS = (  # (kind, substrings of the kernel name, lower case); the first match wins
    ("bertkit triton", ("bertkit_",)),  # bertkit.kernels' jit functions are named bertkit_*
    ("inductor fused", ("triton_",)),  # Inductor names its generated kernels triton_{poi,red,per}_fused_*
    ("attention", ("flash", "fmha", "attention", "sdpa")),
    ("matmul", ("gemm", "cutlass", "xmma", "nvjet", "cublas", "sm90_", "sm80_", "aten::mm", "aten::addmm",
                "aten::bmm")),
    ("optimizer", ("adam", "multi_tensor", "foreach")),
    ("copy / cast", ("copy", "memcpy", "memset", "cast", "fill")),
)


def _kind(name: str) -> str:
    lowered = name.lower()
    return next((kind for kind, keys in KERNEL_KINDS if any(key in lowered for key in keys)), "other")


def _profile(built: Built | None, device: str, steps: int) -> dict[str, Any]:
    """Where the fastest variant's step spends its time: kernels by kind, the top kernels by name (Inductor's
    fused kernels are its `triton_*` names), GPU busy time against wall time."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    if built is None:
        raise RuntimeError("the fastest variant's step was not kept")
    pairs = list(zip(built.batches, built.totals))
    built.step(*pairs[0])
    _sync(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        started = time.perf_counter()
        for index in range(steps):
            built.step(*pairs[index % len(pairs)])
        _sync(device)
        wall = time.perf_counter() - started
    attribute = "self_device_time_total" if device == "cuda" else "self_cpu_time_total"
    kernels: dict[str, float] = {}
    counts: dict[str, int] = {}
    for event in prof.key_averages():
        if device == "cuda" and event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        microseconds = float(getattr(event, attribute, 0.0) or 0.0)
        if microseconds > 0:
            kernels[event.key] = kernels.get(event.key, 0.0) + microseconds
            counts[event.key] = counts.get(event.key, 0) + int(event.count)
    by_kind: dict[str, float] = {}
    for name, microseconds in kernels.items():
        by_kind[_kind(name)] = by_kind.get(_kind(name), 0.0) + microseconds / 1e3 / steps
    busy = sum(kernels.values()) / 1e6
    top = sorted(kernels.items(), key=lambda item: -item[1])[:30]
    return {"variant": built.variant.name, "steps": steps, "wall_ms_per_step": 1e3 * wall / steps,
            "busy_ms_per_step": 1e3 * busy / steps, "busy_fraction": busy / wall if wall else None,
            "by_kind_ms_per_step": dict(sorted(by_kind.items(), key=lambda item: -item[1])),
            "top_kernels": [{"name": name[:160], "kind": _kind(name), "ms_per_step": us / 1e3 / steps,
                             "calls_per_step": counts[name] / steps} for name, us in top],
            "timed_on": "GPU kernels" if device == "cuda" else "CPU operators (dry run)"}


def _largest_batch(levers: dict[str, bool], config: Any, state: dict, shape: dict, device: str,
                   dry_run: bool) -> dict[str, Any]:
    """The largest batch (doubling from the ladder's) at which one eager step with the fastest variant's kernels
    fits in GPU memory, and its peak; compiled steps need no more memory than eager ones."""
    import torch

    from gpu_check.text_rows import full_rows

    eager = Variant("largest batch probe", static=True, norm=levers.get("norm", False),
                    gelu=levers.get("gelu", False), loss=levers.get("loss", False))
    sizes = [shape["batch"] * 2 ** k for k in range(1 if dry_run else 5)]
    found: dict[str, Any] = {"tried": {}, "largest": None, "peak_memory_gib": None}
    for size in sizes:
        built = None
        try:
            items = [full_rows(size, shape["seq_length"], shape["predictions"], seed=7)]
            built = build(eager, config, state, items, {**shape, "batch": size}, device, dry_run)
            if device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            built.step(built.batches[0], built.totals[0])
            _sync(device)
            memory = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None
            found["tried"][size] = "fits"
            found.update(largest=size, peak_memory_gib=None if memory is None else round(memory, 2))
        except torch.cuda.OutOfMemoryError:
            found["tried"][size] = "out of memory"
            break
        finally:
            built = None
            _release()
    return found


def _phase2_padded(details: dict, kept: dict, config: Any, state: dict, shape: dict, device: str, timing: dict,
                   peak: float, options: dict, dry_run: bool) -> None:
    """The fastest variant on real phase-2 instances (bertkit's data pipeline, Google's rules): padded rows,
    unpadded in the step (the collator's layout; varlen flash attention with dropout on a GPU); tokens/s counts
    real tokens only."""
    import traceback

    from gpu_check.text_rows import phase2_items

    try:
        count = shape["batch"] * timing["batches"]
        items, predictions = phase2_items(count, shape["seq_length"], Path(options["work"]))
        batches = [items[i * shape["batch"]:(i + 1) * shape["batch"]] for i in range(timing["batches"])]
        levers = dict(options.get("best_levers") or {}) or next(v.levers() for v in LADDER if v.name == DEFAULT_BEST)
        variant = Variant("fastest variant, real padded phase-2 data (unpadded)", **{**levers, "cuda_graphs": False})
        padded_shape = {**shape, "predictions": predictions}
        flops = model_flops(batches, config)
        _measure(variant, config, state, batches, padded_shape, device, timing, flops, peak, details, kept, dry_run)
        real = sum(len(i["input_ids"]) for batch in batches for i in batch)
        details["phase2_data"] = {"instances": count, "fill": real / (count * shape["seq_length"]),
                                  "max_predictions": predictions,
                                  "note": "tokens/s and MFU of this row count real tokens only"}
    except Exception:  # noqa: BLE001 - reported
        details["errors"]["phase2 padded"] = traceback.format_exc()[-2500:]
    write_partial(options, details)
