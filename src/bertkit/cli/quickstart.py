"""`bertkit quickstart`: vocabulary -> data -> pre-train -> fine-tune (pre-trained and random init) -> report.

Flag parsing only: the flags become a `QuickstartConfig` for `bertkit.quickstart.run_quickstart`. The
pre-training recipe is fixed (the one measured in docs/quickstart.md); the flags set the output, the
budget, and how much fine-tuning to do.
"""

from __future__ import annotations

import logging
from pathlib import Path

import click

from bertkit.errors import BertkitError


def _seeds(text: str) -> tuple[int, ...]:
    try:
        seeds = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise BertkitError(f"--seeds {text!r}: expected comma-separated integers such as 1,2,3") from None
    if len(set(seeds)) != len(seeds):
        raise BertkitError(f"--seeds {text!r}: a seed is repeated")
    return seeds


@click.command(context_settings={"show_default": True})
@click.option("--output", default="quickstart", type=click.Path(file_okay=False, path_type=Path),
              help="Directory for every stage's output (vocab/, data/, pretrain/, finetune-*/) and report.md.")
@click.option("--minutes", default=10.0, type=float,
              help="Time budget of the whole command in minutes (vocabulary, data, pre-training, both fine-tunings, "
                   "report); the split is planned from throughput measured on this machine and printed.")
@click.option("--max-steps", default=None, type=int,
              help="Pre-train for this many steps instead of a time budget (a step budget does not depend on the "
                   "machine's load; fine-tuning then runs all its epochs and seeds; see docs/quickstart.md).")
@click.option("--seeds", default="1,2,3", help="Comma-separated fine-tuning seeds, each run for both initialisations.")
@click.option("--finetune-epochs", default=5.0, type=float, help="Fine-tuning epochs (the best dev epoch is kept).")
@click.option("--train-examples", default=1000, type=int,
              help="Labelled training verses used: a seeded subset of the bundled 4,000 (0: all of them).")
@click.option("--no-baseline", is_flag=True, help="Skip fine-tuning from random initialisation.")
@click.option("--resume", is_flag=True, help="Keep the stages already complete in --output and run the rest.")
@click.option("--overwrite", is_flag=True, help="Delete an earlier quickstart's output in --output first.")
@click.option("--device", default="auto", type=click.Choice(["auto", "cpu", "cuda"]), help="Device.")
def quickstart(output, minutes, max_steps, seeds, finetune_epochs, train_examples, no_baseline, resume, overwrite,
               device) -> None:
    """Pre-train bert-mini on the bundled King James Bible, fine-tune it and a randomly initialised twin on
    the bundled verse-classification task, and write report.md with the curves and the comparison."""
    from dataclasses import replace

    given = click.get_current_context().get_parameter_source

    from bertkit.quickstart import QuickstartConfig, Recipe, run_quickstart

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    recipe = replace(Recipe(), finetune_epochs=finetune_epochs, train_examples=train_examples or None)
    config = QuickstartConfig(output=output, minutes=None if max_steps else minutes, max_steps=max_steps,
                              seeds=_seeds(seeds), recipe=recipe,
                              seeds_fixed=given("seeds") is not click.core.ParameterSource.DEFAULT,
                              epochs_fixed=given("finetune_epochs") is not click.core.ParameterSource.DEFAULT,
                              random_baseline=not no_baseline, overwrite=overwrite, resume=resume, device=device)
    run_quickstart(config, echo=click.echo)
