"""`bertkit pretrain`: pre-train BERT with masked LM + next sentence prediction.

Flag parsing only: the flags are generated from the fields of `PretrainSettings` and `TrainConfig`
(bertkit.settings, torch-free, so `--help` answers at once; bertkit.cli.options: a new field is a new
flag, its docstring the help) and go back into them for `bertkit.workflows.pretrain.pretrain`, imported
only when the command runs. `--recipe auto` (the default) fills the settings a budget decides
(sequence length, peak learning rate, warmup, dropout, masking rate, NSP, batch size) from the budget and
this machine's measured throughput (bertkit.workflows.recipes); each of them keeps the value of its own flag
when one is given, so those flags default to None here (RECIPE_DEFAULTS). The other defaults are the
dataclasses', the paper's (AdamW, betas 0.9/0.999, weight decay 0.01, clipping 1.0). Run it under
`torchrun` for several processes, GPUs or nodes; the flags stay the same (see docs/distributed.md).
"""

from __future__ import annotations

import dataclasses
import logging
import re
import signal
from pathlib import Path
from typing import Any

import click

from bertkit.cli.options import memory_line, settings_from_flags, settings_options
from bertkit.errors import BertkitError, Interrupted
from bertkit.settings import PretrainSettings, TrainConfig
from bertkit.workflows.recipes import (
    CONTINUE_PASSES,
    REFERENCE_WIDTH,
    continue_recipe,
    paper_recipe,
    short_recipe,
)

_DURATION = re.compile(r"^(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?$")


def parse_duration(text: str) -> float:
    """'2h', '90m', '1h30m', '45s' or a plain number of seconds -> seconds."""
    try:
        return float(text)
    except ValueError:
        pass
    match = _DURATION.match(text.strip().lower())
    if not text.strip() or match is None or not any(match.groups()):
        raise BertkitError(f"--max-time {text!r}: expected a duration such as 2h, 90m, 1h30m, 45s or seconds")
    hours, minutes, seconds = (float(g) if g else 0.0 for g in match.groups())
    return hours * 3600 + minutes * 60 + seconds


def _duration(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    return None if value is None else parse_duration(value)


_SHORT, _PAPER = short_recipe(REFERENCE_WIDTH), paper_recipe()  # --help quotes the recipes themselves
RECIPE_DEFAULTS = {
    "global_batch_size": f"the recipe's: paper {_PAPER.batch_size} (micro-batches of {_PAPER.micro_batch_size}), "
                         f"short {_SHORT.batch_size}",
    "learning_rate": f"the recipe's: paper {_PAPER.learning_rate:g}, short {_SHORT.learning_rate:g} x "
                     f"sqrt({REFERENCE_WIDTH} / hidden size)",
    "warmup_ratio": f"the recipe's: paper {_PAPER.warmup_ratio:g}, short {_SHORT.warmup_ratio:g}",
    "dropout": f"the recipe's: paper the model config's (0.1 in the presets), short {_SHORT.dropout:g}",
    "nsp": f"the recipe's: paper on, short {'on' if _SHORT.nsp else 'off'}, continue on when the checkpoint has an "
           "NSP head",
    "max_seq_length": f"the recipe's: paper the data's, short {_SHORT.max_seq_length}",
    "masked_lm_prob": f"the recipe's: paper the data's, short {_SHORT.masked_lm_prob:g}, continue "
                      f"{continue_recipe(REFERENCE_WIDTH, True, None).masked_lm_prob:g} (static data: its own)",
    "mlm_bias_init": f"the recipe's: short {_SHORT.mlm_bias_init}, paper and continue {_PAPER.mlm_bias_init}",
    "head_warmup_steps": "the recipe's: continue 10% of the budget (at most 500) for a checkpoint without its "
                         "MLM head, else 0",
}
"""The settings `--recipe` decides unless their flag is given (unset: None, filled by the run's plan), with what
`--help` says of their default."""

SETTINGS: dict[str, dict[str, Any]] = {
    "model": {"default": "bert-base"}, "recipe": {"default": "auto"}}
TRAINING: dict[str, dict[str, Any]] = {
    "max_time_s": {"type": str, "callback": _duration}, "eval_every": {"default": 500},
    "max_steps": {"default_text": "with neither --max-steps nor --max-time, a run continuing a checkpoint made "
                                  f"elsewhere (--init-from) takes {CONTINUE_PASSES} passes over the data; any other "
                                  "run needs one"},
    "micro_batch_size": {"default_text": "the recipe's (paper 32) where it divides the global batch and neither "
                                         "--gradient-accumulation-steps nor --batch-size is given, else the "
                                         "global batch / (accumulation steps x processes)"}}


def with_recipe(cls: type, overrides: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """`overrides`, and for the fields of `cls` that the recipe decides: no default, the recipe's in --help."""
    names = {f.name for f in dataclasses.fields(cls)}
    decided = {name: {"default": None, "default_text": text}
               for name, text in RECIPE_DEFAULTS.items() if name in names}
    return {name: {**decided.get(name, {}), **overrides.get(name, {})} for name in decided.keys() | overrides.keys()}


# TrainConfig fields that are not pre-training flags: the epoch budget and early stopping are fine-tuning's.
NOT_FLAGS = ("num_epochs", "betas", "shuffle", "max_nonfinite_steps", "best_metric", "greater_is_better",
             "early_stopping_patience")


@click.command()
@settings_options(PretrainSettings, overrides=with_recipe(PretrainSettings, SETTINGS))
@settings_options(TrainConfig, exclude=NOT_FLAGS, overrides=with_recipe(TrainConfig, TRAINING))
def pretrain(**flags) -> None:
    """Pre-train BERT on a `bertkit data pretraining` directory: masked LM, with next sentence prediction where the
    recipe or --nsp says (the short recipe is masked LM only)."""
    from bertkit.workflows import pretrain as pretraining  # torch: only when the command runs, not for --help

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    # a recipe setting left unset stays None: the run's plan fills it (bertkit.workflows.pretrain_plan)
    settings = settings_from_flags(PretrainSettings, flags)
    report_pretraining(pretraining.pretrain(settings, settings_from_flags(TrainConfig, flags)), settings)


def report_pretraining(result: Any, settings: PretrainSettings) -> None:
    """A pre-training's last line: where its model is, or how to continue an interrupted run (exit 130/143)."""
    if result.stop_reason == "signal" and result.signal is not None:
        raise Interrupted(f"pre-training stopped by {signal.Signals(result.signal).name} at step {result.step}; "
                          f"saved {result.checkpoint}", result.signal, "--resume auto")
    if result.checkpoint is not None:
        click.echo(f"done: {result.step} steps ({result.skipped_steps} skipped as non-finite); "
                   f"model in {Path(settings.output) / 'final'}; peak memory: {memory_line(result.peak_memory)}")
