"""GELU(x + bias), BERT's feed-forward activation with the first dense layer's bias folded in, as one op with a
PyTorch reference (CPU, and the specification) and a Triton kernel (CUDA).

Design decision: the bias add is fused so the dense layer runs without its bias (a bare matmul) and the (M, F)
activation is read once and written once each way; the exact erf GELU (approximate='none', BERT's) is computed
in fp32 in registers whatever the storage dtype. Saved for backward: x (not x + bias) and the bias, so nothing
of size (M, F) is stored beyond what the matmul already keeps. dbias is summed per group of rows into an fp32
partial per program, which torch adds up.

Shape legend: M rows (leading dimensions flattened), F features (the intermediate size: 3072 in BERT-Base).

References: Hendrycks & Gimpel 2016 (GELU); Triton's fused-softmax tutorial (one row block per program);
Liger-Kernel's `ops/geglu.py` (a Triton activation with a PyTorch reference).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from bertkit.kernels import triton_support

TRITON_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class LaunchConfig:
    """Columns a program takes and its warps, shared by the launchers and the compile test."""

    block_f: int
    num_warps: int


def launch_config(f: int) -> LaunchConfig:
    """Up to 1024 columns of one row a program (a program per (row, column block)), 4 warps."""
    return LaunchConfig(block_f=min(1024, triton_support.next_power_of_2(f)), num_warps=4)


def backward_groups(rows: int) -> tuple[int, int]:
    """(row groups, rows_per_program) of the backward kernel: about 256 fp32 partials of dbias."""
    return triton_support.row_groups(rows, max_programs=256)


# ---------------------------------------------------------------- the reference (CPU; the specification)


def _compute_dtype(x: Tensor) -> torch.dtype:
    """fp32 for low-precision inputs, fp64 for fp64 (gradcheck)."""
    return torch.promote_types(x.dtype, torch.float32)


def gelu_grad(z: Tensor) -> Tensor:
    """d/dz of z * Phi(z): Phi(z) + z * phi(z), Phi and phi the standard normal's CDF and density."""
    cdf = 0.5 * (1.0 + torch.erf(z * math.sqrt(0.5)))
    return cdf + z * torch.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)


def reference_forward(x: Tensor, bias: Tensor) -> Tensor:
    """GELU(x + bias) in the compute dtype, returned in x.dtype."""
    dtype = _compute_dtype(x)
    return F.gelu(x.to(dtype) + bias.to(dtype)).to(x.dtype)


def reference_backward(dy: Tensor, x: Tensor, bias: Tensor) -> tuple[Tensor, Tensor]:
    """(dx in x.dtype, dbias in bias.dtype): dx = dy * GELU'(x + bias), dbias its sum over rows."""
    dtype = _compute_dtype(x)
    dz = dy.to(dtype) * gelu_grad(x.to(dtype) + bias.to(dtype))
    return dz.to(x.dtype, copy=True), dz.reshape(-1, x.shape[-1]).sum(0).to(bias.dtype)


# ---------------------------------------------------------------- the Triton kernels (CUDA; CPU interpreter)


