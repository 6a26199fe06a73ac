"""Score a model's held-out masked-LM metrics, `mlm_context_gain` included, as `bertkit pretrain --seed S` scores
them at the end of a run on the same data: a model made before the gain was recorded, a checkpoint, or another
implementation's model (transformers' BertForPreTraining / BertForMaskedLM directories load as bertkit's).

    python scripts/context_gain.py --data data/ --model runs/mini/final --seed 42 [--results rows.jsonl]

The held-out instances are those `pretrain --seed S --eval-examples N` holds out (`split_held_out`), cut to
--max-seq-length at --masked-lm-prob as the run read them; the baseline is `unigram_baseline` on the rest with the
same seed. One line of metrics is printed, and with --results one JSON row appended (the model, data, seed and
metrics). A model whose run held nothing out (transformers' script) is scored on instances it trained on: its
figures are high by what it remembers of them.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from bertkit.model import BertForPreTraining
from bertkit.tokenizer import WordPieceTokenizer
from bertkit.workflows.pretrain import evaluate_pretraining, split_held_out, unigram_baseline


def score(data: Path, model_dir: Path, seed: int, eval_examples: int, max_seq_length: int,
          masked_lm_prob: float) -> dict[str, float]:
    """The held-out masked-LM metrics of `model_dir` on `data` (a model without an NSP head gets a random one, whose
    scores are dropped)."""
    tokenizer = WordPieceTokenizer.from_pretrained(model_dir)
    train, held_out = split_held_out(data, eval_examples, seed, None, max_seq_length=max_seq_length,
                                     masked_lm_prob=masked_lm_prob)
    model = BertForPreTraining.from_pretrained(model_dir)
    baseline = unigram_baseline(train, model.config.vocab_size, tokenizer.special_token_ids, seed)
    metrics = evaluate_pretraining(model, held_out, 64, True, tokenizer.pad_token_id, baseline=baseline)
    masked_lm = {key: value for key, value in metrics.items() if key.startswith("mlm_")}
    return {**masked_lm, "baseline_words": baseline.words, "held_out": len(held_out)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="`bertkit data pretraining` output directory.")
    parser.add_argument("--model", type=Path, required=True, help="Model directory (final/, a checkpoint).")
    parser.add_argument("--seed", type=int, default=42, help="The run's --seed (it chose the held-out split).")
    parser.add_argument("--eval-examples", type=int, default=1000, help="The run's --eval-examples.")
    parser.add_argument("--max-seq-length", type=int, default=64, help="The length the run read (short recipe: 64).")
    parser.add_argument("--masked-lm-prob", type=float, default=0.3, help="The run's masking rate (short: 0.3).")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--results", type=Path, help="JSONL file to append one row to.")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    metrics = score(args.data, args.model, args.seed, args.eval_examples, args.max_seq_length, args.masked_lm_prob)
    shown = (f"{key} {value:,}" if isinstance(value, int) else f"{key} {value:.4g}" for key, value in metrics.items())
    print(f"{args.model}: " + ", ".join(shown))
    if args.results:
        row = {"model": str(args.model), "data": str(args.data), "seed": args.seed, **metrics}
        with open(args.results, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
