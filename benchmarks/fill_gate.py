"""The CPU training attention's fill gate: whole steps on a corpus's own batches with the fixed gate and the measured.

    python benchmarks/fill_gate.py --data data/                        # bert-mini, 16 x 64, bf16 (the short recipe)
    python benchmarks/fill_gate.py --data data/ --rounds 5 --batches 40

BertForMaskedLM, dropout 0, attending as `bertkit pretrain` does on this CPU (the probe's measured kernels). First
the gate is measured as a run measures it (`bertkit.workflows.fill_gate.measured_gate`, its line printed); then
`--batches` batches of `--batch-size` instances of the data directory, drawn with a fixed seed, cut to
`--seq-length` and padded to the longest of each batch, are trained on with the fixed gate (`attention.MIN_BMM_FILL`)
and with the measured one, rounds alternating in one process so that the machine's drift hits both alike. Printed:
the batches' fills, how many fall under each gate, and the median ms/step of each with their ratio.
"""

from __future__ import annotations

import argparse
import logging
import random
import statistics
import time

import torch

from bertkit.config import preset
from bertkit.data import PretrainingDataset, collate_pretraining
from bertkit.model import BertForMaskedLM
from bertkit.model.accelerate import train_as_measured
from bertkit.model.attention import MIN_BMM_FILL, Dispatch
from bertkit.runtime import probe, report
from bertkit.tasks.pretraining import pretraining_loss
from bertkit.workflows.fill_gate import measured_gate


def milliseconds_per_step(config, batches: list[dict], gate: float, precision: str, warmup: int = 3) -> float:
    torch.manual_seed(0)
    model = BertForMaskedLM(config).train()
    train_as_measured(model, probe.choices(config.hidden_size))
    model.bert.attention = Dispatch(model.bert.attention.cpu, gate)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    times = []
    for index in range(warmup + len(batches)):
        started = time.perf_counter()
        with torch.autocast("cpu", torch.bfloat16, enabled=precision == "bf16"):
            loss, _ = pretraining_loss(model, batches[index % len(batches)], nsp=False)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times[warmup:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="a `bertkit data pretraining` output directory")
    parser.add_argument("--model", default="bert-mini")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-length", type=int, default=64)
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="bf16")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.INFO, format="# %(message)s")
    print(report.header())
    dataset = PretrainingDataset(args.data, max_seq_length=args.seq_length, masked_lm_prob=0.3)
    draw = random.Random(0)
    pad = int(dataset.manifest["tokenizer"]["special_token_ids"]["pad"])
    batches = [collate_pretraining([dataset[draw.randrange(len(dataset))] for _ in range(args.batch_size)], pad)
               for _ in range(args.batches)]
    config = preset(args.model, vocab_size=dataset.vocab_size, hidden_dropout_prob=0.0,
                    attention_probs_dropout_prob=0.0)
    probe_model = BertForMaskedLM(config)
    train_as_measured(probe_model, probe.choices(config.hidden_size))
    measured = measured_gate(probe_model, args.precision, args.batch_size, args.seq_length)
    if measured is None:
        raise SystemExit("no gate to measure here: the probe chose SDPA at this length and precision, or "
                         "BERTKIT_PROBE_FILE / BERTKIT_CPU_KERNELS=0 is set")
    fills = [float(b["attention_mask"].float().mean()) for b in batches]
    print(f"# {args.data}: {len(batches)} batches of {args.batch_size} x {args.seq_length}, mean fill "
          f"{statistics.mean(fills):.1%}; under the fixed gate {MIN_BMM_FILL:.1%}: "
          f"{sum(f < MIN_BMM_FILL for f in fills)}, under the measured {measured.gate:.1%}: "
          f"{sum(f < measured.gate for f in fills)}")
    gates = {"fixed": MIN_BMM_FILL, "measured": measured.gate}
    results: dict[str, list[float]] = {name: [] for name in gates}
    for _ in range(args.rounds):
        for name, gate in gates.items():
            results[name].append(milliseconds_per_step(config, batches, gate, args.precision))
    fixed, ours = (statistics.median(results[name]) for name in gates)
    print(f"fixed gate: {fixed:.1f} ms/step; measured gate: {ours:.1f} ms/step; {fixed / ours:.3f}x "
          f"(rounds: {', '.join(f'{a:.1f}/{b:.1f}' for a, b in zip(results['fixed'], results['measured']))})")


if __name__ == "__main__":
    main()
