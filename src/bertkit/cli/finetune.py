"""`bertkit finetune classification|tagging|squad|multiple-choice`, `bertkit predict`, `bertkit evaluate`.

Flag parsing only: every command builds a `FinetuneConfig` / task options and calls
`bertkit.tasks.finetune`. Defaults are the paper's fine-tuning recipe (appendix A.3) and the original
scripts' settings (max_seq_length 384, doc_stride 128, max_query_length 64 for SQuAD).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from bertkit.cli.inference import INFERENCE_PRECISIONS
from bertkit.errors import BertkitError

# The names of bertkit.train.optim.SCHEDULES, repeated so that --help does not import torch (a test
# checks that the two agree).
SCHEDULE_NAMES = ("linear", "cosine", "constant-with-warmup", "inverse-sqrt")


def _int_list(value: str, flag: str) -> tuple[int, ...]:
    try:
        items = tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise BertkitError(f"{flag} {value!r}: expected comma-separated integers, e.g. 1,2,3") from None
    if not items:
        raise BertkitError(f"{flag} is empty; give at least one integer")
    return items


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


def _common(max_seq_length: int) -> Callable[[Callable], Callable]:
    """The options every `finetune` subcommand shares (model, files, optimisation, seeds, features)."""
    options = [
        click.option("--model", required=True, help="Checkpoint directory, or a preset name (random init; needs --tokenizer)."),
        click.option("--tokenizer", default=None, help="Directory with vocab.txt [default: the --model directory]."),
        click.option("--train", "train_file", required=True, type=click.Path(dir_okay=False), help="Training file."),
        click.option("--dev", "dev_files", required=True, multiple=True, type=click.Path(dir_okay=False),
                     help="Dev file, evaluated every epoch; repeat for more (the first selects the best epoch, "
                          "e.g. MNLI matched then mismatched)."),
        click.option("--output", required=True, type=click.Path(file_okay=False), help="Output directory."),
        click.option("--max-seq-length", default=max_seq_length, show_default=True, type=int,
                     help="Longest input in tokens, [CLS]/[SEP] included."),
        click.option("--epochs", default=3.0, show_default=True, type=float, help="Passes over the training data."),
        click.option("--max-steps", default=None, type=int,
                     help="Optimizer steps per seed instead of --epochs (overrides it) [default: off]."),
        click.option("--eval-every", default=None, type=int,
                     help="Evaluate on dev every N optimizer steps [default: at the end of every epoch]."),
        click.option("--save-every", default=None, type=int,
                     help="Write a resumable checkpoint every N steps [default: at every evaluation]."),
        click.option("--batch-size", default=32, show_default=True, type=int, help="Examples per optimizer step."),
        click.option("--gradient-accumulation-steps", default=1, show_default=True, type=int,
                     help="Micro-batches per optimizer step (batch size must be a multiple)."),
        click.option("--learning-rate", default="auto", show_default=True, type=_LearningRate(),
                     help="Peak AdamW learning rate, or auto: from the model's width and pre-training (5e-5 for "
                          "BERT-Base pre-trained elsewhere, as the paper; more for smaller and briefly pre-trained "
                          "models); the choice is printed."),
        click.option("--warmup-ratio", default=0.1, show_default=True, type=float,
                     help="Fraction of steps of linear warmup before the decay."),
        click.option("--lr-schedule", default="linear", show_default=True, type=click.Choice(list(SCHEDULE_NAMES)),
                     help="Learning rate after the warmup: linear or cosine decay to 0, constant, or inverse "
                          "square root."),
        click.option("--weight-decay", default=0.01, show_default=True, type=float,
                     help="AdamW weight decay (not on biases and LayerNorm)."),
        click.option("--adam-epsilon", default=1e-8, show_default=True, type=float,
                     help="AdamW epsilon (transformers' default; the original BERT code used 1e-6)."),
        click.option("--dropout", default=0.1, show_default=True, type=float, help="Dropout in the encoder and before the head."),
        click.option("--precision", default="auto", show_default=True, type=click.Choice(["auto", "fp32", "bf16", "fp16"]),
                     help="auto: the faster of fp32 and bf16 as measured on this machine (`bertkit doctor`); "
                          "bf16 on GPUs that support it."),
        click.option("--seeds", default="1", show_default=True,
                     help="Comma-separated seeds; one fine-tuning each, reported each, mean ± std and best."),
        click.option("--early-stopping-patience", default=None, type=int,
                     help="Stop a seed after this many epochs without dev improvement [default: off]."),
        click.option("--freeze-encoder", is_flag=True, help="Train only the head (feature-based approach)."),
        click.option("--feature-layers", default=None,
                     help="Feature-based head on these hidden states of a frozen encoder, e.g. -1,-2,-3,-4 "
                          "(0 = embeddings)."),
        click.option("--feature-combine", default="concat", show_default=True, type=click.Choice(["concat", "sum", "mean"]),
                     help="How --feature-layers are combined."),
        click.option("--eval-batch-size", default=64, show_default=True, type=int, help="Batch size of evaluation."),
        click.option("--device", default="auto", show_default=True, help="auto, cpu or cuda."),
        click.option("--group-by-length/--no-group-by-length", default=True, show_default=True,
                     help="Batch training examples of similar length together (batch order still shuffled)."),
        click.option("--compile", "compile_layers", is_flag=True,
                     help="torch.compile the encoder layers (~30-60 s of compilation per seed); measured faster on "
                          "shared CPU cores, no gain on idle ones (docs/performance.md)."),
        click.option("--resume", type=click.Choice(["auto"]), default=None,
                     help="auto: continue the run in --output (finished seeds are kept, an interrupted seed "
                          "resumes from its checkpoint, bit-exact on CPU)."),
        click.option("--overwrite", is_flag=True, help="Delete an earlier fine-tuning run in --output first."),
    ]

    def decorate(function: Callable) -> Callable:
        for option in reversed(options):
            function = option(function)
        return function
    return decorate


def _run(kind: str, common: dict[str, Any], task_options: dict[str, Any]) -> None:
    from bertkit.tasks.finetune import FinetuneConfig, run_finetuning

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    feature_layers = common.pop("feature_layers")
    cfg = FinetuneConfig(
        model=common.pop("model"), tokenizer=common.pop("tokenizer"), output=Path(common.pop("output")),
        seeds=_int_list(common.pop("seeds"), "--seeds"),
        feature_layers=_int_list(feature_layers, "--feature-layers") if feature_layers else None, **{
            k: common.pop(k) for k in ("epochs", "max_steps", "eval_every", "save_every", "batch_size",
                                       "gradient_accumulation_steps", "learning_rate", "warmup_ratio",
                                       "lr_schedule", "weight_decay", "adam_epsilon", "dropout", "precision",
                                       "early_stopping_patience", "freeze_encoder", "feature_combine",
                                       "eval_batch_size", "device", "group_by_length", "overwrite")},
        compile=common.pop("compile_layers"), resume=common.pop("resume") == "auto")
    train, devs = common.pop("train_file"), list(common.pop("dev_files"))
    results = run_finetuning(kind, train, devs, cfg, {**task_options, "max_seq_length": common.pop("max_seq_length")})
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
@_common(128)
@click.option("--task", "glue_task", default=None,
              help="GLUE task whose TSV layout and metrics to use: cola, sst2, mrpc, stsb, qqp, mnli, qnli, rte, wnli.")
@click.option("--text-column", default="text", show_default=True, help="Column/key of the text (generic files).")
@click.option("--text-pair-column", default=None, help="Column/key of the second text of a pair (generic files).")
@click.option("--label-column", default="label", show_default=True, help="Column/key of the label (generic files).")
@click.option("--regression", is_flag=True, help="Numeric labels, one output, mean squared error (generic files).")
def classification(glue_task: str | None, text_column: str, text_pair_column: str | None, label_column: str,
                   regression: bool, **common: Any) -> None:
    """Sentence or sentence-pair classification / regression (GLUE TSV, or CSV/TSV/JSONL by column)."""
    if glue_task:
        from bertkit.data.glue import glue_task as lookup
        glue_task = lookup(glue_task).name
    _run("classification", common, {"glue_task": glue_task, "text_column": text_column,
                                    "text_pair_column": text_pair_column, "label_column": label_column,
                                    "regression": regression})


@finetune.command()
@_common(128)
@click.option("--doc-stride", default=64, show_default=True, type=int,
              help="Sub-tokens between the starts of overlapping windows over a long sentence.")
@click.option("--tag-scheme", default="BIO", show_default=True, type=click.Choice(["BIO", "IOB1", "BIOES"]),
              help="Tagging scheme of the labels (entity scores follow conlleval, which reads all three).")
def tagging(doc_stride: int, tag_scheme: str, **common: Any) -> None:
    """Token tagging, e.g. named entities (CoNLL-2003 files)."""
    _run("tagging", common, {"doc_stride": doc_stride, "tag_scheme": tag_scheme})


@finetune.command()
@_common(384)
@click.option("--version-2-with-negative", is_flag=True, help="SQuAD 2.0: questions may have no answer.")
@click.option("--doc-stride", default=128, show_default=True, type=int, help="Tokens between context window starts.")
@click.option("--max-query-length", default=64, show_default=True, type=int, help="Question tokens kept.")
@click.option("--n-best-size", default=20, show_default=True, type=int, help="Candidate starts/ends per window.")
@click.option("--max-answer-length", default=30, show_default=True, type=int, help="Longest answer in tokens.")
def squad(version_2_with_negative: bool, doc_stride: int, max_query_length: int, n_best_size: int,
          max_answer_length: int, **common: Any) -> None:
    """Extractive question answering (SQuAD v1.1 / v2.0 JSON)."""
    _run("squad", common, {"version_2_with_negative": version_2_with_negative, "doc_stride": doc_stride,
                           "max_query_length": max_query_length, "n_best_size": n_best_size,
                           "max_answer_length": max_answer_length})


@finetune.command(name="multiple-choice")
@_common(128)
def multiple_choice(**common: Any) -> None:
    """Multiple choice (SWAG CSV, or JSONL with context/endings/label)."""
    _run("multiple-choice", common, {})


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
    from bertkit.tasks.evaluate import predict_file

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
    from bertkit.tasks.evaluate import predict_file

    columns = {"text_column": text_column, "text_pair_column": text_pair_column, "label_column": label_column,
               "id_column": id_column}
    metrics = predict_file(model, input_file, output, evaluate=True, batch_size=batch_size, device=device,
                           columns=columns, precision=precision)
    click.echo(json.dumps(metrics, indent=2, sort_keys=True))
