"""`bertkit finetune classification|tagging|squad|multiple-choice`.

Flag parsing only: the flags of a `finetune` subcommand are generated from the fields of `FinetuneConfig`
and of the task's settings dataclass (bertkit.settings, torch-free, so `--help` answers at once;
bertkit.cli.options: a new field is a new flag, its docstring the help), and go back into them for
`bertkit.tasks.finetune.run_finetuning`, imported only when the command runs. Defaults are the dataclasses':
the paper's fine-tuning recipe (appendix A.3) and the original scripts' settings (max_seq_length 384,
doc_stride 128, max_query_length 64 for SQuAD).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from bertkit.cli.options import memory_line, options, take, use_threads
from bertkit.settings import (
    ClassificationSettings,
    EmbeddingSettings,
    FinetuneConfig,
    MultipleChoiceSettings,
    SquadSettings,
    TaggingSettings,
)


class _LearningRate(click.ParamType):
    """A positive number, or auto (None: the fine-tuning learning-rate rule decides)."""

    name = "auto|FLOAT"

    def convert(self, value: Any, param: Any, ctx: Any) -> float | None:
        if value is None or value == "auto":
            return None
        try:
            return float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is neither auto nor a number such as 3e-5", param, ctx)


def _auto(ctx: click.Context, param: click.Parameter, value: str | None) -> bool:
    return value == "auto"


# Where the command line differs from FinetuneConfig: `--learning-rate auto` and `--resume auto` spell None/True.
FINETUNE: dict[str, dict[str, Any]] = {"learning_rate": {"type": _LearningRate(), "default": "auto"},
            "resume": {"type": click.Choice(["auto"]), "default": None, "callback": _auto}}


def _task_options(settings_class: type, exclude: tuple[str, ...] = (), **overrides: dict[str, Any]
                  ) -> Callable[[Callable], Callable]:
    """The options of every `finetune` subcommand: the files, FinetuneConfig's, then the task's settings
    except `exclude` (those the data decides: label names, SQuAD 2.0's threshold chosen on dev)."""
    def decorate(function: Callable) -> Callable:
        function = options(settings_class, exclude=exclude, overrides=overrides)(function)
        function = options(FinetuneConfig, overrides=FINETUNE)(function)
        function = click.option("--dev", "dev_files", required=True, multiple=True, type=click.Path(),
                                help="Dev file (or `datasets` directory), evaluated every epoch; repeat for more "
                                     "(the first selects the best epoch, e.g. MNLI matched then mismatched).")(function)
        return click.option("--train", "train_file", required=True, type=click.Path(),
                            help="Training file, or a `datasets` save_to_disk directory (one split's).")(function)
    return decorate


def _run(kind: str, settings_class: type, flags: dict[str, Any], **task_options: Any) -> None:
    from bertkit.tasks import finetune as finetuning  # torch: only when the command runs, not for --help

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    cfg = FinetuneConfig(**take(FinetuneConfig, flags))
    use_threads(cfg.threads)
    task_options = {**take(settings_class, flags), **task_options}
    results = finetuning.run_finetuning(kind, flags.pop("train_file"), list(flags.pop("dev_files")), cfg, task_options)
    _print_summary(results, cfg.output)


def _print_summary(results: dict[str, Any], output: Path) -> None:
    for seed, metrics in results["seeds"].items():
        shown = ", ".join(f"{k} {v:.4f}" for k, v in metrics.items() if k != "step" and isinstance(v, float))
        click.echo(f"seed {seed}: {shown} (step {metrics['step']})")
    if len(results["seeds"]) > 1:
        for name, stats in results["summary"].items():
            click.echo(f"{name}: mean {stats['mean']:.4f} ± {stats['std']:.4f} over {len(results['seeds'])} "
                       f"seeds, best {stats['max']:.4f} (seed {results['best_seed']})")
    for key in ("truncated_train_examples", "truncated_dev_examples"):
        if results.get(key):
            click.echo(f"{key.replace('_', ' ')}: {results[key]} (longer than --max-seq-length; with "
                       "--long-documents windows: than --max-windows windows)")
    if results.get("peak_memory"):
        click.echo(f"peak memory: {memory_line(results['peak_memory'])}")
    click.echo(f"best model: {output / 'best'}; results: {output / 'eval_results.json'}")


@click.group(context_settings={"show_default": True})
def finetune() -> None:
    """Fine-tune a pre-trained BERT with one output layer (paper section 4)."""


@finetune.command()
@_task_options(ClassificationSettings, ("labels",), glue_task={"flag": "--task"})
@click.option("--regression", is_flag=True, help="Numeric labels, one output, mean squared error (generic files).")
def classification(regression: bool, **flags: Any) -> None:
    """Sentence or sentence-pair classification / regression (GLUE TSV, or CSV/TSV/JSONL/Parquet/`datasets`
    directory by column)."""
    if flags["glue_task"]:
        from bertkit.data.glue import glue_task as lookup
        flags["glue_task"] = lookup(flags["glue_task"]).name
    _run("classification", ClassificationSettings, flags, regression=regression)


@finetune.command()
@_task_options(TaggingSettings, ("labels",))
def tagging(**flags: Any) -> None:
    """Token tagging, e.g. named entities (CoNLL-2003 files, or JSONL/Parquet/`datasets` directory with token and
    tag lists by --tokens-column/--tags-column)."""
    _run("tagging", TaggingSettings, flags)


@finetune.command()
@_task_options(SquadSettings, ("null_score_diff_threshold",))
def squad(**flags: Any) -> None:
    """Extractive question answering (SQuAD v1.1 / v2.0 JSON, or JSONL/Parquet/`datasets` directory in the
    `datasets` squad layout)."""
    _run("squad", SquadSettings, flags)


@finetune.command(name="multiple-choice")
@_task_options(MultipleChoiceSettings)
def multiple_choice(**flags: Any) -> None:
    """Multiple choice (SWAG CSV, or JSONL with context/endings/label; either layout as Parquet/`datasets`)."""
    _run("multiple-choice", MultipleChoiceSettings, flags)


@finetune.command()
@_task_options(EmbeddingSettings)
def embedding(**flags: Any) -> None:
    """Sentence embeddings from (anchor, positive[, negative]) pairs: in-batch negatives (multiple negatives
    ranking loss), retrieval scored on --dev before and after; OUTPUT/best is a sentence-transformers directory
    (CSV/TSV/JSONL/Parquet/`datasets` directory by column)."""
    from bertkit.tasks.embedding import METRIC_NAMES, run_embedding_training  # torch: only when the command runs

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    cfg = FinetuneConfig(**take(FinetuneConfig, flags))
    settings = EmbeddingSettings(**take(EmbeddingSettings, flags))
    results = run_embedding_training(flags.pop("train_file"), list(flags.pop("dev_files")), cfg, settings)
    click.echo("before training: " + ", ".join(f"{k} {results['before_' + k]:.4f}" for k in METRIC_NAMES))
    _print_summary({**results, "seeds": {s: {k: v for k, v in m.items() if not k.startswith("before_")}
                                         for s, m in results["seeds"].items()}}, cfg.output)
    if results["truncated_train_texts"]:
        click.echo(f"truncated train texts: {results['truncated_train_texts']} (longer than --max-seq-length)")
    if results["skipped_train"]:
        click.echo(f"skipped train rows: {results['skipped_train']} (see the warning above)")
