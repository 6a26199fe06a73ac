"""Part 4, bert-base phase-1 pre-training throughput and MFU, bertkit against transformers, one process.

A step is what benchmarks/pretraining.py times (its functions are imported, not copied): forward, MLM +
NSP loss, backward and a fused AdamW step; bertkit through `pretraining_loss` (padding-free encoder, the
vocabulary projection at the masked positions only), transformers' `BertForPreTraining(labels=...,
next_sentence_label=...)` with its default attention (SDPA) and dense MLM head; identical initial
weights. Inputs are phase 1's shape: full 128-token rows (no padding), 19 masked positions a row (15%,
as Google's create_pretraining_data picks them at 128 tokens), an NSP label a row.

The batch is the largest of 64, 128, 256, 512 at which one step of each fits (tried in that order, out
of memory caught); then `rounds` timed rounds of `steps` steps each, the two alternating, after an
untimed warm-up round, each round ended by torch.cuda.synchronize; the median round counts.

FLOP accounting (`benchmarks.pretraining.model_flops`, one rule for both): model FLOPs = 3 x forward
(forward + backward), forward = L x (24 D^2 per token + 4 D t^2 per sequence of t tokens) + the MLM head
(transform 2 D^2 + decoder 2 D V) at the masked tokens + pooler and NSP (2 D^2 + 4 D) per sequence; i.e.
6 x N x tokens (N = the encoder's 12 L D^2 matmul parameters) + 12 x L x D x t^2 per sequence, plus the
heads. Embeddings, LayerNorm, softmax, GELU, the loss and the optimizer are not counted. transformers also
runs the MLM head at the unmasked positions; that work is reported, not counted. bertkit runs the last layer's
output projection and feed-forward at the masked positions alone; the count has them at every token, for both
sides alike (the original's work), so a ratio of MFUs is a ratio of throughputs. MFU = model FLOP/s over
the dense datasheet peak of the GPU (H100/H200 SXM: 989 TFLOP/s bf16, 494.5 TF32), or over the measured
matmul peak where the GPU is not in the table (and always in the dry run).
"""

from __future__ import annotations

import gc
import importlib.util
import statistics
import sys
from types import ModuleType
from typing import Any

from gpu_check.environment import ROOT

NAMES = ("bertkit", "transformers")
GPU: dict[str, Any] = {"model": "bert-base", "vocab_size": 30522, "seq_length": 128, "batches": (64, 128, 256, 512),
                       "steps": 8, "rounds": 3}
DRY: dict[str, Any] = {"model": "bert-debug", "vocab_size": 2048, "seq_length": 32, "batches": (2, 4), "steps": 1,
                       "rounds": 1}
TF32_SHAPE = {"steps": 5, "rounds": 2}
MASKED_PER_ROW = {128: 19}  # round(0.15 x 128), as Google's create_pretraining_data at max_seq_length 128
CLS, SEP, MASK, FIRST_WORD = 101, 102, 103, 1000  # ids in bert-base-uncased's vocabulary
DATASHEET = (  # (name contains, dense bf16, dense TF32) TFLOP/s from NVIDIA's datasheets; first match wins
    ("H100 PCIe", 756.0, 378.0), ("H100 NVL", 835.0, 418.0), ("H200 NVL", 835.0, 418.0),
    ("H100", 989.0, 494.5), ("H200", 989.0, 494.5), ("A100", 312.0, 156.0),
)
FLOP_RULE = ("model FLOPs = 3 x forward; forward = L x (24 D^2 x tokens + 4 D x sum of t^2 over sequences) "
             "+ (2 D^2 + 2 D V) x masked tokens + (2 D^2 + 4 D) x sequences, i.e. 6 x N(encoder matmul "
             "parameters, 12 L D^2) x tokens + 12 x L x D x t^2 per sequence + the MLM head at the masked "
             "positions only + pooler/NSP, the same count for both implementations (transformers' dense MLM "
             "head at unmasked positions is extra work, not counted); embeddings, LayerNorm, softmax, GELU, "
             "loss and optimizer not counted")


