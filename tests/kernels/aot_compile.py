"""Every Triton kernel of bertkit.kernels, compiled ahead of time for the H100/H200 (sm_90) at the sizes BERT
uses, in bf16 and fp32. `SPECS` is the list; run as a script (`python tests/kernels/aot_compile.py`), this
compiles them all and prints one JSON object: name -> registers, local (spill) bytes, stack and shared bytes,
warps, or the compile error. test_aot.py runs it in a process of its own because a process that runs the
interpreter (TRITON_INTERPRET=1) cannot compile: Triton built its library kernels for the interpreter.

The constexprs and warps come from each module's `launch_config` (and `backward_groups`), the functions its
launchers call, so what compiles here is what launches there.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

from bertkit.kernels import cross_entropy, gelu, norm, triton_support

BERT_ROWS = 256 * 128
"""Tokens in a BERT-Base pre-training batch (256 sequences of 128): sets the backward's rows per program."""
VOCAB = 30522


@dataclass(frozen=True)
class Spec:
    module: Any
    kernel: str
    signature: dict[str, str]
    constexprs: dict[str, Any]
    num_warps: int
    divisible_ints: tuple[str, ...] = field(default=())
    """Integer arguments a launch at these sizes specializes as divisible by 16 (768, 3072, ...)."""


def _norm_specs() -> dict[str, Spec]:
    specs = {}
    _, rows_per_program = norm.backward_groups(BERT_ROWS)
    for x, residual, out, d in [("bf16", "bf16", "bf16", 768), ("bf16", "fp32", "fp32", 1024),
                                ("fp32", "fp32", "fp32", 1024), ("bf16", "bf16", "bf16", 4096)]:
        config = norm.launch_config(d)
        forward = {"X": f"*{x}", "R": f"*{residual}", "W": "*fp32", "B": "*fp32", "Y": f"*{out}", "H": f"*{out}",
                   "Mean": "*fp32", "Rstd": "*fp32", "Seed": "*i64", "D": "i32", "p": "fp32", "eps": "fp32",
                   "HAS_RESIDUAL": "constexpr", "HAS_DROPOUT": "constexpr", "BLOCK_D": "constexpr"}
        backward = {"DY": f"*{out}", "H": f"*{out}", "W": "*fp32", "Mean": "*fp32", "Rstd": "*fp32", "Seed": "*i64",
                    "DX": f"*{x}", "DR": f"*{residual}", "DW": "*fp32", "DB": "*fp32", "M": "i32", "D": "i32",
                    "p": "fp32", "HAS_DRESIDUAL": "constexpr", "HAS_DROPOUT": "constexpr", "BLOCK_D": "constexpr",
                    "ROWS_PER_PROGRAM": "constexpr"}
        name = f"x={x} residual={residual} out={out} D={d}"
        specs[f"norm.forward {name}"] = Spec(
            norm, "forward", forward, {"HAS_RESIDUAL": True, "HAS_DROPOUT": True, "BLOCK_D": config.block_d},
            config.num_warps, ("D",))
        specs[f"norm.backward {name}"] = Spec(
            norm, "backward", backward, {"HAS_DRESIDUAL": True, "HAS_DROPOUT": True, "BLOCK_D": config.block_d,
                                         "ROWS_PER_PROGRAM": rows_per_program}, config.num_warps, ("D",))
    specs["norm.keep_mask"] = Spec(norm, "keep_mask", {"Seed": "*i64", "Out": "*i8", "N": "i32", "p": "fp32",
                                                       "BLOCK": "constexpr"}, {"BLOCK": norm.MASK_BLOCK}, 4)
    return specs


def _gelu_specs() -> dict[str, Spec]:
    specs = {}
    _, rows_per_program = gelu.backward_groups(BERT_ROWS)
    for dtype, f in [("bf16", 3072), ("fp32", 4096)]:
        config = gelu.launch_config(f)
        specs[f"gelu.forward {dtype} F={f}"] = Spec(
            gelu, "forward", {"X": f"*{dtype}", "B": "*fp32", "Y": f"*{dtype}", "F": "i32", "BLOCK_F": "constexpr"},
            {"BLOCK_F": config.block_f}, config.num_warps, ("F",))
        specs[f"gelu.backward {dtype} F={f}"] = Spec(
            gelu, "backward", {"DY": f"*{dtype}", "X": f"*{dtype}", "B": "*fp32", "DX": f"*{dtype}", "DB": "*fp32",
                               "M": "i32", "F": "i32", "BLOCK_F": "constexpr", "ROWS_PER_PROGRAM": "constexpr"},
            {"BLOCK_F": config.block_f, "ROWS_PER_PROGRAM": rows_per_program}, config.num_warps, ("F",))
    return specs


def _cross_entropy_specs() -> dict[str, Spec]:
    specs = {}
    config = cross_entropy.launch_config(VOCAB)
    constexprs = {"V": VOCAB, "BLOCK_V": config.block_v}
    for dtype in ("bf16", "fp32"):
        specs[f"cross_entropy.forward {dtype} V={VOCAB}"] = Spec(
            cross_entropy, "forward", {"Logits": f"*{dtype}", "Targets": "*i64", "Weights": "*fp32", "Loss": "*fp32",
                                       "Correct": "*fp32", "Lse": "*fp32", "V": "constexpr", "BLOCK_V": "constexpr"},
            constexprs, config.num_warps)
        specs[f"cross_entropy.backward {dtype} V={VOCAB}"] = Spec(
            cross_entropy, "backward", {"DLoss": "*fp32", "Logits": f"*{dtype}", "Targets": "*i64", "Weights": "*fp32",
                                        "Lse": "*fp32", "DLogits": f"*{dtype}", "V": "constexpr",
                                        "BLOCK_V": "constexpr"},
            constexprs, config.num_warps)
    return specs


SPECS: dict[str, Spec] = {**_norm_specs(), **_gelu_specs(), **_cross_entropy_specs()}


def compile_spec(spec: Spec) -> dict[str, Any]:
    """Compile one kernel for sm_90: its resources, or the error."""
    start = time.perf_counter()
    try:
        kernel = getattr(spec.module.kernels(), spec.kernel)
        pointers = [name for name, kind in spec.signature.items() if kind.startswith("*")]
        info = triton_support.compile_for_gpu(kernel, spec.signature, spec.constexprs, num_warps=spec.num_warps,
                                              divisible_by_16=[*pointers, *spec.divisible_ints])
    except Exception:  # noqa: BLE001 -- reported per kernel, so one failure does not hide the others
        return {"error": traceback.format_exc(limit=-3)}
    return {"registers": info.registers, "local_bytes": info.local_bytes, "stack_bytes": info.stack_bytes,
            "shared_bytes": info.shared_bytes, "num_warps": info.num_warps,
            "seconds": round(time.perf_counter() - start, 2)}


if __name__ == "__main__":
    json.dump({name: compile_spec(spec) for name, spec in SPECS.items()}, sys.stdout)
