"""Fine-tune one model on one study task over several seeds and write one JSON result row (issue 17 study);
`table` turns result rows into the study's Markdown table.

    # a pre-trained model (RUN/final of `bertkit pretrain`) and the same architecture from random init,
    # both with the learning rate chosen by the same rule:
    python scripts/study_finetune.py run --task wordnet-lexname --data /tmp/study-data \
        --model runs/wn-10m/final --corpus wordnet --budget 10m --recipe auto \
        --lr-rule grid --output runs/ft/wn-10m-lexname --results results.jsonl --threads 1
    python scripts/study_finetune.py run --task wordnet-lexname --data /tmp/study-data \
        --random bert-mini --tokenizer runs/wn-10m/final --corpus wordnet \
        --lr-rule grid --output runs/ft/random-lexname --results results.jsonl --threads 1
    python scripts/study_finetune.py table results.jsonl

Tasks (`--data` is the output directory of scripts/study_data.py; kjv-verse uses the bundled files):

  kjv-verse        6-way verse classification, src/bertkit/assets/kjv/{train,dev,test}.tsv (accuracy)
  wordnet-lexname  45-way gloss classification, DATA/wordnet/lexname-{train,dev,test}.tsv (accuracy)
  wordnet-qa       extractive QA, DATA/wordnet/qa-{train,dev,test}.json (SQuAD F1)

Learning-rate rules (the same rule for pre-trained and random-init models, so neither is favoured):

  grid     (what the study uses) seed 1 is fine-tuned at each rate of --lr-grid (default 1e-4, 3e-4, 1e-3);
           the rate with the best dev metric is kept and the other seeds run at it (seed 1's run at that rate
           is reused: it is the same run). Test scores are never looked at to choose.
  fixed    every seed at --learning-rate.
  default  no learning rate is passed: every seed at what `bertkit finetune` does with no learning-rate flag
           (the issue's acceptance run; the rate the library chose is read back from eval_results.json).

Everything else is `bertkit finetune`'s default unless a flag says otherwise (epochs, batch size, sequence
length, warmup, dropout, precision); each seed keeps its best dev evaluation (one per epoch) and is scored on
test there. Runs go through the library (`bertkit.workflows.finetune.run_finetuning`, `FinetuneSettings`), each
grid rate in OUTPUT/lr-RATE/, always with resume on: an interrupted study continues where it stopped, a
finished seed is never trained again, and re-running a finished row only rewrites the row. The fine-tuned
weights are deleted once the row is written (the results are all the study needs) unless --keep-models.

`--threads N` sets OMP_NUM_THREADS and torch.set_num_threads before torch starts, so two runs can share the
machine's two cores one each. The row records wall time per fine-tuning run so a study can be planned.

Result rows (one JSON object per line in --results) pair up in `table` by task, vocabulary (sha256 of
vocab.txt), model shape, training-set size, the sha256 of the train/dev/test files read (where rows
record them: a rebuilt task or another subset is not compared) and fine-tuning recipe (learning-rate rule and
grid, seeds, epochs, batch size, sequence length, precision): a random-init row is the baseline of every
pre-trained row that shares them. Metrics are stored and shown in points (0-100: accuracy x100, SQuAD F1 as
is); the table shows the test metric (or --split dev) as mean ± sample std over seeds.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

POINTS = {"accuracy": 100.0, "f1": 1.0, "exact_match": 1.0}  # factor to 0-100 (SQuAD metrics already are)
TASKS: dict[str, dict[str, Any]] = {
    "kjv-verse": {"kind": "classification", "files": ("train.tsv", "dev.tsv", "test.tsv"), "metric": "accuracy"},
    "wordnet-lexname": {"kind": "classification", "metric": "accuracy",
                        "files": ("wordnet/lexname-train.tsv", "wordnet/lexname-dev.tsv", "wordnet/lexname-test.tsv")},
    # the length study's long-input families (scripts/length_study.py): files given with --train/--dev/--test
    "gcide-domain": {"kind": "classification", "metric": "accuracy", "files": ("train.jsonl", "dev.jsonl",
                                                                               "test.jsonl")},
    "kjv-verdict": {"kind": "classification", "metric": "accuracy", "files": ("train.jsonl", "dev.jsonl",
                                                                             "test.jsonl")},
    "mhcc-part": {"kind": "classification", "metric": "accuracy", "files": ("train.jsonl", "dev.jsonl",
                                                                           "test.jsonl")},
    "tdavid-book": {"kind": "classification", "metric": "accuracy", "files": ("train.jsonl", "dev.jsonl",
                                                                             "test.jsonl")},
    "web-part": {"kind": "classification", "metric": "accuracy", "files": ("train.jsonl", "dev.jsonl", "test.jsonl")},
    "wordnet-qa": {"kind": "squad", "metric": "f1",
                   "files": ("wordnet/qa-train.json", "wordnet/qa-dev.json", "wordnet/qa-test.json")},
}
CLASSIFICATION_OPTIONS = {"glue_task": None, "text_column": "text", "text_pair_column": None,
                          "label_column": "label", "regression": False}
DEFAULT_GRID = (1e-4, 3e-4, 1e-3)


# --- run ----------------------------------------------------------------------------------------------

def task_files(args: argparse.Namespace) -> tuple[Path, Path, Path]:
    """(train, dev, test) of the task: --train/--dev/--test, else the bundled files or those under --data."""
    if args.train:
        return args.train, args.dev, args.test
    names = TASKS[args.task]["files"]
    if args.task == "kjv-verse":
        from bertkit.assets import kjv_path
        return tuple(kjv_path(name) for name in names)
    if args.data is None:
        raise SystemExit(f"--task {args.task}: give --data (the output of scripts/study_data.py)")
    return tuple(args.data / name for name in names)


def train_subset(train: Path, count: int | None, output: Path) -> Path:
    """A seeded subset of `count` training rows (a classification table; a TSV/CSV header is kept), or the
    file itself."""
    if count is None:
        return train
    lines = train.read_text(encoding="utf-8").splitlines(keepends=True)
    header, rows = (lines[:1], lines[1:]) if train.suffix.lower() in (".tsv", ".csv") else ([], lines)
    if count > len(rows):
        raise SystemExit(f"--train-examples {count}: {train} has only {len(rows)} rows")
    chosen = sorted(random.Random(0).sample(range(len(rows)), count))  # the same subset in every run
    subset = output / f"train-{count}{train.suffix}"
    subset.parent.mkdir(parents=True, exist_ok=True)
    subset.write_text("".join(header + [rows[i] for i in chosen]), encoding="utf-8")
    return subset


def finetune_at(args: argparse.Namespace, files: tuple[Path, Path, Path], lr: float | None,
                seeds: tuple[int, ...]) -> tuple[dict[str, Any], float]:
    """run_finetuning at one learning rate (None: the library default) for `seeds`; (results, wall seconds)."""
    from bertkit.settings import FinetuneSettings
    from bertkit.workflows.finetune import run_finetuning

    spec = TASKS[args.task]
    given = {("num_epochs" if k == "epochs" else k): getattr(args, k) for k in ("epochs", "batch_size", "precision")
             if getattr(args, k) is not None}
    if lr is not None:
        given["learning_rate"] = lr
    output = args.output / (f"lr-{lr:g}" if lr is not None else "lr-default")
    tokenizer = str(args.tokenizer) if args.tokenizer else None
    # compare_random_init off: a study row measures the model it names, never random initialisation in its place
    cfg = FinetuneSettings.of(model=args.random or str(args.model), tokenizer=tokenizer, output=output, seeds=seeds,
                              device=args.device, resume=True, compare_random_init="off", **given)
    options = dict(CLASSIFICATION_OPTIONS) if spec["kind"] == "classification" else {}
    if args.max_seq_length is not None:
        options["max_seq_length"] = args.max_seq_length
    started = time.perf_counter()
    results = run_finetuning(spec["kind"], files[0], [files[1], files[2]], cfg, options)
    return results, time.perf_counter() - started


def choose_rate(args: argparse.Namespace, files: tuple[Path, Path, Path]) -> tuple[float | None, dict, float]:
    """(learning rate, {rate: seed-1 dev metric}, wall seconds) by --lr-rule."""
    if args.lr_rule == "fixed":
        return args.learning_rate, {}, 0.0
    if args.lr_rule == "default":
        return None, {}, 0.0
    metric, first, grid, wall = TASKS[args.task]["metric"], args.seeds[0], {}, 0.0
    for lr in args.lr_grid:
        results, seconds = finetune_at(args, files, lr, (first,))
        grid[f"{lr:g}"], wall = results["seeds"][str(first)][metric], wall + seconds
    best = max(args.lr_grid, key=lambda lr: grid[f"{lr:g}"])  # the first of equals, in grid order
    return best, grid, wall


def seed_stats(results: dict[str, Any], metric: str, test: Path) -> dict[str, Any]:
    """Per seed dev/test metric in points (0-100) at the seed's best dev evaluation, and mean ± sample std of
    each (the library names a second evaluation file's metrics after its stem: "lexname-test_accuracy")."""
    scale = POINTS[metric]
    seeds = {s: {"dev": scale * m[metric], "test": scale * m[f"{test.stem}_{metric}"], "step": m.get("step")}
             for s, m in results["seeds"].items()}
    row: dict[str, Any] = {"seeds": seeds}
    for split in ("dev", "test"):
        values = [v[split] for v in seeds.values()]
        row[split] = {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0}
    return row


def model_facts(args: argparse.Namespace) -> dict[str, Any]:
    """Vocabulary hash, shape, and (for RUN/final of `bertkit pretrain`) the last held-out MLM accuracy."""
    from bertkit.config import load_config
    from bertkit.tokenizer import WordPieceTokenizer
    from bertkit.train.reporting import read_metrics

    source = args.random or str(args.model)
    config = load_config(source)
    vocab = WordPieceTokenizer.from_pretrained(str(args.tokenizer or args.model))
    facts = {"vocab_sha256": vocab.vocab_hash, "vocab_size": vocab.vocab_size,
             "shape": f"L{config.num_hidden_layers}/H{config.hidden_size}", "mlm_accuracy": args.mlm_accuracy}
    if args.model is not None and facts["mlm_accuracy"] is None:
        evals = [r for r in read_metrics(Path(args.model).parent / "metrics.jsonl") if r.get("kind") == "eval"]
        facts["mlm_accuracy"] = evals[-1].get("mlm_accuracy") if evals else None
    return facts


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Fine-tune by the learning-rate rule, append the result row to --results and return it."""
    import torch

    from bertkit.io.digest import file_sha256

    torch.set_num_threads(args.threads)
    metric = TASKS[args.task]["metric"]
    train, dev, test = task_files(args)
    files = (train_subset(train, args.train_examples, args.output), dev, test)
    started = time.perf_counter()
    lr, grid, grid_wall = choose_rate(args, files)
    results, wall = finetune_at(args, files, lr, tuple(args.seeds))
    used_lr = lr if lr is not None else results.get("learning_rate", _default("learning_rate"))  # newer: "auto"
    runs = len(args.lr_grid) + len(args.seeds) - 1 if args.lr_rule == "grid" else len(args.seeds)
    row = {"task": args.task, "metric": metric, "init": "random" if args.random else "pretrained",
           "model": args.random or str(args.model), "corpus": args.corpus, "budget": args.budget,
           "recipe": args.recipe, **model_facts(args), "train_examples": _rows(files[0], TASKS[args.task]["kind"]),
           "data_sha256": {name: file_sha256(path) for name, path in zip(("train", "dev", "test"), files)},
           "lr_rule": args.lr_rule, "learning_rate": used_lr,
           "lr_grid": grid, "recipe_finetune": finetune_recipe(args),
           **seed_stats(results, metric, test), "threads": args.threads, "finetune_runs": runs,
           "wall_s": round(time.perf_counter() - started, 1), "seconds_per_run": round((grid_wall + wall) / runs, 1),
           "truncated_train_examples": results.get("truncated_train_examples"), "output": str(args.output)}
    if not args.keep_models:
        for best in args.output.glob("lr-*/best"):
            shutil.rmtree(best)
    with open(args.results, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(row) + "\n")
    return row


def _default(name: str) -> Any:
    from bertkit.settings import finetune_training
    return getattr(finetune_training(), name)


def finetune_recipe(args: argparse.Namespace) -> dict[str, Any]:
    """What a baseline must share besides the model: rule, grid, seeds, epochs, batch, length, precision."""
    return {"lr_rule": args.lr_rule, "lr_grid": list(args.lr_grid) if args.lr_rule == "grid" else None,
            "fixed_lr": args.learning_rate if args.lr_rule == "fixed" else None, "seeds": list(args.seeds),
            "epochs": args.epochs if args.epochs is not None else _default("num_epochs"),
            "batch_size": args.batch_size or _default("batch_size"), "max_seq_length": args.max_seq_length,
            "precision": args.precision or _default("precision")}


def _rows(path: Path, kind: str) -> int:
    """Training examples in a task file (questions of a SQuAD file, rows of a table)."""
    if kind == "squad":
        data = json.loads(path.read_text(encoding="utf-8"))["data"]
        return sum(len(p["qas"]) for article in data for p in article["paragraphs"])
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return len(lines) - (path.suffix.lower() in (".tsv", ".csv"))


# --- table --------------------------------------------------------------------------------------------

def read_rows(paths: list[Path]) -> list[dict[str, Any]]:
    rows = []
    for path in paths:
        rows += [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return rows


def markdown_table(rows: list[dict[str, Any]], split: str = "test") -> str:
    """One line per pre-trained row with its random-init baseline (same task, vocabulary, shape, training
    size, the same train/dev/test files where rows record them, and fine-tuning recipe; the newest such row), the
    gain in points and its Welch p-value over the seeds (bertkit.workflows.significance: whether the gain is more
    than seed noise)."""
    def key(row: dict[str, Any]) -> tuple:
        recipe = json.dumps(row["recipe_finetune"], sort_keys=True)
        data = json.dumps(row.get("data_sha256"), sort_keys=True)  # rows made before it was recorded: None
        return row["task"], row["vocab_sha256"], row["shape"], row["train_examples"], data, recipe

    baselines = {key(r): r for r in rows if r["init"] == "random"}
    lines = ["| corpus | budget | recipe | MLM acc | task | pre-trained | random | gain | p |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in (r for r in rows if r["init"] == "pretrained"):
        base = baselines.get(key(row))
        gain = f"{row[split]['mean'] - base[split]['mean']:+.1f}" if base else "n/a"
        gain += f" | {_p_value(row, base, split)}"
        mlm = f"{100 * row['mlm_accuracy']:.1f}" if row.get("mlm_accuracy") is not None else "n/a"
        lines.append(f"| {row['corpus']} | {row['budget']} | {row['recipe']} | {mlm} | {row['task']} "
                     f"({row['metric']}, {row['train_examples']}) | {_pm(row, split)} | "
                     f"{_pm(base, split) if base else 'n/a'} | {gain} |")
    return "\n".join(lines)


def _p_value(row: dict[str, Any], base: dict[str, Any] | None, split: str) -> str:
    """Welch's two-sided p of the row's per-seed scores against its baseline's; n/a without a spread to judge."""
    from bertkit.workflows.significance import compare_seeds

    if base is None:
        return "n/a"
    comparison = compare_seeds([seed[split] for seed in row["seeds"].values()],
                               [seed[split] for seed in base["seeds"].values()])
    return "n/a" if comparison.p_value is None else f"{comparison.p_value:.2g}"


def _pm(row: dict[str, Any], split: str) -> str:
    stats = row[split]
    lr = f"{row['learning_rate']:g}" if row.get("learning_rate") is not None else "?"
    return f"{stats['mean']:.1f} ± {stats['std']:.1f} (n={len(row['seeds'])}, lr {lr})"


# --- command line -------------------------------------------------------------------------------------

def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(x) for x in text.split(","))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    go = commands.add_parser("run", help="fine-tune one model on one task over seeds; append a result row")
    go.add_argument("--task", choices=TASKS, required=True)
    go.add_argument("--data", type=Path, help="Output directory of scripts/study_data.py (wordnet tasks).")
    go.add_argument("--train", type=Path, help="Task files instead of the task's defaults (with --dev, --test).")
    go.add_argument("--dev", type=Path)
    go.add_argument("--test", type=Path)
    start = go.add_mutually_exclusive_group(required=True)
    start.add_argument("--model", type=Path, help="Pre-trained model directory (RUN/final).")
    start.add_argument("--random", metavar="PRESET", help="Random initialisation of this preset (needs --tokenizer).")
    go.add_argument("--tokenizer", type=Path, help="Directory with vocab.txt (default: --model).")
    go.add_argument("--seeds", type=lambda s: tuple(int(x) for x in s.split(",")), default=(1, 2, 3))
    go.add_argument("--lr-rule", choices=("grid", "fixed", "default"), default="grid")
    go.add_argument("--lr-grid", type=_floats, default=DEFAULT_GRID, help="Rates tried on the first seed (grid).")
    go.add_argument("--learning-rate", type=float, help="The rate of --lr-rule fixed.")
    go.add_argument("--epochs", type=float, help="Fine-tuning epochs (default: bertkit finetune's).")
    go.add_argument("--batch-size", type=int, help="Default: bertkit finetune's.")
    go.add_argument("--max-seq-length", type=int, help="Default: bertkit finetune's for the task kind.")
    go.add_argument("--precision", help="auto, fp32, bf16 (default: bertkit finetune's).")
    go.add_argument("--train-examples", type=int, help="Seeded subset of the training rows (classification).")
    go.add_argument("--device", default="cpu")
    go.add_argument("--threads", type=int, default=1, help="Torch/OpenMP threads of this run.")
    go.add_argument("--corpus", default="-", help="Label: pre-training corpus (random rows: whose vocabulary).")
    go.add_argument("--budget", default="-", help="Label: pre-training budget, e.g. 10m.")
    go.add_argument("--recipe", default="-", help="Label: pre-training recipe.")
    go.add_argument("--mlm-accuracy", type=float, help="Default: read from RUN/metrics.jsonl of --model RUN/final.")
    go.add_argument("--output", type=Path, required=True, help="Directory of this row's fine-tuning runs.")
    go.add_argument("--results", type=Path, required=True, help="JSONL file the result row is appended to.")
    go.add_argument("--keep-models", action="store_true", help="Keep the fine-tuned best/ directories.")
    table = commands.add_parser("table", help="Markdown table of result rows")
    table.add_argument("results", type=Path, nargs="+")
    table.add_argument("--split", choices=("dev", "test"), default="test")
    args = parser.parse_args(argv)
    if args.command == "run":
        if args.random and args.tokenizer is None:
            parser.error("--random needs --tokenizer DIR (the vocab.txt to use)")
        if args.lr_rule == "fixed" and args.learning_rate is None:
            parser.error("--lr-rule fixed needs --learning-rate")
        if args.train_examples is not None and TASKS[args.task]["kind"] != "classification":
            parser.error("--train-examples applies to classification tasks")
        if bool(args.train) != bool(args.dev) or bool(args.train) != bool(args.test):
            parser.error("--train, --dev and --test go together")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.command == "table":
        print(markdown_table(read_rows(args.results), args.split))
        return
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # before torch is imported (it reads it once)
    import logging
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    row = run(args)
    print(json.dumps({k: row[k] for k in ("task", "init", "learning_rate", "lr_grid", "dev", "test",
                                          "seconds_per_run", "wall_s")}))


if __name__ == "__main__":
    main()
