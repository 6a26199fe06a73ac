"""Optional part: `--gradient-checkpointing` on bert-base at 512 tokens (issue 27's measurement).

The same bf16 pre-training step as the throughput part (full rows, 15% masked), at max_seq_length 512,
with and without gradient checkpointing, on the same weights: ms/step (median of rounds, the two
alternating) and the peak of allocated GPU memory (torch.cuda.max_memory_allocated, reset before each
round). Also the largest batch of a list that fits each way.
"""

from __future__ import annotations

import gc
import statistics
from typing import Any

from gpu_check.throughput import benchmark, full_rows

GPU = {"model": "bert-base", "vocab_size": 30522, "seq_length": 512, "batch": 32, "steps": 4, "rounds": 3,
       "fit_batches": (64, 128, 256, 512)}
DRY = {"model": "bert-debug", "vocab_size": 2048, "seq_length": 64, "batch": 2, "steps": 1, "rounds": 1,
       "fit_batches": (4,)}
MODES = ("plain", "checkpointed")


def run(options: dict[str, Any]) -> tuple[str, dict[str, Any], str | None]:
    import torch

    from bertkit.model import enable_gradient_checkpointing

    bench = benchmark()
    dry_run = options["dry_run"]
    device = "cpu" if dry_run else "cuda"
    shape = DRY if dry_run else GPU
    base = bench.build_models(shape["model"], shape["vocab_size"], ("bertkit",))["bertkit"]
    config = base.config.replace(max_position_embeddings=max(base.config.max_position_embeddings, shape["seq_length"]))
    models = {}
    for mode in MODES:
        torch.manual_seed(0)
        model = type(base)(config)
        if mode == "checkpointed":
            enable_gradient_checkpointing(model)
        models[mode] = model.to(device).train()
    optimizers = {mode: bench.optimizer_for("bertkit", model) for mode, model in models.items()}
    autocast = bench.autocast_for("bf16", device)
    step = bench.STEPS["bertkit"]
    generator = torch.Generator().manual_seed(0)
    batches = [full_rows(shape["batch"], shape["seq_length"], config.vocab_size, generator, device)
               for _ in range(shape["steps"])]
    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    memory: dict[str, float] = {}
    for round_index in range(shape["rounds"] + 1):
        for mode in (MODES if round_index % 2 else tuple(reversed(MODES))):
            if device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            elapsed = bench.timed_round(models[mode], step, optimizers[mode], batches, autocast, device)
            if device == "cuda":
                memory[mode] = max(memory.get(mode, 0.0), torch.cuda.max_memory_allocated() / 2**30)
            if round_index:
                times[mode].append(elapsed)
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    details: dict[str, Any] = {"model": shape["model"], "seq_length": shape["seq_length"], "batch": shape["batch"],
                               "precision": "bf16", "device": name, "results": {}, "largest_batch": {}}
    tokens = shape["batch"] * shape["seq_length"] * len(batches)
    for mode in MODES:
        seconds = statistics.median(times[mode])
        details["results"][mode] = {"ms_per_step": 1e3 * seconds / len(batches), "tokens_per_s": tokens / seconds,
                                    "peak_allocated_gib": round(memory[mode], 2) if mode in memory else None}
    plain, ckpt = details["results"]["plain"], details["results"]["checkpointed"]
    details["time_ratio"] = ckpt["ms_per_step"] / plain["ms_per_step"]
    if plain["peak_allocated_gib"]:
        details["memory_ratio"] = ckpt["peak_allocated_gib"] / plain["peak_allocated_gib"]
    if device == "cuda":
        for mode in MODES:
            largest = None
            for size in shape["fit_batches"]:
                trial = full_rows(size, shape["seq_length"], config.vocab_size, generator, device)
                try:
                    bench.timed_round(models[mode], step, optimizers[mode], [trial], autocast, device)
                    largest = size
                except torch.cuda.OutOfMemoryError:
                    break
                finally:
                    del trial
                    optimizers[mode].zero_grad(set_to_none=True)
                    gc.collect()
                    torch.cuda.empty_cache()
            details["largest_batch"][mode] = largest
    print(details, flush=True)
    return "passed", details, None
