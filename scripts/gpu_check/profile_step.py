"""Optional part: where the time of bertkit's bf16 pre-training step goes on the GPU (torch.profiler).

bert-base at phase 1's shape (full 128-token rows, the throughput part's inputs), one step = forward,
MLM + NSP loss, backward, fused AdamW. After warm-up steps, `steps` steps are profiled; GPU kernel time is
summed by kind (matrix multiplies, attention, LayerNorm, dropout, GELU, other elementwise work, the
optimizer, copies), the top kernels are listed, and the GPU's busy time is set against the wall time (a
step whose GPU is idle part of the time is held back by the CPU launching kernels).
"""

from __future__ import annotations

import time
from typing import Any

from gpu_check.throughput import DRY, GPU, benchmark, full_rows

KINDS = (  # (kind, substrings of the kernel name, lower case); the first match wins
    ("attention", ("flash", "fmha", "attention", "sdpa")),
    ("matmul", ("gemm", "cutlass", "xmma", "nvjet", "cublas", "sm90_", "sm80_")),
    ("layer_norm", ("layer_norm", "layernorm")),
    ("dropout", ("dropout", "bernoulli", "philox")),
    ("gelu", ("gelu",)),
    ("optimizer", ("adam", "multi_tensor", "foreach")),
    ("loss / softmax", ("softmax", "nll", "cross_entropy", "log_softmax")),
    ("copy / cast", ("copy", "memcpy", "memset", "cast", "to_copy", "fill")),
    ("index / gather", ("index", "gather", "scatter", "embedding")),
    ("reduce", ("reduce",)),
    ("elementwise", ("elementwise", "vectorized", "unrolled")),
)


def kind_of(name: str) -> str:
    lowered = name.lower()
    return next((kind for kind, keys in KINDS if any(key in lowered for key in keys)), "other")


def run(options: dict[str, Any]) -> tuple[str, dict[str, Any], str | None]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    bench = benchmark()
    dry_run = options["dry_run"]
    device = "cpu" if dry_run else "cuda"
    shape = DRY if dry_run else GPU
    batch_size = options.get("batch", 2 if dry_run else 256)
    model = bench.build_models(shape["model"], shape["vocab_size"], ("bertkit",))["bertkit"].to(device)
    optimizer = bench.optimizer_for("bertkit", model)
    autocast = bench.autocast_for("bf16", device)
    generator = torch.Generator().manual_seed(0)
    batches = [full_rows(batch_size, shape["seq_length"], model.config.vocab_size, generator, device)
               for _ in range(2)]
    steps = 1 if dry_run else 3
    bench.timed_round(model, bench.STEPS["bertkit"], optimizer, batches, autocast, device)  # warm-up
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        started = time.perf_counter()
        for index in range(steps):
            bench.timed_round(model, bench.STEPS["bertkit"], optimizer, [batches[index % 2]], autocast, device)
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
    busy = sum(kernels.values()) / 1e6
    by_kind: dict[str, float] = {}
    for name, microseconds in kernels.items():
        by_kind[kind_of(name)] = by_kind.get(kind_of(name), 0.0) + microseconds / 1e3 / steps
    top = sorted(kernels.items(), key=lambda item: -item[1])[:25]
    details = {
        "model": shape["model"], "batch": batch_size, "seq_length": shape["seq_length"], "precision": "bf16",
        "steps": steps, "wall_ms_per_step": 1e3 * wall / steps, "busy_ms_per_step": 1e3 * busy / steps,
        "busy_fraction": busy / wall if wall else None,
        "by_kind_ms_per_step": dict(sorted(by_kind.items(), key=lambda item: -item[1])),
        "top_kernels": [{"name": name[:160], "ms_per_step": us / 1e3 / steps, "calls_per_step": counts[name] / steps,
                         "kind": kind_of(name)} for name, us in top],
        "timed_on": "GPU kernels (CUDA activity)" if device == "cuda" else "CPU operators (dry run)"}
    print(details, flush=True)
    return "passed", details, None