def _define(jit: Any, tl: Any) -> Any:
    """The kernels, built by `triton_support.define_kernels` at first use."""

    @jit
    def gelu_fp32(z):
        return 0.5 * z * (1.0 + tl.math.erf(z * 0.7071067811865476))  # sqrt(1/2)

    @jit
    def gelu_grad_fp32(z):
        return 0.5 * (1.0 + tl.math.erf(z * 0.7071067811865476)) + z * tl.exp(-0.5 * z * z) * 0.3989422804014327

    @jit
    def bertkit_bias_gelu_forward(X, B, Y, F, BLOCK_F: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
        inside = cols < F
        offsets = row.to(tl.int64) * F + cols
        z = tl.load(X + offsets, mask=inside, other=0.0).to(tl.float32)
        z += tl.load(B + cols, mask=inside, other=0.0).to(tl.float32)
        tl.store(Y + offsets, gelu_fp32(z).to(Y.dtype.element_ty), mask=inside)

    @jit
    def bertkit_bias_gelu_backward(DY, X, B, DX, DB, M, F, BLOCK_F: tl.constexpr, ROWS_PER_PROGRAM: tl.constexpr):
        group = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK_F + tl.arange(0, BLOCK_F)
        inside = cols < F
        b = tl.load(B + cols, mask=inside, other=0.0).to(tl.float32)
        db = tl.zeros((BLOCK_F,), dtype=tl.float32)
        for i in range(ROWS_PER_PROGRAM):
            row = group * ROWS_PER_PROGRAM + i
            live = inside & (row < M)  # the last group may be short: its missing rows add zeros
            offsets = row.to(tl.int64) * F + cols
            z = tl.load(X + offsets, mask=live, other=0.0).to(tl.float32) + b
            dz = tl.load(DY + offsets, mask=live, other=0.0).to(tl.float32) * gelu_grad_fp32(z)
            tl.store(DX + offsets, dz.to(DX.dtype.element_ty), mask=live)
            db += dz  # fp32, before dx is rounded to its dtype
        tl.store(DB + group.to(tl.int64) * F + cols, db, mask=inside)  # (groups, F) partials; torch adds them

    return SimpleNamespace(forward=bertkit_bias_gelu_forward, backward=bertkit_bias_gelu_backward)


@functools.cache
def kernels() -> Any:
    """The jit kernels (forward, backward), interpreted (TRITON_INTERPRET=1) or compiled, defined at first use."""
    return triton_support.define_kernels(_define)


def launch_forward(x: Tensor, bias: Tensor, y: Tensor) -> None:
    """The Triton forward on contiguous (M, F) x and y, (F,) bias, written in place into y."""
    rows, f = x.shape
    if rows == 0:
        return
    config = launch_config(f)
    with triton_support.device_guard(x.device):
        kernels().forward[(rows, triton_support.cdiv(f, config.block_f))](
            x, bias, y, f, BLOCK_F=config.block_f, num_warps=config.num_warps)


def launch_backward(dy: Tensor, x: Tensor, bias: Tensor, dx: Tensor, dbias: Tensor) -> None:
    """The Triton backward on contiguous (M, F) dy, x, dx and (F,) bias, dbias, written in place."""
    rows, f = x.shape
    if rows == 0:
        dbias.zero_()
        return
    config = launch_config(f)
    groups, rows_per_program = backward_groups(rows)
    partial = torch.empty((groups, f), dtype=torch.float32, device=x.device)
    with triton_support.device_guard(x.device):
        kernels().backward[(groups, triton_support.cdiv(f, config.block_f))](
            dy, x, bias, dx, partial, rows, f, BLOCK_F=config.block_f, ROWS_PER_PROGRAM=rows_per_program,
            num_warps=config.num_warps)
    dbias.copy_(partial.sum(0))


# ---------------------------------------------------------------- the ops


def _uses_triton(*tensors: Tensor) -> bool:
    """The CUDA kernel runs Triton where it can: Triton present, a recent GPU, fp32/fp16/bf16."""
    return triton_support.available(tensors[0].device) and all(t.dtype in TRITON_DTYPES for t in tensors)


@torch.library.custom_op("bertkit::bias_gelu_fwd", mutates_args=())
def _forward_op(x: Tensor, bias: Tensor) -> Tensor:
    return reference_forward(x, bias)


@_forward_op.register_kernel("cuda")
def _forward_cuda(x: Tensor, bias: Tensor) -> Tensor:
    if not _uses_triton(x, bias):
        return reference_forward(x, bias)
    x2 = x.reshape(-1, x.shape[-1]).contiguous()  # (M, F)
    y = torch.empty_like(x2)
    launch_forward(x2, bias.contiguous(), y)
    return y.view(x.shape)


@_forward_op.register_fake
def _forward_fake(x: Tensor, bias: Tensor) -> Tensor:
    return torch.empty_like(x)


@torch.library.custom_op("bertkit::bias_gelu_bwd", mutates_args=())
def _backward_op(dy: Tensor, x: Tensor, bias: Tensor) -> tuple[Tensor, Tensor]:
    return reference_backward(dy, x, bias)


@_backward_op.register_kernel("cuda")
def _backward_cuda(dy: Tensor, x: Tensor, bias: Tensor) -> tuple[Tensor, Tensor]:
    if not _uses_triton(dy, x, bias):
        return reference_backward(dy, x, bias)
    f = x.shape[-1]
    x2 = x.reshape(-1, f).contiguous()  # (M, F)
    dx, dbias = torch.empty_like(x2), torch.empty_like(bias)
    launch_backward(dy.reshape(-1, f).contiguous(), x2, bias.contiguous(), dx, dbias)
    return dx.view(x.shape), dbias


@_backward_op.register_fake
def _backward_fake(dy: Tensor, x: Tensor, bias: Tensor) -> tuple[Tensor, Tensor]:
    return torch.empty_like(x), torch.empty_like(bias)


def _setup_context(ctx: Any, inputs: tuple[Tensor, Tensor], output: Tensor) -> None:
    ctx.save_for_backward(*inputs)  # x and bias, not x + bias


def _backward(ctx: Any, dy: Tensor) -> tuple[Tensor, Tensor]:
    x, bias = ctx.saved_tensors
    return _backward_op(dy, x, bias)


_forward_op.register_autograd(_backward, setup_context=_setup_context)


def bias_gelu(x: Tensor, bias: Tensor) -> Tensor:
    """Exact (erf) GELU(x + bias): x (..., F) bf16/fp16/fp32, bias (F,) fp32; output in x.dtype, computed in
    fp32. Gradients: dx in x.dtype, dbias in bias.dtype."""
    if bias.shape != (x.shape[-1],):
        raise ValueError(f"bias must be ({x.shape[-1]},), got {tuple(bias.shape)}")
    return _forward_op(x, bias)
