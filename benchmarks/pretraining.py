"""Pre-training step throughput and memory: bertkit vs transformers' BertForPreTraining.

    python benchmarks/pretraining.py                                  # bert-base, 32 x 128, bf16
    python benchmarks/pretraining.py --model bert-small --steps 4 --rounds 2
    python benchmarks/pretraining.py --compile                        # adds bertkit with --compile
    python benchmarks/pretraining.py --memory                         # peak RSS of each, own process
    python benchmarks/pretraining.py --device cuda --batch-size 256 --peak-tflops 989   # GPU, MFU vs datasheet

A step is forward + MLM/NSP loss + backward + AdamW step (fused kernel on both sides: bertkit's own
optimizer, and the transformers Trainer's default `adamw_torch_fused`). bertkit runs its own path (padding-free
encoder, vocabulary projection only at the masked positions, `bertkit.tasks.pretraining.pretraining_loss`);
transformers runs `BertForPreTraining(labels=..., next_sentence_label=...)` (dense MLM head over every
position). Both start from identical weights (bertkit's save_pretrained, loaded by transformers) and get
the same batches: real max_seq_length-128 instances made by `bertkit data pretraining` from the bundled
King James Bible with Google's bert-base-uncased vocabulary (static masking, the original's defaults),
collated to the longest instance of each batch. Rounds alternate between the two so machine noise hits
both alike; the table reports real (non-padding) tokens per second, the ratio of medians, and model
FLOP utilisation: model FLOPs (`model_flops`: what BERT needs on the real tokens, the MLM head at the
masked positions only, x3 for forward + backward — the same count for both sides) per second over a
peak, measured (`peak.py`) or given with --peak-tflops (an H100/H200 SXM: 989 TFLOP/s dense bf16).
`--compile` adds a row, bertkit with torch.compile'd encoder layers (`bertkit pretrain --compile`);
its compilation happens in the warm-up round, which is not timed. On a CPU, bertkit's row attends as `bertkit
pretrain` does, with this machine's measured choices (bmm attention where its forward + backward measured faster
than SDPA's, dropout masks counter-based where measured faster than torch's:
`bertkit.workflows.prepare.use_measured_kernels`); `--sdpa-row` adds bertkit as it runs without those choices (SDPA,
torch's dropout), to show what they are worth.

`--memory` runs each implementation for a few steps in a fresh child process and reports its peak
resident set size (ru_maxrss): the same batches, so the difference is the implementations' own.
"""

from __future__ import annotations

import argparse
import gzip
import json
import resource
import statistics
import subprocess
import sys
import tempfile
from contextlib import nullcontext
from pathlib import Path

import torch
import transformers
from peak import matmul_peak, timed

from bertkit.assets import kjv_path
from bertkit.config import preset
from bertkit.data import InstanceSettings, PretrainingDataset, build_pretraining_data, collate_pretraining
from bertkit.model import BertForPreTraining, compile_model
from bertkit.model.accelerate import train_as_measured
from bertkit.runtime import probe, report
from bertkit.settings import PretrainingDataSettings
from bertkit.tasks.pretraining import pretraining_loss
from bertkit.tokenizer import WordPieceTokenizer
from bertkit.train.optim import build_optimizer

VOCAB = Path(__file__).resolve().parents[1] / "tests" / "assets" / "vocab" / "bert-base-uncased"


