"""`bertkit data ...`: build training data from text. Flag parsing only; the work is in bertkit.data.

Design decision: the flags are generated (bertkit.cli.options) from `PretrainingDataSettings`, the files and how
the job runs, and the `InstanceSettings` it holds, the settings that change the data (recorded in the manifest;
bertkit.settings, torch-free: `--help` answers at once). The data settings' flag names are the original
create_pretraining_data.py flags in kebab case (`--max-seq-length`, `--masked-lm-prob`,
`--max-predictions-per-seq`, `--dupe-factor`, `--short-seq-prob`, `--whole-word-masking`), with the original's
defaults, except that `--dupe-factor` follows `--masking` unless given (`InstanceSettings.resolved`).
"""

from __future__ import annotations

from typing import Any

import click

from bertkit.cli.options import settings_from_flags, settings_options
from bertkit.settings import PretrainingDataSettings


@click.group(context_settings={"show_default": True})
def data() -> None:
    """Build training data from text."""


@data.command("pretraining")
@settings_options(PretrainingDataSettings)
@click.argument("more_inputs", nargs=-1)
def pretraining(more_inputs: tuple[str, ...], **flags: Any) -> None:
    """Create masked-LM + next-sentence instances from text (Google's rules), or with --no-nsp masked-LM
    instances packed with whole sentences (RoBERTa's), as memory-mapped shards. Files after an --input are inputs
    too (an unquoted `--input corpus/*.txt`, as the shell expands it)."""
    from bertkit.data.pretraining import build_pretraining_data, format_summary

    flags["inputs"] = (*flags["inputs"], *more_inputs)
    settings = settings_from_flags(PretrainingDataSettings, flags)
    manifest = build_pretraining_data(settings)
    click.echo(f"wrote {manifest['num_instances']:,} instances to {settings.output}")
    click.echo(format_summary(manifest))
