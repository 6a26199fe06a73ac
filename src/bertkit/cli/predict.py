"""`bertkit predict` and `bertkit evaluate`: a fine-tuned directory on a file. Flag parsing only; the work is
`bertkit.tasks.evaluate.predict_file`.

Design decision: these commands live apart from `bertkit finetune`, whose flags are generated from the
fine-tuning dataclasses (importing torch), so that their `--help` answers without importing torch.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import click

from bertkit.settings import INFERENCE_PRECISIONS


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
