"""`bertkit quickstart`: vocabulary -> data -> pre-train -> fine-tune (pre-trained and random init) -> report.

Flag parsing only: the flags are generated (bertkit.cli.options) from `QuickstartSettings` and two fields of
its `Recipe` (bertkit.quickstart.config, torch-free, so `--help` answers at once) and go back into them
for `bertkit.quickstart.run_quickstart`. The pre-training recipe is fixed (the one measured in
docs/quickstart.md); the flags set the output, the budget, and how much fine-tuning to do. Seeds and
epochs given on the command line are kept by the time plan (`seeds_fixed`, `epochs_fixed`); their
defaults may be cut to fit a short budget.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import click

from bertkit.cli.options import settings_from_flags, settings_options
from bertkit.quickstart.config import QuickstartSettings, Recipe


def _all_when_zero(ctx: click.Context, param: click.Parameter, value: int) -> int | None:
    return value or None


RECIPE_FLAGS = ("finetune_epochs", "train_examples")
"""The fields of the recipe (QuickstartSettings.recipe) a user may change."""
NOT_FLAGS = ("seeds_fixed", "epochs_fixed", "eval_every", "eval_examples", "seed", "workers",
             *(field.name for field in dataclasses.fields(Recipe) if field.name not in RECIPE_FLAGS))
"""QuickstartSettings fields the command decides (the two *_fixed) or keeps at the measured recipe's."""


@click.command(context_settings={"show_default": True})
@settings_options(QuickstartSettings, exclude=NOT_FLAGS, overrides={
    "output": {"default": "quickstart"}, "train_examples": {"callback": _all_when_zero}})
def quickstart(**flags: Any) -> None:
    """Pre-train bert-mini on the bundled King James Bible, fine-tune it and a randomly initialised twin on
    the bundled verse-classification task, and write report.md with the curves and the comparison."""
    from bertkit.quickstart import run_quickstart

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    context = click.get_current_context()
    seeds_fixed, epochs_fixed = (context.get_parameter_source(flag) is not click.core.ParameterSource.DEFAULT
                                 for flag in ("seeds", "finetune_epochs"))
    if flags["max_steps"]:
        flags["minutes"] = None  # a step budget replaces the time budget
    config = settings_from_flags(QuickstartSettings, flags, seeds_fixed=seeds_fixed, epochs_fixed=epochs_fixed)
    run_quickstart(config, echo=click.echo)
