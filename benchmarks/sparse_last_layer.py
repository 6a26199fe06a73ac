"""The last layer at the masked positions only: a whole training step with it and with the full last layer.

    python benchmarks/sparse_last_layer.py                                   # bert-mini, 16 x 64, bf16
    python benchmarks/sparse_last_layer.py --model bert-base --batch-size 8 --seq-length 128 --steps 3

BertForMaskedLM (the short recipe's model), dropout 0 (its setting), 15% of the positions masked, MLM loss
(`pretraining_loss`), forward + backward + fused AdamW, attending as `bertkit pretrain` does on this CPU (the
probe's measured kernels). The full last layer is the same model with `output_positions` withheld from the
encoder (it then runs every layer in full and selects afterwards, as before). Rounds of `--steps` steps alternate
between the two in one process, so the machine's drift hits both alike; printed: the median ms/step of each and
their ratio, and each round's ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time
from unittest import mock

import torch

import bertkit.model.bert as bert
from bertkit.config import preset
from bertkit.model import BertForMaskedLM
from bertkit.model.accelerate import train_as_measured
from bertkit.runtime import probe, report
from bertkit.tasks.pretraining import pretraining_loss


def batches(config, batch_size: int, length: int, count: int = 6) -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    made = []
    for _ in range(count):
        ids = torch.randint(5, config.vocab_size, (batch_size, length), generator=generator)
        labels = torch.full_like(ids, -100)
        chosen = torch.rand(ids.shape, generator=generator) < 0.15
        labels[chosen] = ids[chosen]
        made.append({"input_ids": ids, "token_type_ids": torch.zeros_like(ids),
                     "attention_mask": torch.ones_like(ids), "mlm_labels": labels})
    return made


def seconds_per_step(model, optimizer, data, steps: int, sparse: bool, precision: str) -> float:
    full = mock.patch.object(bert, "_has_rows", lambda x, layout: False)  # the encoder then runs in full
    with (mock.patch.object(bert, "_has_rows", bert._has_rows) if sparse else full):
        start = time.perf_counter()
        for step in range(steps):
            with torch.autocast("cpu", torch.bfloat16, enabled=precision == "bf16"):
                loss, _ = pretraining_loss(model, data[step % len(data)], nsp=False)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="bert-mini")
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-length", type=int, default=64)
    parser.add_argument("--steps", type=int, default=20, help="steps per timed round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="bf16")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(report.header())
    config = preset(args.model, vocab_size=args.vocab_size, attention_probs_dropout_prob=0.0,
                    hidden_dropout_prob=0.0)
    torch.manual_seed(0)
    model = BertForMaskedLM(config).train()
    train_as_measured(model, probe.choices(config.hidden_size))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    data = batches(config, args.batch_size, args.seq_length)
    for sparse in (True, False):  # warm-up, not timed
        seconds_per_step(model, optimizer, data, 3, sparse, args.precision)
    sparse_times, full_times = [], []
    for _ in range(args.rounds):
        sparse_times.append(seconds_per_step(model, optimizer, data, args.steps, True, args.precision))
        full_times.append(seconds_per_step(model, optimizer, data, args.steps, False, args.precision))
    sparse_ms, full_ms = 1000 * statistics.median(sparse_times), 1000 * statistics.median(full_times)
    print(f"# {args.model}, {args.batch_size} x {args.seq_length}, {args.precision}, {args.threads} threads, "
          f"{args.rounds} rounds of {args.steps} steps")
    print(f"last layer at the masked positions: {sparse_ms:.1f} ms/step; in full: {full_ms:.1f} ms/step; "
          f"{full_ms / sparse_ms:.3f}x (rounds: {', '.join(f'{f / s:.3f}' for s, f in zip(sparse_times, full_times))})")


if __name__ == "__main__":
    main()
