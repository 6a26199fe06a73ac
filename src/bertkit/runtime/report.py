"""What `bertkit doctor` and every benchmark print about the machine: its CPU, the probe's measured rates and
the choices `--precision auto` and the CPU kernels make there, with their reasons.

Design decision: one description for the user's machine and for every number in docs/performance.md, so the
two compare line by line; `report()` is also what `bertkit doctor --json` writes, which BERTKIT_PROBE_FILE
accepts back.
"""

from __future__ import annotations

import dataclasses

import torch

from bertkit.runtime.attention_probe import DROPOUT_P
from bertkit.runtime.probe import (
    DEFAULT_WIDTH,
    FLOAT_PRECISIONS,
    PROBE_TOKENS,
    Measurements,
    auto_precision,
    decide,
    machine,
    matmul_gflops,
    measurements,
)


def report(width: int = DEFAULT_WIDTH, refresh: bool = False) -> dict:
    """Everything `bertkit doctor --json` prints; its "measurements" make a BERTKIT_PROBE_FILE."""
    measured, source = measurements(width, refresh)
    chosen = decide(measured)
    cuda = None
    if torch.cuda.is_available():
        cuda = {"device": torch.cuda.get_device_name(), "bf16": torch.cuda.is_bf16_supported(),
                "auto": auto_precision(torch.device("cuda"))}
    return {"machine": dataclasses.asdict(machine()), "cuda": cuda, "source": source,
            "measurements": measured.to_json(),
            "choices": {"training": chosen.train_precision, "inference": chosen.inference_precision,
                        "packed_linear": list(chosen.packed_linear),
                        "bmm_attention": {p: list(n) for p, n in chosen.bmm_attention.items()},
                        "bmm_attention_training": {p: list(n) for p, n in chosen.bmm_training.items()},
                        "bmm_attention_training_dropout": {p: list(n) for p, n in chosen.bmm_training_dropout.items()},
                        "counter_dropout": list(chosen.counter_dropout),
                        "reasons": list(chosen.reasons)}}


def summary(width: int = DEFAULT_WIDTH, refresh: bool = False) -> list[str]:
    """The report as lines of text: the machine, the measured rates, and the choices with their reasons."""
    data = report(width, refresh)
    measured = Measurements.from_json(data["measurements"])
    cuda = data["cuda"]
    lines = [f"machine: {machine().line()}", f"matrix extensions: {matrix_extensions(machine().flags)}",
             "cuda: " + (f"{cuda['device']}, bf16 {'supported' if cuda['bf16'] else 'not supported'}, "
                         f"auto runs {cuda['auto']}" if cuda else "none"),
             f"probe at width {measured.width} ({PROBE_TOKENS} tokens, one thread): {data['source']}, "
             f"took {measured.seconds:.2f} s",
             "GFLOP/s of a dense layer on one thread: training fp32 {:.0f}, bf16 {:.0f}; inference fp32 {:.0f}, "
             "bf16 {:.0f}, int8 {:.0f}".format(measured.train["fp32"], measured.train["bf16"],
                                               *(matmul_gflops(p, width, "inference", threads=1)
                                                 for p in ("fp32", "bf16", "int8")))]
    for p in FLOAT_PRECISIONS:
        cells = ", ".join(f"{n}: {sdpa:.0f}/{bmm:.0f}" for n, sdpa, bmm in measured.attention[p])
        lines.append(f"attention in {p}, us SDPA/bmm by length: {cells}")
        for timings, what in ((measured.attention_training, ""),
                              (measured.attention_training_dropout, f", dropout {DROPOUT_P}")):
            if timings.get(p):
                cells = ", ".join(f"{n}: {sdpa:.0f}/{bmm:.0f}" for n, sdpa, bmm in timings[p])
                lines.append(f"attention for training in {p} (forward + backward{what}), us SDPA/bmm by length: "
                             f"{cells}")
        if p in measured.dropout:
            theirs, ours = measured.dropout[p]
            lines.append(f"dropout in {p} (forward + backward), us torch's/counter-based: {theirs:.0f}/{ours:.0f}")
    return lines + [f"auto {reason}" for reason in data["choices"]["reasons"]]


def matrix_extensions(flags: tuple[str, ...]) -> str:
    """What the CPU's flags say about bf16/int8 matrix instructions, in words (the choices themselves are
    measured, never read from these)."""
    amx = [f for f in ("amx_tile", "amx_bf16", "amx_int8") if f in flags]
    if amx:
        return f"Intel AMX ({' '.join(amx)}): bf16 and int8 matrix tiles"
    vector = [f for f in ("avx512_bf16", "avx512_vnni", "avx_vnni", "bf16", "i8mm") if f in flags]
    if vector:
        return f"no AMX; bf16/int8 vector instructions: {' '.join(vector)}"
    return "no AMX and no bf16/int8 vector instructions (bf16 is emulated: expect it slower than fp32)"


def header(width: int = DEFAULT_WIDTH) -> str:
    """`summary` as '# ' comment lines, what every benchmark prints first."""
    return "\n".join(f"# {line}" for line in summary(width))
