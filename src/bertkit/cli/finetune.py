"""`bertkit finetune classification|tagging|squad|multiple-choice`, `bertkit predict`, `bertkit evaluate`.

Flag parsing only: the flags of a `finetune` subcommand are generated from the fields of `FinetuneConfig`
and of the task's settings dataclass (bertkit.cli.options: a new field is a new flag, its docstring the
help), and go back into them for `bertkit.tasks.finetune.run_finetuning`. Defaults are the dataclasses':
the paper's fine-tuning recipe (appendix A.3) and the original scripts' settings (max_seq_length 384,
doc_stride 128, max_query_length 64 for SQuAD).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from bertkit.cli.inference import INFERENCE_PRECISIONS
from bertkit.cli.options import options, take
from bertkit.tasks.classification import ClassificationSettings
from bertkit.tasks.finetune import FinetuneConfig
from bertkit.tasks.multiple_choice import MultipleChoiceSettings
from bertkit.tasks.squad import SquadSettings
from bertkit.tasks.tagging import TaggingSettings


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
FINETUNE = {"output": {"type": click.Path(file_okay=False, path_type=Path)},
            "learning_rate": {"type": _LearningRate(), "default": "auto"},
            "resume": {"type": click.Choice(["auto"]), "default": None, "callback": _auto}}


def _task_options(settings_class: type, exclude: tuple[str, ...] = (), **overrides: dict[str, Any]
                  ) -> Callable[[Callable], Callable]:
    """The options of every `finetune` subcommand: the files, FinetuneConfig's, then the task's settings
    except `exclude` (those the data decides: label names, SQuAD 2.0's threshold chosen on dev)."""
    def decorate(function: Callable) -> Callable:
        function = options(settings_class, exclude=exclude, overrides=overrides)(function)
        function = options(FinetuneConfig, overrides=FINETUNE)(function)
        function = click.option("--dev", "dev_files", required=True, multiple=True, type=click.Path(dir_okay=False),
                                help="Dev file, evaluated every epoch; repeat for more (the first selects the best "
                                     "epoch, e.g. MNLI matched then mismatched).")(function)
        return click.option("--train", "train_file", required=True, type=click.Path(dir_okay=False),
                            help="Training file.")(function)
    return decorate


def _run(kind: str, settings_class: type, flags: dict[str, Any], **task_options: Any) -> None:
    from bertkit.tasks.finetune import run_finetuning

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    cfg = FinetuneConfig(**take(FinetuneConfig, flags))
    task_options = {**take(settings_class, flags), **task_options}
    results = run_finetuning(kind, flags.pop("train_file"), list(flags.pop("dev_files")), cfg, task_options)
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
            click.echo(f"{key.replace('_', ' ')}: {results[key]} (longer than --max-seq-length)")
    click.echo(f"best model: {output / 'best'}; results: {output / 'eval_results.json'}")


@click.group(context_settings={"show_default": True})
def finetune() -> None:
    """Fine-tune a pre-trained BERT with one output layer (paper section 4)."""


@finetune.command()
@_task_options(ClassificationSettings, ("labels",), glue_task={"flag": "--task"})
@click.option("--regression", is_flag=True, help="Numeric labels, one output, mean squared error (generic files).")
def classification(regression: bool, **flags: Any) -> None:
    """Sentence or sentence-pair classification / regression (GLUE TSV, or CSV/TSV/JSONL by column)."""
    if flags["glue_task"]:
        from bertkit.data.glue import glue_task as lookup
        flags["glue_task"] = lookup(flags["glue_task"]).name
    _run("classification", ClassificationSettings, flags, regression=regression)


@finetune.command()
@_task_options(TaggingSettings, ("labels",))
def tagging(**flags: Any) -> None:
    """Token tagging, e.g. named entities (CoNLL-2003 files)."""
    _run("tagging", TaggingSettings, flags)


@finetune.command()
@_task_options(SquadSettings, ("null_score_diff_threshold",))
def squad(**flags: Any) -> None:
    """Extractive question answering (SQuAD v1.1 / v2.0 JSON)."""
    _run("squad", SquadSettings, flags)


@finetune.command(name="multiple-choice")
@_task_options(MultipleChoiceSettings)
def multiple_choice(**flags: Any) -> None:
    """Multiple choice (SWAG CSV, or JSONL with context/endings/label)."""
    _run("multiple-choice", MultipleChoiceSettings, flags)


def _inference_options(function: Callable) -> Callable:
    for option in reversed([
        click.option("--model", required=True, type=click.Path(file_okay=False),
                     help="Fine-tuned directory (OUTPUT/best of `bertkit finetune`)."),
        click.option("--input", "input_file", required=True, type=click.Path(dir_okay=False),
                     help="Classification: CSV/TSV with a header row or JSONL (or the GLUE layout it was trained "
                          "on); CoNLL (tagging); SQuAD JSON; SWAG CSV or JSONL (multiple choice)."),
        click.option("--output", required=True, type=click.Path(file_okay=False), help="Directory for the results."),
        click.option("--text-column", default=None,
                     help="Classification: column/key of the text [default: the one the model was fine-tuned with]."),
        click.option("--text-pair-column", default=None,
                     help="Classification of pairs: column/key of the second text [default: as fine-tuned]."),
        click.option("--id-column", default=None,
                     help="Classification: column/key whose value identifies each row in the predictions "
                          "[default: a column named id if there is one, else file:line]."),
        click.option("--batch-size", default=64, show_default=True, type=int, help="Inference batch size."),
        click.option("--device", default="auto", show_default=True, help="auto, cpu or cuda."),
    ]):
        function = option(function)
    return function


@click.command(context_settings={"show_default": True})
@_inference_options
@click.option("--precision", type=click.Choice(INFERENCE_PRECISIONS), default="auto",
              help="auto: the faster of fp32 and bf16 as measured on this machine (`bertkit doctor`); int8: "
                   "encoder layers quantized, CPU only.")
def predict(model: str, input_file: str, output: str, text_column: str | None, text_pair_column: str | None,
            id_column: str | None, batch_size: int, device: str, precision: str) -> None:
    """Predict a file with a fine-tuned directory (writes predictions into --output)."""
    from bertkit.tasks.finetune import predict_file

    columns = {"text_column": text_column, "text_pair_column": text_pair_column, "id_column": id_column}
    counts = predict_file(model, input_file, output, evaluate=False, batch_size=batch_size, device=device,
                          columns=columns, precision=precision)
    skipped = f"; {counts['skipped']} records skipped (listed above)" if counts["skipped"] else ""
    click.echo(f"{counts['examples']} predictions written to {output}{skipped}")


@click.command(context_settings={"show_default": True})
@_inference_options
@click.option("--label-column", default=None,
              help="Classification: column/key of the gold label [default: the one the model was fine-tuned with].")
@click.option("--precision", type=click.Choice(INFERENCE_PRECISIONS), default="fp32",
              help="fp32 reproduces the dev scores of fine-tuning exactly; auto, bf16 or int8 score the faster "
                   "model (e.g. to measure what int8 costs).")
def evaluate(model: str, input_file: str, output: str, text_column: str | None, text_pair_column: str | None,
             id_column: str | None, label_column: str | None, batch_size: int, device: str, precision: str) -> None:
    """Score a fine-tuned directory on a labelled file (eval_results.json + predictions in --output)."""
    from bertkit.tasks.finetune import predict_file

    columns = {"text_column": text_column, "text_pair_column": text_pair_column, "label_column": label_column,
               "id_column": id_column}
    metrics = predict_file(model, input_file, output, evaluate=True, batch_size=batch_size, device=device,
                           columns=columns, precision=precision)
    click.echo(json.dumps(metrics, indent=2, sort_keys=True))
