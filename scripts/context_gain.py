"""Score a model's held-out masked-LM metrics, `mlm_context_gain` included, as `bertkit pretrain` scored them at the
end of its run: a model made before the gain was recorded, a checkpoint, or another implementation's model
(transformers' BertForPreTraining / BertForMaskedLM directories load as bertkit's).

    python scripts/context_gain.py --data data/ --model runs/mini/final [--results rows.jsonl]

The held-out instances, their length and masking, and the baseline's seed are the run's: read from the
pretrain_settings.json of the run the model is in (RUN/final or RUN/checkpoints/step-N), else the flags (--seed,
--eval-examples, --max-seq-length, --masked-lm-prob; unset: 42, 1000 and the data's own), which also override the
run's. The instances are those `split_held_out` holds out (or --eval-data's), the baseline `unigram_baseline` on the
rest. One line is printed with the settings used, and with --results one JSON row appended. A model whose run held
nothing out (transformers' script) is scored on instances it trained on: its figures are high by what it remembers
of them. Scores are in fp32 (a bf16 run's own evaluation can differ in the third digit).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch

from bertkit.data import PretrainingDataset
from bertkit.model import BertForPreTraining
from bertkit.tokenizer import WordPieceTokenizer
from bertkit.workflows.pretrain import evaluate_pretraining, split_held_out, unigram_baseline

DEFAULTS = {"seed": 42, "eval_examples": 1000, "max_seq_length": None, "masked_lm_prob": None, "eval_data": None}


def run_settings(model_dir: Path) -> dict[str, Any]:
    """What the run that wrote `model_dir` held out and how it read it ({} when no pretrain_settings.json is found
    beside RUN/final or RUN/checkpoints/step-N)."""
    for run in (model_dir.parent, model_dir.parent.parent):
        path = run / "pretrain_settings.json"
        if path.is_file():
            saved = json.loads(path.read_text(encoding="utf-8"))
            settings, train = saved.get("settings", {}), saved.get("train", {})
            return {"seed": train.get("seed"), **{key: settings.get(key) for key in DEFAULTS if key != "seed"}}
    return {}


def _known(values: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in values.items() if value is not None}


def score(data: Path, model_dir: Path, seed: int, eval_examples: int, max_seq_length: int | None,
          masked_lm_prob: float | None, eval_data: str | None = None) -> dict[str, Any]:
    """The held-out masked-LM metrics of `model_dir` (a model without an NSP head gets a random one, whose scores
    are dropped)."""
    tokenizer = WordPieceTokenizer.from_pretrained(model_dir)
    loading = {"max_seq_length": max_seq_length, "masked_lm_prob": masked_lm_prob}
    train, held_out = split_held_out(data, eval_examples, seed, None, **loading)
    if eval_data is not None:  # the run held out nothing of --data; the baseline counts all of it
        held_out = PretrainingDataset(eval_data, **loading)
    model = BertForPreTraining.from_pretrained(model_dir)
    baseline = unigram_baseline(train, model.config.vocab_size, tokenizer.special_token_ids, seed)
    metrics = evaluate_pretraining(model, held_out, 64, True, tokenizer.pad_token_id, baseline=baseline)
    masked_lm = {key: value for key, value in metrics.items() if key.startswith("mlm_")}
    return {**masked_lm, "baseline_words": baseline.words, "held_out": len(held_out)}  # type: ignore[arg-type]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="`bertkit data pretraining` output directory.")
    parser.add_argument("--model", type=Path, required=True, help="Model directory (final/, a checkpoint).")
    parser.add_argument("--seed", type=int, help="The run's --seed (it chose the held-out split); default: the run's, "
                                                 "else 42.")
    parser.add_argument("--eval-examples", type=int, help="Default: the run's, else 1000.")
    parser.add_argument("--max-seq-length", type=int, help="Default: the length the run read, else the data's.")
    parser.add_argument("--masked-lm-prob", type=float, help="Default: the run's masking rate, else the data's.")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--results", type=Path, help="JSONL file to append one row to.")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    found = run_settings(args.model)
    given = {key: getattr(args, key, None) for key in DEFAULTS}
    used = {**DEFAULTS, **_known(found), **_known(given)}  # the flags over the run's over the defaults
    metrics = score(args.data, args.model, **used)
    shown = (f"{key} {value:,}" if isinstance(value, int) else f"{key} {value:.4g}" for key, value in metrics.items())
    source = "the run's pretrain_settings.json" if found else "no run found: flags and defaults"
    print(f"{args.model} ({source}: {', '.join(f'{k} {v}' for k, v in used.items() if v is not None)}): "
          + ", ".join(shown))
    if args.results:
        row = {"model": str(args.model), "data": str(args.data), **used, **metrics}
        with open(args.results, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
