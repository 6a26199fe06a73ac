"""Pre-training step throughput: bertkit vs transformers' BertForPreTraining, same weights, same batches,
same precision, one process, alternating.

A step is forward + MLM/NSP loss + backward + AdamW step. bertkit runs its own path (padding-free encoder,
vocabulary projection only at masked positions, `bertkit.tasks.pretraining.pretraining_loss`);
transformers runs `BertForPreTraining(labels=..., next_sentence_label=...)` (padded, dense MLM head). The
two models start from identical weights (bertkit's save_pretrained, loaded by transformers). Batches are
synthetic: lengths uniform in [seq_length/2, seq_length] (so padding is realistic), 15% of real tokens
masked. Rounds alternate between the two so machine noise hits both alike; the table reports real
(non-padding) tokens per second and the ratio.

    OMP_NUM_THREADS=2 python benchmarks/pretraining.py --model bert-mini --batch-size 32 --seq-length 128
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from contextlib import nullcontext

import torch
import transformers

from bertkit.config import preset
from bertkit.model import BertForPreTraining
from bertkit.tasks.pretraining import pretraining_loss


def synthetic_batches(count: int, batch_size: int, seq_length: int, vocab_size: int, seed: int) -> list[dict]:
    generator = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(count):
        lengths = torch.randint(seq_length // 2, seq_length + 1, (batch_size,), generator=generator)
        real = torch.arange(seq_length)[None, :] < lengths[:, None]  # (B, T)
        input_ids = torch.randint(5, vocab_size, (batch_size, seq_length), generator=generator) * real
        masked = real & (torch.rand(batch_size, seq_length, generator=generator) < 0.15)
        masked[:, 1] = True  # at least one prediction per row
        token_type_ids = (torch.arange(seq_length)[None, :] >= lengths[:, None] // 2).long() * real
        batches.append({"input_ids": input_ids, "token_type_ids": token_type_ids, "attention_mask": real.long(),
                        "mlm_labels": torch.where(masked, input_ids, -100),
                        "nsp_labels": torch.randint(0, 2, (batch_size,), generator=generator)})
    return batches


def bertkit_step(model, batch) -> torch.Tensor:
    return pretraining_loss(model, batch)[0]


def transformers_step(model, batch) -> torch.Tensor:
    return model(input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"],
                 attention_mask=batch["attention_mask"], labels=batch["mlm_labels"],
                 next_sentence_label=batch["nsp_labels"]).loss


def timed_round(model, step, optimizer, batches, autocast) -> float:
    start = time.perf_counter()
    for batch in batches:
        with autocast():
            loss = step(model, batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="bert-mini", help="bertkit preset")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seq-length", type=int, default=128)
    parser.add_argument("--vocab-size", type=int, default=30522)
    parser.add_argument("--steps", type=int, default=5, help="steps per timed round")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per implementation (alternating)")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    args = parser.parse_args()

    torch.manual_seed(0)
    config = preset(args.model, vocab_size=args.vocab_size, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    ours = BertForPreTraining(config)
    with tempfile.TemporaryDirectory() as directory:
        ours.save_pretrained(directory)
        theirs = transformers.BertForPreTraining.from_pretrained(directory)
    models = {"bertkit": (ours.train(), bertkit_step), "transformers": (theirs.train(), transformers_step)}
    optimizers = {name: torch.optim.AdamW(model.parameters(), lr=1e-5) for name, (model, _) in models.items()}
    autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if args.precision == "bf16" else nullcontext
    batches = synthetic_batches(args.steps, args.batch_size, args.seq_length, args.vocab_size, seed=1)
    tokens = sum(int(b["attention_mask"].sum()) for b in batches)

    times: dict[str, list[float]] = {name: [] for name in models}
    for round_index in range(args.rounds + 1):  # round 0 warms up (allocator, kernels) and is not counted
        for name, (model, step) in models.items():
            elapsed = timed_round(model, step, optimizers[name], batches, autocast)
            if round_index:
                times[name].append(elapsed)

    print(f"{args.model}, batch {args.batch_size} x {args.seq_length}, {args.precision}, "
          f"{torch.get_num_threads()} threads, {tokens / len(batches):.0f} real tokens per batch")
    print(f"{'implementation':<14} {'ms/step':>9} {'tokens/s':>10}")
    rates = {}
    for name, values in times.items():
        seconds = statistics.median(values)
        rates[name] = tokens / seconds
        print(f"{name:<14} {1000 * seconds / len(batches):>9.1f} {rates[name]:>10,.0f}")
    print(f"ratio bertkit / transformers: {rates['bertkit'] / rates['transformers']:.2f}x")


if __name__ == "__main__":
    main()
