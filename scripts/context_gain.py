"""Score a model's held-out masked-LM metrics, `mlm_context_gain` included, as `bertkit pretrain` scored them at the
end of its run: a model made before the gain was recorded, a checkpoint, or another implementation's model
(transformers' BertForPreTraining / BertForMaskedLM directories load as bertkit's).

    python scripts/context_gain.py --data data/ --model runs/mini/final [--results rows.jsonl]

The held-out instances, the length and masking they are read at, and the baseline's sample are the run's: its
settings are read from the pretrain_settings.json of the run the model is in (RUN/final or RUN/checkpoints/step-N)
and given to `pretrain.run_datasets`, as the run did (--eval-data, full-length steps and all). Without one (another
implementation's model), the short recipe's reading is assumed: 64 tokens, 30% masking, seed 42, 1,000 held out;
the flags override either. One line is printed with the settings used, and with --results one JSON row appended.
A model whose run held nothing out (transformers' script) is scored on instances it trained on: its figures are
high by what it remembers of them. Scores are in fp32 (a bf16 run's own evaluation can differ in the third digit).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch

from bertkit.data import PretrainingDataset
from bertkit.model import BertForPreTraining
from bertkit.settings import PretrainSettings
from bertkit.tokenizer import WordPieceTokenizer
from bertkit.workflows.pretrain import evaluate_pretraining, run_datasets, unigram_baseline

SHORT_RECIPE = {"seed": 42, "eval_examples": 1000, "max_seq_length": 64, "masked_lm_prob": 0.3}
"""What a model without a run is assumed to have been read at (the short recipe's, `pretrain --seed 42`)."""
READING = ("eval_examples", "eval_data", "max_seq_length", "masked_lm_prob", "full_length_share")


def run_settings(model_dir: Path) -> dict[str, Any]:
    """How the run that wrote `model_dir` read its data and its seed ({} when no pretrain_settings.json is found
    beside RUN/final or RUN/checkpoints/step-N); None values are the data's own (a run without a recipe's cut)."""
    for run in (model_dir.parent, model_dir.parent.parent):
        path = run / "pretrain_settings.json"
        if path.is_file():
            saved = json.loads(path.read_text(encoding="utf-8"))
            return {"seed": saved["train"]["seed"], **{key: saved["settings"].get(key) for key in READING}}
    return {}


def score(data: Path, model_dir: Path, reading: dict[str, Any]) -> dict[str, Any]:
    """The held-out masked-LM metrics of `model_dir` read as `reading` says (a model without an NSP head gets a
    random one, whose scores are dropped)."""
    tokenizer = WordPieceTokenizer.from_pretrained(model_dir)
    settings = PretrainSettings(data=str(data), model=str(model_dir), output=".",
                                **{key: reading.get(key) for key in READING if reading.get(key) is not None})
    built = int(PretrainingDataset(data).options["max_seq_length"])
    train, held_out = run_datasets(settings, reading["seed"], built)
    model = BertForPreTraining.from_pretrained(model_dir)
    baseline = unigram_baseline(train, model.config.vocab_size, tokenizer.special_token_ids, reading["seed"])
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
    parser.add_argument("--max-seq-length", type=int, help="Default: the length the run read, else 64.")
    parser.add_argument("--masked-lm-prob", type=float, help="Default: the run's masking rate, else 0.3.")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--results", type=Path, help="JSONL file to append one row to.")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    found = run_settings(args.model)
    given = {key: getattr(args, key) for key in SHORT_RECIPE if getattr(args, key) is not None}
    reading = {**(found or SHORT_RECIPE), **given}  # the flags over the run's (or the assumed short recipe's)
    metrics = score(args.data, args.model, reading)
    shown = (f"{key} {value:,}" if isinstance(value, int) else f"{key} {value:.4g}" for key, value in metrics.items())
    source = "the run's pretrain_settings.json" if found else "no run found: the short recipe's reading"
    print(f"{args.model} ({source}: {', '.join(f'{k} {v}' for k, v in reading.items() if v is not None)}): "
          + ", ".join(shown))
    if args.results:
        row = {"model": str(args.model), "data": str(args.data), **reading, **metrics}
        with open(args.results, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
