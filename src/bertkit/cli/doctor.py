"""`bertkit doctor`: the machine, what the probe measured on it, and what `--precision auto` and the CPU
kernels choose there, and why.

Design decision: it prints `bertkit.runtime.probe.summary`, the same lines every benchmark starts with, so a
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
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="torch CPU threads to measure with (as a run given the same --threads); unset: torch's.")
@click.option("--step", is_flag=True,
              help="Also time the training and inference step (2 layers of a bert-base-shaped encoder at this width, "
                   "4 x 128 tokens) in fp32 and bf16, as --precision auto does where the dense layer favours bf16.")
def doctor(width: int, refresh: bool, as_json: bool, step: bool, threads: int | None) -> None:
    """Show this machine, its measured fp32/bf16/int8 rates, and the choices of --precision auto."""
    from bertkit.runtime import report
    from bertkit.runtime.device import apply_threads

    apply_threads(threads)  # the probe's cache is kept per thread count: another count is measured anew

    steps = step_lines(width, refresh) if step else []
    if as_json:
        click.echo(json.dumps({**report.report(width, refresh), "step_probe": steps}, indent=2))
        return
    for line in [*report.summary(width, refresh), int8_line(), *steps]:
        click.echo(line)
    if not step:
        click.echo("step timings: `bertkit doctor --step` (auto checks bf16 on the step itself where the dense "
                   "layer favours it)")


def int8_line() -> str:
    """How `--precision int8` quantizes here: the kernel, and the activation bits this CPU sums exactly."""
    from bertkit.kernels import int8

    if not int8.works():
        return f"int8: not available ({int8.MISSING})"
    bits = int8.activation_bits()
    why = ("the kernel sums full-range products exactly here" if bits == 8 else
           "without VNNI the kernel's int16 pair sums overflow at 8 bits, measured")
    return (f"int8 (--precision int8): oneDNN's int8 kernel, weights per channel, activations {bits}-bit with one "
            f"scale per token ({why})")


def step_lines(width: int, refresh: bool) -> list[str]:
    """The step probe's verdicts at this width (bertkit.runtime.step_probe), one line per purpose."""
    import torch

    from bertkit.config import preset
    from bertkit.model import BertModel
    from bertkit.runtime import step_probe

    torch.manual_seed(0)
    config = preset("bert-base", vocab_size=1024).replace(
        hidden_size=width, num_attention_heads=max(1, width // 64), intermediate_size=4 * width)
    encoder = BertModel(config, add_pooling_layer=False)
    lines = []
    for purpose in step_probe.PURPOSES:
        timings, source = step_probe.step_timings(encoder, purpose, rows=4, length=128, refresh=refresh)
        lines.append(f"step probe, {purpose}: {timings.reason(config.num_hidden_layers)} [{source}]")
    return lines
