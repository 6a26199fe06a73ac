"""Shared by the kernel tests: the Triton kernels run under Triton's CPU interpreter when there is no GPU.

TRITON_INTERPRET must be set before Triton is imported (Triton builds its own library kernels, tl.sum or
tl.rand, for one mode at import), so it is set here, when pytest imports this file, before any test runs. If
something imported Triton earlier in the process without it, the interpreter cannot run and the tests that
launch kernels skip, saying so (run `pytest tests/kernels` on its own). On a GPU they launch on CUDA tensors.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

from bertkit.kernels import triton_support

CUDA = torch.cuda.is_available()
_TRITON_ALREADY_IMPORTED = "triton" in sys.modules and not triton_support.interpreting()
if not CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

DEVICE = torch.device("cuda" if CUDA else "cpu")
"""Where the Triton launchers run: the GPU, else the CPU under the interpreter."""


def _triton_skip_reason() -> str | None:
    if _TRITON_ALREADY_IMPORTED and not CUDA:
        return "Triton was imported before TRITON_INTERPRET=1 was set; run pytest tests/kernels on its own"
    return triton_support.reason_unavailable(DEVICE)


needs_triton = pytest.mark.skipif(_triton_skip_reason() is not None, reason=str(_triton_skip_reason()))
"""For tests that launch the Triton kernels (compiled on a GPU, interpreted on the CPU)."""


def poisoned(*shape: int, dtype: torch.dtype, device: torch.device = DEVICE) -> torch.Tensor:
    """An output buffer full of NaN, so an element a kernel leaves unwritten fails the comparison."""
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


def tolerance(dtype: torch.dtype) -> dict[str, float]:
    """assert_close tolerances for a result stored in `dtype`: fp32 to ~1e-5; bf16/fp16 to a rounding or two
    (the interpreter truncates fp32 -> bf16 where the GPU rounds to nearest)."""
    if dtype in (torch.bfloat16, torch.float16):
        return {"rtol": 2e-2, "atol": 2e-2}
    return {"rtol": 1e-5, "atol": 1e-5}
