"""`bertkit finetune <kind>`: one subcommand per task kind (bertkit.settings.TASK_SETTINGS), and `embedding`.

Flag parsing only: the flags of a `finetune` subcommand are generated from the fields of `FinetuneSettings`
and of the task's settings dataclass (bertkit.settings, torch-free, so `--help` answers at once;
bertkit.cli.options: a new field is a new flag, its docstring the help), and go back into them for
`bertkit.workflows.finetune.run_finetuning`, imported only when the command runs. Defaults are the dataclasses':
the paper's fine-tuning recipe (appendix A.3) and the original scripts' settings (max_seq_length 384,
doc_stride 128, max_query_length 64 for SQuAD).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from bertkit.cli.options import memory_line, pop_settings, settings_from_flags, settings_options
from bertkit.settings import (
    TASK_SETTINGS,
    ClassificationSettings,
    EmbeddingSettings,
    FinetuneSettings,
    TaskSettings,
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


NOT_FLAGS = ("max_time_s", "warmup_steps", "betas", "max_grad_norm", "optimizer", "seed", "shuffle", "num_workers",
             "log_every", "read_every", "eval_every_epoch", "save_on_eval", "keep_last", "max_nonfinite_steps",
             "best_metric", "greater_is_better", "cuda_graphs", "fused_kernels")
"""TrainConfig settings fine-tuning decides itself (a seed per --seeds, evaluation and checkpoints on dev, the
best dev metric, the progress cadence) or keeps at the paper's (AdamW, clipping at 1.0), and the levers of
pre-training's GPU step."""

# Where the command line differs from FinetuneSettings: `--learning-rate auto` and `--resume auto` spell None/True,
# and the budget and cadence flags mean what transformers' Trainer users expect of them.
FINETUNE: dict[str, dict[str, Any]] = {
    "learning_rate": {"type": _LearningRate(), "default": "auto",
                      "help": "Peak learning rate, or auto: from the model's width, depth and pre-training (5e-5 for "
                              "BERT-Base pre-trained elsewhere, as the paper; more for smaller and briefly "
                              "pre-trained models; bertkit.workflows.recipes.finetune_learning_rate); the choice is "
                              "printed and kept in eval_results.json."},
    "resume": {"type": click.Choice(["auto"]), "default": None, "callback": _auto},
    "max_steps": {"help": "Optimizer steps per seed instead of --epochs (it overrides them, as in transformers' "
                          "Trainer)."},
    "eval_every": {"help": "Evaluate on dev every this many optimizer steps; unset: at the end of every epoch."},
    "save_every": {"help": "Write a resumable checkpoint every this many steps; unset: at every evaluation."},
    "early_stopping_patience": {"help": "Stop a seed after this many evaluations without dev improvement; unset: "
                                        "train all epochs."},
}


def finetune_flags(settings_class: type, exclude: tuple[str, ...] = (), *, run_exclude: tuple[str, ...] = (),
                   overrides: dict[str, dict[str, Any]] | None = None) -> Callable[[Callable], Callable]:
    """The options of every `finetune` subcommand: the files, FinetuneSettings's (except `run_exclude`: what
    `distill` decides from its teacher), then the task's settings except `exclude` (those the data decides: label
    names, SQuAD 2.0's threshold chosen on dev)."""
    def decorate(function: Callable) -> Callable:
        function = settings_options(settings_class, exclude=exclude, overrides=overrides)(function)
        function = settings_options(FinetuneSettings, exclude=(*NOT_FLAGS, *run_exclude), overrides=FINETUNE)(
            function)
        function = click.option("--dev", "dev_files", multiple=True, type=click.Path(),
                                help="Dev file (or `datasets` directory), evaluated every epoch; repeat for more "
                                     "(the first selects the best epoch, e.g. MNLI matched then mismatched). "
                                     "Without one: one seed trains its whole budget and its model is "
                                     "OUTPUT/best.")(function)
        return click.option("--train", "train_file", required=True, type=click.Path(),
                            help="Training file, or a `datasets` save_to_disk directory (one split's).")(function)
    return decorate


def _run(kind: str, settings_class: type, flags: dict[str, Any], **task_settings: Any) -> None:
    from bertkit.workflows import finetune as finetuning  # torch: only when the command runs, not for --help

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    settings = settings_from_flags(FinetuneSettings, flags)
    task_settings = {**pop_settings(settings_class, flags), **task_settings}
    results = finetuning.run_finetuning(kind, flags.pop("train_file"), list(flags.pop("dev_files")), settings,
                                        task_settings)
    print_summary(results, settings.output)