def real_batches(count: int, batch_size: int, seq_length: int, workdir: Path) -> list[dict]:
    """`count` batches of instances built by bertkit data pretraining from the bundled corpus."""
    with gzip.open(kjv_path("corpus.txt.gz"), "rt", encoding="utf-8") as handle:
        text = handle.read()
    corpus = workdir / "corpus.txt"
    corpus.write_text(text[: 400_000 * max(1, count * batch_size // 256)], encoding="utf-8")
    tokenizer = WordPieceTokenizer.from_pretrained(VOCAB)
    options = InstanceSettings(max_seq_length=seq_length, dupe_factor=1)
    build_pretraining_data(PretrainingDataSettings(
        (str(corpus),), "(in memory)", str(workdir / "data"), workers=1, quiet=True, instances=options), tokenizer)
    dataset = PretrainingDataset(workdir / "data")
    if len(dataset) < count * batch_size:
        raise SystemExit(f"only {len(dataset)} instances; ask for fewer steps")
    return [collate_pretraining([dataset[i] for i in range(b * batch_size, (b + 1) * batch_size)])
            for b in range(count)]


def bertkit_step(model, batch) -> torch.Tensor:
    return pretraining_loss(model, batch)[0]


def transformers_step(model, batch) -> torch.Tensor:
    return model(input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"],
                 attention_mask=batch["attention_mask"], labels=batch["mlm_labels"],
                 next_sentence_label=batch["nsp_labels"]).loss


STEPS = {"bertkit": bertkit_step, "bertkit --compile": bertkit_step, "bertkit, SDPA, torch's dropout": bertkit_step,
         "transformers": transformers_step}


def timed_round(model, step, optimizer, batches, autocast, device: str = "cpu") -> float:
    def run() -> None:
        for batch in batches:
            with autocast():
                loss = step(model, batch)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    return timed(run, device)


def model_flops(batches: list[dict], config) -> float:
    """Model FLOPs of forward + backward (3x forward) over the batches, on real tokens only: the
    encoder's dense layers (24 D^2 a token a layer), attention (4 D t^2 a sequence a layer), and the
    MLM head (transform + vocabulary projection) at the masked positions, as the original computes it (the last
    layer at every token, though bertkit runs most of it at the masked positions alone: the same count for both)."""
    d, layers, vocab = config.hidden_size, config.num_hidden_layers, config.vocab_size
    total = 0.0
    for batch in batches:
        lengths = batch["attention_mask"].sum(1).double()
        masked = float((batch["mlm_labels"] != -100).sum())
        total += layers * (24 * d * d * float(lengths.sum()) + 4 * d * float((lengths ** 2).sum()))
        total += masked * (2 * d * d + 2 * d * vocab) + len(lengths) * (2 * d * d + 4 * d)  # MLM head, pooler + NSP
    return 3 * total


def build_models(model_name: str, vocab_size: int, which: tuple[str, ...], device: str = "cpu",
                 dropout: float | None = None) -> dict:
    torch.manual_seed(0)
    config = preset(model_name, vocab_size=vocab_size)
    if dropout is not None:  # both sides read it from the saved config.json
        config = config.replace(hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    ours = BertForPreTraining(config)
    models = {"bertkit": ours}
    with tempfile.TemporaryDirectory() as directory:
        ours.save_pretrained(directory)
        if "bertkit, SDPA, torch's dropout" in which:
            models["bertkit, SDPA, torch's dropout"] = BertForPreTraining.from_pretrained(directory)
        if "transformers" in which:
            models["transformers"] = transformers.BertForPreTraining.from_pretrained(directory)
        if "bertkit --compile" in which:
            models["bertkit --compile"] = BertForPreTraining.from_pretrained(directory)
            compile_model(models["bertkit --compile"])
    if device == "cpu":
        train_as_measured(ours, probe.choices(config.hidden_size))  # as `bertkit pretrain` on a CPU
    return {name: models[name].train() for name in which}


def optimizer_for(name: str, model: torch.nn.Module) -> torch.optim.Optimizer:
    """What each side's trainer builds: bertkit pretrain's AdamW (fused kernel, BERT's no-decay rule) and
    the transformers Trainer's default with torch >= 2.8, `adamw_torch_fused`."""
    if name.startswith("bertkit"):
        return build_optimizer(model, "adamw", 1e-5, 0.01, (0.9, 0.999), 1e-6)
    return torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)


def autocast_for(precision: str, device: str = "cpu"):
    return (lambda: torch.autocast(device, dtype=torch.bfloat16)) if precision == "bf16" else nullcontext


def throughput(args: argparse.Namespace, batches: list[dict]) -> None:
    names = ("bertkit",) + (("bertkit --compile",) if args.compile else ()) \
        + (("bertkit, SDPA, torch's dropout",) if args.sdpa_row else ()) + ("transformers",)
    built = build_models(args.model, 30522, names, args.device, args.dropout)
    models = {name: model.to(args.device) for name, model in built.items()}
    batches = [{k: v.to(args.device) for k, v in batch.items()} for batch in batches]
    optimizers = {name: optimizer_for(name, model) for name, model in models.items()}
    autocast = autocast_for(args.precision, args.device)
    tokens = sum(int(b["attention_mask"].sum()) for b in batches)
    flops = model_flops(batches, models["bertkit"].config)
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32
    peak = args.peak_tflops or matmul_peak(dtype, args.device)
    times: dict[str, list[float]] = {name: [] for name in models}
    for round_index in range(args.rounds + 1):  # round 0 warms up (allocator, kernels) and is not counted
        order = list(models) if round_index % 2 else list(reversed(models))
        for name in order:
            elapsed = timed_round(models[name], STEPS[name], optimizers[name], batches, autocast, args.device)
            if round_index:
                times[name].append(elapsed)
    fill = tokens / sum(b["attention_mask"].numel() for b in batches)
    where = torch.cuda.get_device_name() if args.device == "cuda" else f"{torch.get_num_threads()} CPU threads"
    print(f"# {args.model}, batch {args.batch_size} x {args.seq_length} (fill {fill:.2f}), {args.precision}, "
          f"dropout {0.1 if args.dropout is None else args.dropout}, "
          f"{where}, torch {torch.__version__}, transformers {transformers.__version__}")
    peak_source = "given (--peak-tflops)" if args.peak_tflops else "measured matmul"
    print(f"# model FLOPs per step {flops / len(batches) / 1e12:.3f} T; peak {peak:.1f} TFLOP/s ({peak_source})")
    print("| implementation | ms/step | real tokens/s | model TFLOP/s | MFU |")
    print("|---|---|---|---|---|")
    rates = {}
    for name, values in times.items():
        seconds = statistics.median(values)
        rates[name] = tokens / seconds
        achieved = flops / seconds / 1e12
        print(f"| {name} | {1000 * seconds / len(batches):.0f} | {rates[name]:,.0f} | {achieved:.3f} | "
              f"{100 * achieved / peak:.0f}% |")
    for name in rates:
        if name != "transformers":
            print(f"\nratio {name} / transformers: {rates[name] / rates['transformers']:.2f}x")


def child_peak_rss(args: argparse.Namespace, batches: list[dict], name: str) -> None:
    """Run in a fresh process: a few steps of one implementation, then print its peak RSS."""
    model = build_models(args.model, 30522, (name,))[name]
    optimizer = optimizer_for(name, model)
    timed_round(model, STEPS[name], optimizer, batches, autocast_for(args.precision))
    print(json.dumps({"name": name, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def memory(args: argparse.Namespace) -> None:
    print(f"# peak RSS, {args.model}, micro-batch {args.batch_size} x {args.seq_length}, {args.precision}, "
          f"{args.steps} steps, each implementation in its own process")
    print("| implementation | peak RSS (MB) |")
    print("|---|---|")
    peaks = {}
    for name in ("bertkit", "transformers"):  # compilation adds its own memory; measured eager
        command = [sys.executable, __file__, "--child", name, "--model", args.model, "--batch-size",
                   str(args.batch_size), "--seq-length", str(args.seq_length), "--steps", str(args.steps),
                   "--precision", args.precision]
        out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
        peaks[name] = json.loads(out.strip().splitlines()[-1])["peak_rss_mb"]
        print(f"| {name} | {peaks[name]:,.0f} |", flush=True)
    print(f"\nbertkit uses {peaks['bertkit'] / peaks['transformers']:.2f}x the memory of transformers")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="bert-base", help="bertkit preset")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seq-length", type=int, default=128)
    parser.add_argument("--steps", type=int, default=3, help="steps per timed round")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per implementation (alternating)")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="bf16")
    parser.add_argument("--memory", action="store_true", help="measure peak RSS of each implementation")
    parser.add_argument("--compile", action="store_true", help="also time bertkit with compiled encoder layers")
    parser.add_argument("--dropout", type=float, default=None,
                        help="hidden and attention dropout of both models (default: BERT's 0.1; the short recipe's: 0)")
    parser.add_argument("--sdpa-row", action="store_true",
                        help="also time bertkit without the measured CPU kernels (SDPA, torch's dropout)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="peak for MFU, e.g. 989 for an H100/H200 SXM in bf16 (default: a measured matmul)")
    parser.add_argument("--child", choices=list(STEPS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not args.child:
        print(report.header(preset(args.model).hidden_size))
    if args.memory:
        memory(args)
        return
    with tempfile.TemporaryDirectory() as workdir:
        batches = real_batches(args.steps, args.batch_size, args.seq_length, Path(workdir))
    if args.child:
        child_peak_rss(args, batches, args.child)
    else:
        throughput(args, batches)


if __name__ == "__main__":
    main()
