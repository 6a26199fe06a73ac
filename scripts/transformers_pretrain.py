"""transformers' BERT pre-trained with the same budget, data and recipe as bertkit (issue 48's comparison row).

    python scripts/transformers_pretrain.py --data RUN/data --tokenizer RUN/vocab --output RUN/pretrain-transformers \
        --bertkit-steps 2640

The question it answers: a user with the same CPU time, the same data and the same recipe, but transformers'
model instead of bertkit's - what does the fine-tuning get? Everything but the implementation is bertkit's:

* the instances: `bertkit data pretraining`'s directory, read by bertkit's own `PretrainingDataset` (cut to the
  recipe's 64 tokens, 30% dynamic masking with the 80/10/10 rule), shuffled with the run's seed;
* the recipe: bertkit's short recipe for bert-mini (`recipes.short_recipe`): batch 16, AdamW (epsilon 1e-6,
  weight decay 0.01 off biases and LayerNorm), peak lr 5e-4 reached at half the budget and decayed linearly to 0
  (transformers' `get_linear_schedule_with_warmup`), global norm clipping at 1.0, no dropout, the objective
  bertkit's recipe gives (masked LM only, `recipes.SHORT_NSP`; `--nsp` / `--no-nsp` override it, as they do for
  `bertkit pretrain`), and the MLM decoder bias starting where the recipe starts it (`recipes.SHORT_MLM_BIAS_INIT`:
  the log word frequencies of up to 10,000 instances, `pretrain.unigram_baseline`);
* the precision: bf16 autocast where bertkit's `--precision auto` measures it faster, as bertkit's run did;
* the budget: the same CPU time. Both implementations are timed on the same batches in this process, taking turns
  (a median of rounds), and transformers gets `--bertkit-steps` x (its steps per second / bertkit's) steps.

transformers' model is `transformers.BertForPreTraining` with `labels` and `next_sentence_label` (its dense MLM head
over every position), initialised by transformers itself; masked LM only, `transformers.BertForMaskedLM` with
`labels` (no pooler and no NSP head, as bertkit's `BertForMaskedLM`, which `bertkit pretrain` trains then). The
output directory is a Hugging Face checkpoint with the vocabulary, which `bertkit finetune` reads like any other
(recorded as pre-trained elsewhere, so its fine-tuning learning rate is the released-checkpoint rule unless
`--learning-rate` is given).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import time
from contextlib import nullcontext
from pathlib import Path

import torch
import transformers

from bertkit.config import preset
from bertkit.data import PretrainingDataset, collate_pretraining
from bertkit.model import BertForMaskedLM, BertForPreTraining
from bertkit.tasks.pretraining import pretraining_loss
from bertkit.tokenizer import WordPieceTokenizer
from bertkit.workflows.pretrain import frequency_bias, unigram_baseline
from bertkit.workflows.recipes import short_recipe


def batches(dataset: PretrainingDataset, batch_size: int, length: int, seed: int):
    """Endless shuffled batches of instances cut to `length` (a new order every pass)."""
    generator = torch.Generator().manual_seed(seed)
    while True:
        order = torch.randperm(len(dataset), generator=generator).tolist()
        for start in range(0, len(order) - batch_size + 1, batch_size):
            yield collate_pretraining([dataset.read(i, length) for i in order[start:start + batch_size]])


def transformers_loss(model: torch.nn.Module, batch: dict) -> torch.Tensor:
    """MLM + NSP, as transformers computes it for `labels` and `next_sentence_label`."""
    return model(input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"],
                 attention_mask=batch["attention_mask"], labels=batch["mlm_labels"],
                 next_sentence_label=batch["nsp_labels"]).loss


def transformers_mlm_loss(model: torch.nn.Module, batch: dict) -> torch.Tensor:
    """Masked LM only, as transformers' BertForMaskedLM computes it for `labels`."""
    return model(input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"],
                 attention_mask=batch["attention_mask"], labels=batch["mlm_labels"]).loss


def objective(recipe_nsp: bool, data_nsp: bool, flag: bool | None) -> bool:
    """Whether the run trains NSP, as `bertkit pretrain` decides it: the flag, else the recipe's choice for the
    budget; never on masked-LM-only (--no-nsp) data, whose pairs carry no NSP labels."""
    if flag and not data_nsp:
        raise SystemExit("--nsp: this data was built with --no-nsp (no sentence pairs); build it with NSP pairs")
    return (recipe_nsp if flag is None else flag) and data_nsp


def bertkit_model(config, nsp: bool) -> torch.nn.Module:
    """bertkit's model for the objective: the pre-training heads, or masked LM only."""
    return (BertForPreTraining if nsp else BertForMaskedLM)(config)


def transformers_model(config, nsp: bool) -> torch.nn.Module:
    """transformers' model for the objective, initialised by transformers."""
    theirs = transformers.BertForPreTraining if nsp else transformers.BertForMaskedLM
    return theirs(transformers.BertConfig(**config.to_dict()))


def optimizer_for(model: torch.nn.Module, lr: float) -> torch.optim.Optimizer:
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": rest, "weight_decay": 0.0}],
                             lr=lr, eps=1e-6)


