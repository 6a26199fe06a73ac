"""`bertkit data ...`: build training data from text. Flag parsing only; the work is in bertkit.data.

Design decision: the flags are generated (bertkit.cli.options) from `InstanceSettings`, the
settings that change the data (recorded in the manifest), and `PretrainingDataSettings`, the files and how the
job runs (bertkit.settings, torch-free: `--help` answers at once). The data settings' flag names are the
original create_pretraining_data.py flags in kebab case (`--max-seq-length`, `--masked-lm-prob`,
`--max-predictions-per-seq`, `--dupe-factor`, `--short-seq-prob`, `--whole-word-masking`), with the
original's defaults, except that `--dupe-factor` follows `--masking` unless given (dynamic masking draws
new masks every epoch, so one pass suffices).
"""

from __future__ import annotations

from typing import Any

import click

from bertkit.cli.options import settings_from_flags, settings_options
from bertkit.settings import InstanceSettings, PretrainingDataSettings

DUPE_FACTORS = {"static": 10, "dynamic": 1}
"""--dupe-factor by --masking when the flag is not given."""


@click.group(context_settings={"show_default": True})
def data() -> None:
    """Build training data from text."""


@data.command("pretraining")
@settings_options(PretrainingDataSettings)
@settings_options(InstanceSettings, overrides={"dupe_factor": {
    "default": None, "default_text": ", ".join(f"{n} with {m} masking" for m, n in DUPE_FACTORS.items())}})
def pretraining(**flags: Any) -> None:
    """Create masked-LM + next-sentence instances from text (Google's rules), or with --no-nsp masked-LM
    instances packed with whole sentences (RoBERTa's), as memory-mapped shards."""
    from bertkit.data.pretraining import build_pretraining_data, format_summary
    from bertkit.data.shards import ids_dtype
    from bertkit.tokenizer import WordPieceTokenizer

    if flags["dupe_factor"] is None:
        flags["dupe_factor"] = DUPE_FACTORS[flags["masking"]]
    settings = settings_from_flags(InstanceSettings, flags)
    job = settings_from_flags(PretrainingDataSettings, flags)
    tok = WordPieceTokenizer.from_pretrained(job.tokenizer)
    max_shard_tokens = max(1, int(job.shard_size_mb * 2**20) // ids_dtype(tok.vocab_size).itemsize)
    manifest = build_pretraining_data(list(job.inputs), tok, job.output, settings, workers=job.workers,
                                      strict=job.strict, overwrite=job.overwrite, progress=not job.quiet,
                                      max_shard_tokens=max_shard_tokens, text_column=job.text_column)
    click.echo(f"wrote {manifest['num_instances']:,} instances to {job.output}")
    click.echo(format_summary(manifest))