def print_summary(results: dict[str, Any], output: Path) -> None:
    for seed, metrics in results["seeds"].items():
        shown = ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()
                          if k != "step" and not k.endswith("_seconds") and isinstance(v, float))
        took = f", {metrics['train_seconds']:,.0f} s" if "train_seconds" in metrics else ""
        click.echo(f"seed {seed}: {shown} (step {metrics['step']}{took})" if shown else
                   f"seed {seed}: step {metrics['step']}{took}")
    if len(results["seeds"]) > 1:
        for name, stats in results["summary"].items():
            click.echo(f"{name}: mean {stats['mean']:.4f} ± {stats['std']:.4f} over {len(results['seeds'])} "
                       f"seeds, best {stats['max']:.4f} (seed {results['best_seed']})")
    for key in ("truncated_train_examples", "truncated_dev_examples"):
        if results.get(key):
            click.echo(f"{key.replace('_', ' ')}: {results[key]} (longer than --max-seq-length; with "
                       "--long-documents windows: than --max-windows windows)")
    compared = results.get("random_init") or {}
    if "kept" in compared:
        kept, other = compared["kept"], compared["other"]
        click.echo(f"kept {kept}: dev {compared['metric']} mean {compared[kept]['mean']:.4f} against "
                   f"{compared[other]['mean']:.4f} ({other}; {compared['note']}); the other's best model: "
                   f"{compared['other_model']}")
    if results.get("peak_memory"):
        click.echo(f"peak memory: {memory_line(results['peak_memory'])}")
    click.echo(f"best model: {output / 'best'}; results: {output / 'eval_results.json'}")


@click.group(context_settings={"show_default": True})
def finetune() -> None:
    """Fine-tune a pre-trained BERT with one output layer (paper section 4)."""


COMMAND_EXTRAS: dict[type, dict[str, Any]] = {ClassificationSettings: {"glue_task": {"flag": "--task"}}}
"""Where a kind's flags differ from its settings fields (classification's GLUE task is `--task`)."""


def _task_command(settings_class: type[TaskSettings]) -> click.Command:
    """The `bertkit finetune <kind>` subcommand of one task kind, from its settings class."""
    def command(**flags: Any) -> None:
        extra: dict[str, Any] = {}
        if settings_class is ClassificationSettings:
            extra["regression"] = flags.pop("regression")
            if flags["glue_task"]:
                from bertkit.data.glue import glue_task as lookup
                flags["glue_task"] = lookup(flags["glue_task"]).name
        _run(settings_class.kind, settings_class, flags, **extra)

    command.__doc__ = settings_class.command_help
    if settings_class is ClassificationSettings:
        command = click.option("--regression", is_flag=True,
                               help="Numeric labels, one output, mean squared error (generic files).")(command)
    command = finetune_flags(settings_class, settings_class.decided_by_data,
                             overrides=COMMAND_EXTRAS.get(settings_class, {}))(command)
    return finetune.command(name=settings_class.kind)(command)


for _settings_class in TASK_SETTINGS:
    _task_command(_settings_class)


KEPT_FROM_DIRECTORY = {
    "max_seq_length": "the starting sentence-transformers directory's, else 128",
    "pooling": "the starting sentence-transformers directory's, else mean",
    "normalize": "as the starting sentence-transformers directory (its Normalize module), else off",
}
"""`finetune embedding` settings a starting sentence-transformers directory decides unless their flag is given."""


@finetune.command()
@finetune_flags(EmbeddingSettings, ("given",), run_exclude=("compare_random_init",),
                overrides={name: {"default": None, "default_text": text} for name, text in KEPT_FROM_DIRECTORY.items()})
def embedding(**flags: Any) -> None:
    """Sentence embeddings from (anchor, positive[, negative]) pairs: in-batch negatives (multiple negatives
    ranking loss), retrieval scored on --dev before and after; OUTPUT/best is a sentence-transformers directory
    (CSV/TSV/JSONL/Parquet/`datasets` directory by column)."""
    from bertkit.workflows.embedding import METRIC_NAMES, run_embedding_training  # torch: only when the command runs

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    settings = settings_from_flags(FinetuneSettings, flags)
    given = tuple(name for name in KEPT_FROM_DIRECTORY if flags[name] is not None)
    embedding_settings = settings_from_flags(EmbeddingSettings, flags, drop_none=KEPT_FROM_DIRECTORY, given=given)
    results = run_embedding_training(flags.pop("train_file"), list(flags.pop("dev_files")), settings,
                                     embedding_settings)
    if "before_" + METRIC_NAMES[0] in results:
        click.echo("before training: " + ", ".join(f"{k} {results['before_' + k]:.4f}" for k in METRIC_NAMES))
    print_summary({**results, "seeds": {s: {k: v for k, v in m.items() if not k.startswith("before_")}
                                         for s, m in results["seeds"].items()}}, settings.output)
    if results["truncated_train_texts"]:
        click.echo(f"truncated train texts: {results['truncated_train_texts']} (longer than --max-seq-length)")
    if results["skipped_train"]:
        click.echo(f"skipped train rows: {results['skipped_train']} (see the warning above)")