def benchmark() -> ModuleType:
    """benchmarks/pretraining.py as a module (it imports its sibling `peak`)."""
    folder = ROOT / "benchmarks"
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    spec = importlib.util.spec_from_file_location("bertkit_benchmark_pretraining", folder / "pretraining.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def datasheet_peak(device_name: str, precision: str) -> float | None:
    for name, bf16, tf32 in DATASHEET:
        if name.lower() in device_name.lower():
            return bf16 if precision == "bf16" else tf32
    return None


def full_rows(batch: int, seq_length: int, vocab_size: int, generator, device: str) -> dict:
    """Phase-1 instances without padding: [CLS] A [SEP] B [SEP], 15% of the word positions masked."""
    import torch

    ids = torch.randint(FIRST_WORD, vocab_size, (batch, seq_length), generator=generator)
    middle = seq_length // 2
    ids[:, 0], ids[:, middle], ids[:, -1] = CLS, SEP, SEP
    token_type_ids = torch.zeros_like(ids)
    token_type_ids[:, middle + 1:] = 1
    words = torch.tensor([i for i in range(seq_length) if i not in (0, middle, seq_length - 1)])
    count = MASKED_PER_ROW.get(seq_length, max(1, round(0.15 * seq_length)))
    order = torch.rand(batch, len(words), generator=generator).argsort(dim=1)[:, :count]
    positions = words[order]  # (B, count) distinct word positions per row
    labels = torch.full_like(ids, -100)
    labels.scatter_(1, positions, ids.gather(1, positions))
    ids.scatter_(1, positions, MASK)
    rows = {"input_ids": ids, "token_type_ids": token_type_ids, "attention_mask": torch.ones_like(ids),
            "mlm_labels": labels, "nsp_labels": torch.randint(0, 2, (batch,), generator=generator)}
    return {key: value.to(device) for key, value in rows.items()}


def one_step_fits(bench: ModuleType, name: str, model, optimizer, batch: dict, autocast, device: str) -> bool:
    """One training step at this batch; False when it ran out of GPU memory (memory is released)."""
    import torch

    try:
        bench.timed_round(model, bench.STEPS[name], optimizer, [batch], autocast, device)
        return True
    except torch.cuda.OutOfMemoryError:
        pass
    optimizer.zero_grad(set_to_none=True)
    gc.collect()
    torch.cuda.empty_cache()
    return False


def run(options: dict[str, Any]) -> tuple[str, dict[str, Any], str | None]:
    import torch
    import transformers

    bench = benchmark()
    from peak import matmul_peak  # benchmarks/peak.py, on sys.path now

    dry_run, precision = options["dry_run"], options["precision"]
    names = (*NAMES, "bertkit --compile") if options.get("compile") else NAMES
    device = "cpu" if dry_run else "cuda"
    shape = {**(DRY if dry_run else GPU), **(TF32_SHAPE if precision == "tf32" and not dry_run else {})}
    candidates = [b for b in shape["batches"] if b <= options.get("max_batch", max(shape["batches"]))]
    if precision == "tf32":  # fp32 weights and activations, matrix multiplies on TF32 tensor cores
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    built = bench.build_models(shape["model"], shape["vocab_size"], names)
    models = {name: model.to(device) for name, model in built.items()}
    optimizers = {name: bench.optimizer_for(name, model) for name, model in models.items()}
    autocast = bench.autocast_for("bf16" if precision == "bf16" else "fp32", device)
    config = models["bertkit"].config
    seq_length = shape["seq_length"]
    generator = torch.Generator().manual_seed(0)
    details: dict[str, Any] = {
        "model": shape["model"], "precision": precision, "seq_length": seq_length, "device": device,
        "device_name": torch.cuda.get_device_name() if device == "cuda" else f"CPU, {torch.get_num_threads()} threads",
        "torch": torch.__version__, "transformers": transformers.__version__,
        "transformers_attention": getattr(models["transformers"].config, "_attn_implementation", None),
        "flop_rule": FLOP_RULE, "search": []}

    batch_size = None
    for size in candidates:
        trial = full_rows(size, seq_length, config.vocab_size, generator, device)
        short = next((name for name in names if not one_step_fits(bench, name, models[name], optimizers[name], trial,
                                                                   autocast, device)), None)
        details["search"].append({"batch": size, "result": "fits" if short is None else f"out of memory ({short})"})
        print(f"batch {size}: {details['search'][-1]['result']}", flush=True)
        del trial
        if short is not None:
            break
        batch_size = size
    if batch_size is None:
        return "failed", details, f"no batch of {candidates} fits both implementations"
    details["batch"] = batch_size

    batches = [full_rows(batch_size, seq_length, config.vocab_size, generator, device) for _ in range(shape["steps"])]
    times: dict[str, list[float]] = {name: [] for name in names}
    memory: dict[str, float] = {}
    for round_index in range(shape["rounds"] + 1):  # round 0 warms up and is not counted
        for name in (names if round_index % 2 else tuple(reversed(names))):
            if device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            elapsed = bench.timed_round(models[name], bench.STEPS[name], optimizers[name], batches, autocast, device)
            if device == "cuda":
                memory[name] = max(memory.get(name, 0.0), torch.cuda.max_memory_allocated() / 2**30)
            if round_index:
                times[name].append(elapsed)

    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    measured = matmul_peak(dtype, device, size=None if device == "cuda" else 512)
    datasheet = None if dry_run else datasheet_peak(details["device_name"], precision)
    peak, peak_source = ((datasheet, f"datasheet dense {precision} of {details['device_name']}") if datasheet
                         else (measured, f"measured {dtype} matmul on this device"))
    flops = bench.model_flops(batches, config)  # the whole round
    tokens = sum(int(b["attention_mask"].sum()) for b in batches)
    masked = sum(int((b["mlm_labels"] != -100).sum()) for b in batches)
    d, v = config.hidden_size, config.vocab_size
    unmasked_head = 3 * (tokens - masked) * (2 * d * d + 2 * d * v)
    details.update(peak_tflops=peak, peak_source=peak_source, measured_matmul_tflops=measured,
                   steps_per_round=len(batches), rounds=shape["rounds"], tokens_per_step=tokens // len(batches),
                   masked_per_step=masked // len(batches), model_tflop_per_step=flops / len(batches) / 1e12,
                   transformers_uncounted_head_fraction=unmasked_head / flops, results={})
    for name in names:
        seconds = statistics.median(times[name])
        achieved = flops / seconds / 1e12
        details["results"][name] = {
            "ms_per_step": 1000 * seconds / len(batches), "tokens_per_s": tokens / seconds,
            "model_tflops": achieved, "mfu": achieved / peak, "mfu_vs_measured_matmul": achieved / measured,
            "peak_memory_gib": round(memory[name], 2) if name in memory else None,
            "round_seconds": [round(t, 4) for t in times[name]]}
        print(f"{name}: {details['results'][name]}", flush=True)
    rates = {name: details["results"][name]["tokens_per_s"] for name in names}
    details["ratio"] = rates["bertkit"] / rates["transformers"]
    if "bertkit --compile" in rates:
        details["compile_ratio"] = rates["bertkit --compile"] / rates["transformers"]
    return "passed", details, None
