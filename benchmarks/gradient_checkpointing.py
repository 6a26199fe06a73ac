"""`--gradient-checkpointing`: step time and peak memory with and without, bert-base at 512 tokens.

    python benchmarks/gradient_checkpointing.py                          # CPU, fp32, batch 2 x 512
    python benchmarks/gradient_checkpointing.py --batch-size 4 --precision bf16 --steps 3

Each mode runs in a process of its own (a process's peak resident memory cannot be reset): bert-base
BertForPreTraining, full 512-token rows with 15% masked, MLM + NSP loss, forward + backward + AdamW, one
untimed warm-up step and `--steps` timed ones; printed: ms/step, the process's peak RSS, and the peak
above the RSS once the model and the optimizer state exist (what the step itself adds: activations,
gradients). On a GPU (`--device cuda`), the peak of allocated memory instead. The GPU figures in
docs/performance.md come from scripts/gpu_check (its `checkpointing` part), which measures the same step.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

MODES = ("plain", "checkpointed")


def child(args: argparse.Namespace) -> dict:
    import torch

    from bertkit.config import preset
    from bertkit.model import BertForPreTraining, enable_gradient_checkpointing
    from bertkit.tasks.pretraining import pretraining_loss

    torch.manual_seed(0)
    model = BertForPreTraining(preset(args.model, vocab_size=30522)).to(args.device).train()
    if args.child == "checkpointed":
        enable_gradient_checkpointing(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, 30522, (args.batch_size, args.seq_length), generator=generator)
    masked = torch.rand(ids.shape, generator=generator) < 0.15
    batch = {"input_ids": torch.where(masked, torch.full_like(ids, 103), ids),
             "token_type_ids": (torch.arange(args.seq_length) >= args.seq_length // 2).long().expand_as(ids),
             "attention_mask": torch.ones_like(ids), "mlm_labels": torch.where(masked, ids, torch.full_like(ids, -100)),
             "nsp_labels": torch.randint(0, 2, (args.batch_size,), generator=generator)}
    batch = {k: v.to(args.device) for k, v in batch.items()}
    autocast = torch.autocast(args.device, dtype=torch.bfloat16, enabled=args.precision == "bf16")

    def step() -> None:
        with autocast:
            loss = pretraining_loss(model, batch)[0]
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for parameter in model.parameters():  # AdamW's state exists before the measured peak
        parameter.grad = torch.zeros_like(parameter)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    base_rss = current_rss_mib()
    if args.device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base_cuda = torch.cuda.memory_allocated() / 2**20
    step()  # warm-up
    started = time.perf_counter()
    for _ in range(args.steps):
        step()
    if args.device == "cuda":
        torch.cuda.synchronize()
    seconds = (time.perf_counter() - started) / args.steps
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result = {"mode": args.child, "ms_per_step": 1e3 * seconds, "peak_rss_mib": peak_rss,
              "step_rss_mib": peak_rss - base_rss}
    if args.device == "cuda":
        result["peak_cuda_mib"] = torch.cuda.max_memory_allocated() / 2**20
        result["step_cuda_mib"] = result["peak_cuda_mib"] - base_cuda
    return result


def current_rss_mib() -> float:
    with open("/proc/self/statm") as handle:
        pages = int(handle.read().split()[1])
    return pages * resource.getpagesize() / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="bert-base")
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--seq-length", type=int, default=512)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return
    from bertkit.runtime import probe

    print(f"# machine: {probe.machine().line()}")
    print(f"{args.model}, batch {args.batch_size} x {args.seq_length} tokens, {args.precision}, {args.device}, "
          f"{args.steps} timed steps after a warm-up, each mode in its own process")
    results = {}
    for mode in MODES:
        command = [sys.executable, __file__, "--child", mode, *sys.argv[1:]]
        output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        results[mode] = json.loads(output.strip().splitlines()[-1])
        print(json.dumps(results[mode]))
    plain, checkpointed = results["plain"], results["checkpointed"]
    key = "step_cuda_mib" if args.device == "cuda" else "step_rss_mib"
    print(f"checkpointed / plain: {checkpointed['ms_per_step'] / plain['ms_per_step']:.2f}x the step time, "
          f"{checkpointed[key] / plain[key]:.2f}x the memory the step adds ({key}), "
          f"{checkpointed['peak_rss_mib'] / plain['peak_rss_mib']:.2f}x the peak RSS")


if __name__ == "__main__":
    main()
