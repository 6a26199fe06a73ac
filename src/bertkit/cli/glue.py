"""`bertkit glue`: every task of a GLUE directory fine-tuned with the paper's recipe, one table out.

Flag parsing only: the flags come from `GlueSettings` (the directory, the tasks, the learning-rate grid,
the sequence length) and `FinetuneSettings` (every `bertkit finetune` flag except --learning-rate, which the
grid replaces, and --compare-random-init: the table scores the model given), both in bertkit.settings, so
`--help` imports no torch; `bertkit.workflows.glue.run_glue` runs the sweep. Defaults where the command differs
from `bertkit finetune`: seeds 1,2,3 (a mean ± std per task) and an --output of its own.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import click

from bertkit.cli.finetune import FINETUNE, NOT_FLAGS
from bertkit.cli.options import settings_from_flags, settings_options
from bertkit.errors import BertkitError
from bertkit.settings import GLUE_LEARNING_RATES, GLUE_SEEDS, FinetuneSettings, GlueSettings


class FloatList(click.ParamType):
    """Comma-separated positive numbers ("5e-5,3e-5") -> a tuple."""

    name = "FLOATS"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, tuple):
            return value
        flag = param.opts[0] if param is not None else "value"
        try:
            items = tuple(float(v) for v in str(value).split(",") if v.strip())
        except ValueError:
            raise BertkitError(f"{flag} {value!r}: expected comma-separated numbers, e.g. 5e-5,3e-5") from None
        if not items or not all(item > 0 for item in items):
            raise BertkitError(f"{flag} {value!r}: give one or more positive numbers, e.g. 5e-5,3e-5")
        return items


GLUE_OPTIONS: dict[str, dict[str, Any]] = {
    "learning_rates": {"type": FloatList(), "default": ",".join(f"{rate:g}" for rate in GLUE_LEARNING_RATES)}}
SWEEP_OPTIONS: dict[str, dict[str, Any]] = {
    **{name: override for name, override in FINETUNE.items() if name != "learning_rate"},
    "output": {"default": Path("runs/glue"),
               "help": "Output directory: one `bertkit finetune` output per run in OUTPUT/<task>/lr-<rate>/, the "
                       "table in glue_results.md and glue_results.json, the sweep's record in glue_sweep.json."},
    "seeds": {"default": ",".join(map(str, GLUE_SEEDS)),
              "help": "Seeds, comma-separated: every (task, learning rate) is fine-tuned once per seed; the "
                      "table shows the mean and each task the mean ± std over them."},
    "resume": {**FINETUNE["resume"],
               "help": "auto: continue the sweep in --output: finished (task, learning rate) runs are kept, an "
                       "interrupted one continues from its checkpoint."},
    "overwrite": {"help": "Delete an earlier GLUE sweep in --output first (its task folders and tables); "
                          "otherwise a non-empty --output is refused."},
}


@click.command(context_settings={"show_default": True})
@settings_options(GlueSettings, overrides=GLUE_OPTIONS)
@settings_options(FinetuneSettings, exclude=(*NOT_FLAGS, "learning_rate", "compare_random_init"),
                  overrides=SWEEP_OPTIONS)
def glue(**flags: Any) -> None:
    """Fine-tune on every GLUE task in --data (the paper's recipe: batch 32, 3 epochs, the learning rate
    chosen on dev among 5e-5, 4e-5, 3e-5, 2e-5), several seeds each, and write one table like the paper's
    Table 1 (dev scores, the paper's average)."""
    from bertkit.workflows import glue as glue_workflow  # torch: only when the command runs, not for --help

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    settings = settings_from_flags(GlueSettings, flags)
    finetune_settings = settings_from_flags(FinetuneSettings, flags)
    results = glue_workflow.run_glue(settings, finetune_settings, progress=click.echo)
    table = glue_workflow.markdown_table(results).splitlines()
    click.echo("\n".join(table[2:5]))  # the paper-style row
    click.echo(f"average: {results['average']['rule']}; tables: {finetune_settings.output / glue_workflow.TABLE_MD}, "
               f"{finetune_settings.output / glue_workflow.TABLE_JSON}")
