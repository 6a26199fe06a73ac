"""`--precision auto` against fp32 and bf16 (and int8 for inference) on this machine, in one process.

    python benchmarks/precision_auto.py                      # bert-mini pre-training, bert-base inference
    python benchmarks/precision_auto.py --rounds 7 --inference-model bert-small

Issue 14's bar: auto never runs more than 5% slower than the faster of fp32 and bf16. Two measurements:

- pre-training steps: bert-mini (`--pretrain-model`), real 32 x 64 instances from `bertkit data
  pretraining` on the bundled corpus, forward + MLM/NSP loss + backward + AdamW, under the autocast
  the training loop uses for each precision ('auto' resolved by `bertkit.runtime.device.resolve_precision`
  at the model's width, as `bertkit pretrain` does);
- inference tokens/s: BertModel (`--inference-model`, random weights) over batches of 32 verses of the
  bundled corpus padded to the longest, each precision prepared by `bertkit.model.for_inference`, as
  `bertkit predict`/`extract`/`serve` do.

Every variant starts from the same weights and gets the same batches. The variants take turns step by
step (batch by batch), going through every order, so a shared machine's load hits all alike; each variant's
time is the median over rounds, and 'auto' is compared with the faster of fp32 and bf16 in the same run
(where auto runs the same code as one of them, their difference is the measurement's noise). The header is
`bertkit doctor`'s: the machine, the probe's numbers and the choices. The probe runs (or is read from the cache)
before any timing.
"""

from __future__ import annotations

import argparse
import copy
import functools
import itertools
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from peak import timed
from pretraining import autocast_for, bertkit_step, optimizer_for, real_batches, timed_round

from bertkit.config import preset
from bertkit.model import BertForPreTraining, BertModel, for_inference
from bertkit.runtime import report as machine_report
from bertkit.runtime.device import inference_precision, resolve_precision
from bertkit.tokenizer import WordPieceTokenizer
from inference import VOCAB, sentences, varied_batches

TOLERANCE = 0.95  # auto must reach 95% of the faster of fp32 and bf16


def alternating(units: dict[str, list[Callable[[], object]]], rounds: int) -> dict[str, float]:
    """Median over `rounds` (after a warm-up round) of each variant's seconds for its units (steps or
    batches). The variants take turns unit by unit, going through every order in turn, so load (and
    whatever one variant leaves in the caches for the next) hits all alike."""
    names = list(units)
    orders = itertools.cycle(itertools.permutations(names))
    totals: dict[str, list[float]] = {name: [] for name in names}
    for index in range(rounds + 1):
        elapsed = dict.fromkeys(names, 0.0)
        for unit in range(len(units[names[0]])):
            for name in next(orders):
                elapsed[name] += timed(units[name][unit])
        if index:
            for name in names:
                totals[name].append(elapsed[name])
    return {name: statistics.median(values) for name, values in totals.items()}


def pretraining(model_name: str, steps: int, rounds: int) -> dict[str, float]:
    """Optimizer steps per second of auto, fp32 and bf16."""
    with tempfile.TemporaryDirectory() as workdir:
        batches = real_batches(steps, 32, 64, Path(workdir))
    torch.manual_seed(0)
    base = BertForPreTraining(preset(model_name, vocab_size=30522)).train()
    auto = resolve_precision("auto", torch.device("cpu"), base)
    print(f"# pre-training {model_name}, 32 x 64, {steps} steps a round: auto runs {auto}")
    units = {}
    for name in ("auto", "fp32", "bf16"):
        model = copy.deepcopy(base)
        optimizer = optimizer_for("bertkit", model)
        autocast = autocast_for(auto if name == "auto" else name)
        units[name] = [lambda m=model, o=optimizer, a=autocast, b=batch: timed_round(m, bertkit_step, o, [b], a)
                       for batch in batches]
    return {name: steps / seconds for name, seconds in alternating(units, rounds).items()}


def inference(model_name: str, count: int, rounds: int) -> dict[str, float]:
    """Real tokens per second of auto, fp32, bf16 and int8."""
    tokenizer = WordPieceTokenizer.from_pretrained(VOCAB)
    batches = varied_batches(tokenizer, sentences(), count)
    tokens = sum(float(mask.sum()) for _, mask in batches)
    torch.manual_seed(0)
    base = BertModel(preset(model_name, vocab_size=tokenizer.vocab_size)).eval()
    auto = inference_precision("auto", base, torch.device("cpu"))
    print(f"# inference {model_name}, {count} batches of 32 verses a round: auto runs {auto}")
    units = {}
    for name in ("auto", "fp32", "bf16", "int8"):
        model = for_inference(copy.deepcopy(base), name)

        def forward(model=model, ids=None, mask=None) -> None:
            with torch.inference_mode():
                model(ids, attention_mask=mask)
        units[name] = [functools.partial(forward, ids=ids, mask=mask) for ids, mask in batches]
    return {name: tokens / seconds for name, seconds in alternating(units, rounds).items()}


def report(title: str, unit: str, rates: dict[str, float]) -> bool:
    best = max(rates["fp32"], rates["bf16"])
    print(f"\n{title}\n| precision | {unit} | vs the faster of fp32/bf16 |\n|---|---|---|")
    for name, rate in rates.items():
        print(f"| {name} | {rate:,.2f} | {rate / best:.2f}x |")
    passed = rates["auto"] >= TOLERANCE * best
    print(f"auto reaches {rates['auto'] / best:.1%} of the faster of fp32 and bf16: "
          f"{'ok' if passed else 'SLOWER than the bar'} (>= {TOLERANCE:.0%})", flush=True)
    return passed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pretrain-model", default="bert-mini", help="preset for the pre-training steps")
    parser.add_argument("--inference-model", default="bert-base", help="preset for inference")
    parser.add_argument("--steps", type=int, default=3, help="pre-training steps per round")
    parser.add_argument("--batches", type=int, default=4, help="inference batches of 32 per round")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per variant, alternating")
    args = parser.parse_args()
    for name in (args.pretrain_model, args.inference_model):
        print(f"# --- probe at the width of {name}\n{machine_report.header(preset(name).hidden_size)}")
    train = report(f"Pre-training steps/s ({args.pretrain_model})", "steps/s",
                   pretraining(args.pretrain_model, args.steps, args.rounds))
    serve = report(f"Inference tokens/s ({args.inference_model})", "tokens/s",
                   inference(args.inference_model, args.batches, args.rounds))
    raise SystemExit(0 if train and serve else 1)


if __name__ == "__main__":
    main()
