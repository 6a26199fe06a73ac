"""`bertkit doctor`: the machine, what the probe measured on it, and what `--precision auto` and the CPU
kernels choose there, and why.

Design decision: it prints `bertkit.hardware.summary`, the same lines every benchmark starts with, so a
number in docs/performance.md and a user's own machine are described alike; `--json` writes the whole
report, which BERTKIT_PROBE_FILE accepts back (e.g. to share one measurement across identical machines).
"""

from __future__ import annotations

import json

import click


@click.command(context_settings={"show_default": True})
@click.option("--width", type=click.IntRange(min=64), default=768,
              help="Model width (hidden size) to probe at: 768 bert-base, 512 bert-small/medium, 256 bert-mini.")
@click.option("--refresh", is_flag=True,
              help="Measure again (replacing the cached result) instead of reading the cache.")
@click.option("--json", "as_json", is_flag=True, help="Print the whole report as JSON.")
def doctor(width: int, refresh: bool, as_json: bool) -> None:
    """Show this machine, its measured fp32/bf16/int8 rates, and the choices of --precision auto."""
    from bertkit import hardware

    if as_json:
        click.echo(json.dumps(hardware.report(width, refresh), indent=2))
        return
    for line in hardware.summary(width, refresh):
        click.echo(line)
