"""`bertkit predict` and `bertkit evaluate`: a fine-tuned directory on a file. Flag parsing only; the work is
`bertkit.workflows.predict.predict_file`.

Design decision: the flags of both commands are generated (bertkit.cli.options) from `PredictSettings`
(bertkit.settings, torch-free, so `--help` answers at once), which is what `predict_file` takes. They
differ in two settings: evaluate reads the gold labels (`--label-column`, `--tags-column`) and defaults to
fp32, which reproduces the dev scores of fine-tuning exactly; predict defaults to auto precision.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import click

from bertkit.cli.options import settings_from_flags, settings_options
from bertkit.settings import PredictSettings


def _predict_file(settings: PredictSettings) -> dict[str, Any]:
    from bertkit.workflows.predict import predict_file  # torch: only when the command runs, not for --help

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")  # e.g. the precision
    return predict_file(settings)


@click.command(context_settings={"show_default": True})
@settings_options(PredictSettings, exclude=("label_column", "tags_column", "evaluate"),
         overrides={"precision": {"default": "auto"}})
def predict(**flags: Any) -> None:
    """Predict a file with a fine-tuned directory (writes predictions into --output)."""
    settings = settings_from_flags(PredictSettings, flags)
    counts = _predict_file(settings)
    skipped = f"; {counts['skipped']} records skipped (listed above)" if counts["skipped"] else ""
    click.echo(f"{counts['examples']} predictions written to {settings.output}{skipped}")


@click.command(context_settings={"show_default": True})
@settings_options(PredictSettings, exclude=("evaluate",))
def evaluate(**flags: Any) -> None:
    """Score a fine-tuned directory on a labelled file (eval_results.json + predictions in --output)."""
    metrics = _predict_file(settings_from_flags(PredictSettings, flags, evaluate=True))
    click.echo(json.dumps(metrics, indent=2, sort_keys=True))