def step(model, loss_fn, optimizer, batch, autocast) -> float:
    with autocast():
        loss = loss_fn(model, batch)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(loss.detach())


def rate_ratio(config, vocab_size: int, stream, autocast, lr: float, rounds: int, steps: int, nsp: bool) -> dict:
    """transformers' steps per second over bertkit's, both timed on the same batches with the run's objective,
    taking turns."""
    ours, theirs = bertkit_model(config, nsp), transformers_model(config, nsp)
    sides = {"bertkit": (ours, lambda m, b: pretraining_loss(m, b, nsp=nsp)[0]),
             "transformers": (theirs, transformers_loss if nsp else transformers_mlm_loss)}
    optimizers = {name: optimizer_for(model, lr) for name, (model, _) in sides.items()}
    times: dict[str, list[float]] = {name: [] for name in sides}
    for round_ in range(rounds + 1):  # the first round warms up
        work = [next(stream) for _ in range(steps)]
        for name, (model, loss_fn) in sides.items():
            start = time.perf_counter()
            for batch in work:
                step(model, loss_fn, optimizers[name], batch, autocast)
            if round_:
                times[name].append(steps / (time.perf_counter() - start))
    rates = {name: statistics.median(values) for name, values in times.items()}
    return {"steps_per_s": rates, "ratio": rates["transformers"] / rates["bertkit"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="A `bertkit data pretraining` directory.")
    parser.add_argument("--tokenizer", type=Path, required=True, help="Its vocabulary directory.")
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--bertkit-steps", type=int, required=True, help="Steps bertkit's run took in the budget.")
    parser.add_argument("--model", default="bert-mini")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="bf16")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--nsp", action=argparse.BooleanOptionalAction, default=None,
                        help="Train NSP beside masked LM (default: what bertkit's recipe does at --bertkit-steps; give "
                             "what its run recorded, bertkit_pretraining.json's nsp, for a --max-time run near "
                             "the threshold, whose objective was chosen on its estimated steps).")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    recipe = short_recipe(preset(args.model).hidden_size, budget_steps=args.bertkit_steps)
    dataset = PretrainingDataset(args.data, masked_lm_prob=recipe.masked_lm_prob)
    nsp = objective(recipe.nsp, dataset.nsp, args.nsp)
    vocab_size = sum(1 for _ in (args.tokenizer / "vocab.txt").open(encoding="utf-8"))
    config = preset(args.model, vocab_size=vocab_size, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    autocast = ((lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if args.precision == "bf16" else nullcontext)
    length, batch_size, lr = recipe.max_seq_length, recipe.batch_size, recipe.learning_rate
    torch.manual_seed(args.seed)
    timing = rate_ratio(config, vocab_size, batches(dataset, batch_size, length, args.seed + 1), autocast, lr,
                        args.rounds, 10, nsp)
    total = max(1, round(args.bertkit_steps * timing["ratio"]))
    print(f"transformers runs {timing['ratio']:.2f}x bertkit's steps/s here "
          f"({timing['steps_per_s']['transformers']:.2f} against {timing['steps_per_s']['bertkit']:.2f}): "
          f"{total} steps for bertkit's {args.bertkit_steps}, {'MLM + NSP' if nsp else 'masked LM only'}", flush=True)
    torch.manual_seed(args.seed)
    model = transformers_model(config, nsp)  # only it draws from the seed, as before MLM-only runs existed
    if recipe.mlm_bias_init == "unigram":  # as `bertkit pretrain` starts its own (pretrain.frequency_bias)
        special = WordPieceTokenizer.from_pretrained(args.tokenizer).special_token_ids
        with torch.no_grad():
            model.cls.predictions.bias.copy_(frequency_bias(unigram_baseline(dataset, vocab_size, special, args.seed)))
    optimizer = optimizer_for(model, lr)
    warmup = math.ceil(recipe.warmup_ratio * total)
    schedule = transformers.get_linear_schedule_with_warmup(optimizer, warmup, total)
    stream = batches(dataset, batch_size, length, args.seed)
    model.train()
    loss_fn, start, losses = (transformers_loss if nsp else transformers_mlm_loss), time.perf_counter(), []
    for index in range(total):
        losses.append(step(model, loss_fn, optimizer, next(stream), autocast))
        schedule.step()
        if (index + 1) % 200 == 0 or index + 1 == total:
            print(f"step {index + 1}/{total} loss {statistics.mean(losses[-200:]):.4f} "
                  f"{time.perf_counter() - start:.0f} s", flush=True)
    final = args.output / "final"
    model.save_pretrained(final)
    for name in ("vocab.txt", "tokenizer_config.json"):
        shutil.copy(args.tokenizer / name, final / name)
    recipe_used = {"length": length, "batch": batch_size, "lr": lr, "warmup": warmup,
                   "masked_lm_prob": recipe.masked_lm_prob, "nsp": nsp, "mlm_bias_init": recipe.mlm_bias_init}
    record = {"steps": total, "bertkit_steps": args.bertkit_steps, "timing": timing,
              "seconds": time.perf_counter() - start, "recipe": recipe_used, "transformers": transformers.__version__}
    (args.output / "run.json").write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(record))


if __name__ == "__main__":
    main()
