"""Full rows at the machine's limit (issue 30, item 2): bertkit's inference forward on 32 x 128 rows of
running text against the measured rate of the same model's dense layers, and where the rest goes.

    python benchmarks/full_rows.py                                  # bert-base, fp32 and int8, 2 threads
    python benchmarks/full_rows.py --precision fp32 --rounds 5 --profile

The dense-layer rate is what the encoder's four matrix multiplies (Q|K|V, attention output, feed-forward in
and out) reach on their own, at the model's shapes and the batch's 4,096 tokens, by the kernel bertkit's
inference copy runs for that precision (fp32/bf16: the faster of F.linear and oneDNN with a packed weight,
bias included; int8: `Int8Linear`, the activations' quantization included), with the same threads. The
model's rate counts its useful FLOPs (dense 24*D^2 per token and layer plus attention 4*D per token pair),
so 100% would be a forward that is nothing but its dense layers at their standalone speed.

Dense layers and forwards alternate within each round, so a shared machine's drift touches both alike;
the ratio printed is the median over rounds. `--profile` adds a per-op breakdown of one forward
(torch.profiler, grouped: dense layers, attention, GELU, LayerNorm, adds, copies, the rest).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bertkit.config import preset
from bertkit.model import BertModel, for_inference
from bertkit.model.accelerate import Int8Linear, PackedLinear, onednn_works
from bertkit.runtime import report
from bertkit.tokenizer import WordPieceTokenizer
from inference import VOCAB, full_batches, sentences, useful_flops

GROUPS = {  # profiler op names -> category, the first match wins (exact names, so addcmul is not an add)
    "dense layers": ("aten::addmm", "mkldnn::_linear_pointwise", "mkldnn::_linear_pointwise.binary",
                     "onednn::qlinear_pointwise", "aten::mm", "aten::linear"),
    "attention": ("aten::_scaled_dot_product_flash_attention_for_cpu", "aten::scaled_dot_product_attention",
                  "aten::bmm", "aten::_softmax", "aten::baddbmm"),
    "int8 quantization and row scales": ("aten::amax", "aten::amin", "aten::addcmul", "aten::reciprocal",
                                         "aten::maximum", "aten::full", "aten::fill_", "aten::div_", "aten::clamp_",
                                         "aten::mul_"),
    "GELU": ("aten::gelu", "aten::gelu_"),
    "LayerNorm": ("aten::native_layer_norm", "aten::layer_norm"),
    "adds": ("aten::add", "aten::add_"),
    "copies and casts": ("aten::copy_", "aten::to", "aten::_to_copy", "aten::contiguous", "aten::clone"),
    "embeddings": ("aten::embedding", "aten::index_select"),
}


def dense_layers(config, precision: str, tokens: int) -> tuple[list, float]:
    """The encoder's dense layers as bertkit's inference copy runs them, one weight set per layer as the
    model has (a weight reused from cache would flatter the rate), on random inputs of `tokens` rows,
    each shape by its faster kernel here; and their FLOPs."""
    torch.manual_seed(1)
    width, inner = config.hidden_size, config.intermediate_size
    shapes = [(width, 3 * width), (width, width), (width, inner), (inner, width)]
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    inputs = {fan_in: torch.randn(tokens, fan_in).to(dtype) for fan_in in (width, inner)}
    kernels = {"int8": [lambda linear: Int8Linear(linear)]}.get(precision, [
        lambda linear: lambda x: F.linear(x, linear.weight, linear.bias)])
    if precision != "int8" and onednn_works(dtype):  # packed oneDNN only where this CPU runs it in dtype
        kernels.append(lambda linear: PackedLinear(linear))
    calls = []
    for fan_in, fan_out in shapes:
        x = inputs[fan_in]
        layers = [torch.nn.Linear(fan_in, fan_out).to(dtype) for _ in range(config.num_hidden_layers)]
        by_kernel = [[kernel(linear) for linear in layers] for kernel in kernels]
        fastest = min(by_kernel, key=lambda made: _best_of_two(made[0], x))
        calls += [lambda layer=layer, x=x: layer(x) for layer in fastest]
    flops = 2 * tokens * sum(a * b for a, b in shapes) * config.num_hidden_layers
    return calls, flops


def _best_of_two(layer, x) -> float:
    return min(_seconds(lambda: layer(x)) for _ in range(2))


def _seconds(call) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def profile(model, ids, mask) -> dict[str, float]:
    """Self CPU seconds of one forward, by category (GROUPS)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        model(ids, attention_mask=mask)
    seconds: dict[str, float] = defaultdict(float)
    for event in prof.key_averages():
        group = next((g for g, names in GROUPS.items() if event.key in names), "the rest")
        seconds[group] += event.self_cpu_time_total / 1e6
    return dict(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="bert-base")
    parser.add_argument("--precision", default="fp32,int8", help="comma-separated: fp32, bf16, int8")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--profile", action="store_true", help="also a per-op breakdown of one forward")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = preset(args.shape, vocab_size=30522)
    print(report.header(config.hidden_size))
    tokenizer = WordPieceTokenizer.from_pretrained(VOCAB)
    (ids, mask), = full_batches(tokenizer, sentences(), 1)
    model_flops = useful_flops(mask, config.hidden_size, config.num_hidden_layers)
    torch.manual_seed(0)
    model = BertModel(config).eval()
    print(f"# {args.shape}, one batch of {ids.shape[0]} x {ids.shape[1]} full rows, {args.threads} threads, "
          f"median of {args.rounds} alternating rounds")
    print("| precision | dense layers GFLOP/s | forward GFLOP/s | tokens/s | forward / dense |")
    print("|---|---|---|---|---|")
    breakdowns = {}
    for precision in args.precision.split(","):
        fast = for_inference(model, precision)
        calls, dense_flops = dense_layers(config, precision, ids.numel())
        dense_rates, model_rates = [], []
        with torch.inference_mode():
            fast(ids, attention_mask=mask)
            for _ in range(args.rounds):
                dense_rates.append(dense_flops / sum(_seconds(call) for call in calls))
                model_rates.append(model_flops / _seconds(lambda fast=fast: fast(ids, attention_mask=mask)))
            ratio = statistics.median(m / d for m, d in zip(model_rates, dense_rates))
            if args.profile:
                breakdowns[precision] = profile(fast, ids, mask)
        model_rate = statistics.median(model_rates)
        print(f"| {precision} | {statistics.median(dense_rates) / 1e9:.0f} | {model_rate / 1e9:.0f} | "
              f"{model_rate / model_flops * ids.numel():.0f} | {100 * ratio:.0f}% |", flush=True)
    for precision, seconds in breakdowns.items():
        total = sum(seconds.values())
        parts = ", ".join(f"{g} {s * 1e3:.0f} ms ({100 * s / total:.0f}%)"
                          for g, s in sorted(seconds.items(), key=lambda item: -item[1]))
        print(f"{precision} forward, {total * 1e3:.0f} ms of CPU time: {parts}")


if __name__ == "__main__":
    main()
