"""LayerNorm(residual + dropout(x)) in one pass over memory: BERT's "add & norm" after attention and after the
feed-forward, as one op with a PyTorch reference (CPU, and the specification) and a Triton kernel (CUDA).

Design decision: the dropout mask is never stored. The forward draws one int64 seed on x's device (a device
tensor, never read on the host on CUDA, so no sync), each element's keep decision is a function of (seed, flat
element index) only -- Philox `tl.rand` in the kernel, a seeded CPU generator in the reference -- and the
backward regenerates the mask from the saved seed. So torch.utils.checkpoint, which restores the RNG state
before recomputing, replays the same mask. The two paths draw different masks (different generators); each
keeps an element with probability 1 - p, and each path's backward matches its own forward.

Statistics (mean, rstd) are fp32 whatever the input dtypes (fp64 stays fp64, for gradcheck); x and residual
may differ in dtype (bf16 x, fp32 residual). Saved for backward: h = residual + dropout(x) in the output dtype,
mean, rstd, the seed. The weight and bias gradients are summed per group of rows into an fp32 partial per
program, which torch adds up (no atomics, deterministic).

Shape legend: M rows (every leading dimension flattened), D normalized size (16..4096; BERT 128..1024).

References: Ba et al. 2016 (LayerNorm); Triton's layer-norm and low-memory-dropout tutorials;
flash-attention's `flash_attn/ops/triton/layer_norm.py` (`layer_norm_fn`: residual + dropout + LayerNorm).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch
from torch import Tensor

from bertkit.kernels import triton_support

MAX_D = 4096
"""The widest row the Triton kernel takes (one row a program, in registers); wider rows use the reference."""
TRITON_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
SEED_HIGH = 2**31 - 1


@dataclass(frozen=True)
class LaunchConfig:
    """Block size and warps for one row of D elements, shared by the launchers and the compile test."""

    block_d: int
    num_warps: int


def launch_config(d: int) -> LaunchConfig:
    """One row per program in a power-of-two block; a warp per 256 elements, 1..8 (as flash-attention's)."""
    block = triton_support.next_power_of_2(d)
    return LaunchConfig(block_d=block, num_warps=min(max(block // 256, 1), 8))


def backward_groups(rows: int) -> tuple[int, int]:
    """(programs, rows_per_program) of the backward kernel: up to 1024 fp32 partials of dweight/dbias."""
    return triton_support.row_groups(rows, max_programs=1024)


MASK_BLOCK = 1024
"""Elements a program of the keep-mask kernel writes."""


# ---------------------------------------------------------------- the reference (CPU; the specification)


def reference_keep_mask(seed: Tensor, numel: int, p: float) -> Tensor:
    """(numel,) bool: element i is kept iff uniform_i >= p, uniform_i the i-th draw of a CPU generator
    seeded with `seed` (read on the host: the reference path is not the fast one)."""
    generator = torch.Generator().manual_seed(int(seed.reshape(-1)[0]))
    return torch.rand(numel, generator=generator) >= p


def _compute_dtype(*tensors: Tensor | None) -> torch.dtype:
    """fp32 for low-precision inputs, fp64 when any input is fp64 (gradcheck)."""
    dtype = torch.float32
    for tensor in tensors:
        if tensor is not None:
            dtype = torch.promote_types(dtype, tensor.dtype)
    return dtype


def _dropout_scale(seed: Tensor, p: float, shape: torch.Size, dtype: torch.dtype, device: torch.device) -> Tensor:
    """keep / (1 - p) over `shape` (inverted dropout), from the reference mask."""
    keep = reference_keep_mask(seed, shape.numel(), p).reshape(shape).to(device)
    return keep.to(dtype) / (1.0 - p)


def reference_forward(x: Tensor, residual: Tensor | None, weight: Tensor, bias: Tensor, seed: Tensor, p: float,
                      eps: float, out_dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(y, h, mean, rstd): h = residual + dropout_p(x), y = LayerNorm(h) over the last dimension; y and h in
    out_dtype, mean and rstd (x.shape[:-1]) in the compute dtype."""
    dtype = _compute_dtype(x, residual, weight)
    h = x.to(dtype)
    if p > 0:
        h = h * _dropout_scale(seed, p, x.shape, dtype, x.device)
    if residual is not None:
        h = h + residual.to(dtype)
    mean = h.mean(-1)
    rstd = torch.rsqrt((h - mean[..., None]).square().mean(-1) + eps)
    y = (h - mean[..., None]) * rstd[..., None] * weight.to(dtype) + bias.to(dtype)
    return y.to(out_dtype), h.to(out_dtype, copy=True), mean, rstd  # copy: an op's outputs never alias inputs


def reference_backward(dy: Tensor, h: Tensor, mean: Tensor, rstd: Tensor, weight: Tensor, seed: Tensor, p: float,
                       x_dtype: torch.dtype, residual_dtype: torch.dtype | None
                       ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(dx, dresidual, dweight, dbias) of `reference_forward`; dresidual is empty when there was no residual."""
    dtype = _compute_dtype(dy, h, weight, mean)
    xhat = (h.to(dtype) - mean[..., None]) * rstd[..., None]
    wdy = dy.to(dtype) * weight.to(dtype)
    dh = (wdy - xhat * (wdy * xhat).mean(-1, keepdim=True) - wdy.mean(-1, keepdim=True)) * rstd[..., None]
    rows = dy.to(dtype).reshape(-1, dy.shape[-1])
    dweight = (rows * xhat.reshape(rows.shape)).sum(0).to(weight.dtype)
    dbias = rows.sum(0).to(weight.dtype)
    dx = dh * _dropout_scale(seed, p, dh.shape, dtype, dh.device) if p > 0 else dh
    dresidual = dh.to(residual_dtype, copy=True) if residual_dtype is not None else dh.new_empty(0)
    return dx.to(x_dtype, copy=True), dresidual, dweight, dbias


# ---------------------------------------------------------------- the Triton kernels (CUDA; CPU interpreter)


def _define(jit: Any, tl: Any) -> Any:
    """The kernels, built by `triton_support.define_kernels` at first use."""

    @jit
    def keep(seed, offsets, p):
        # The one place the keep decision is made: the LayerNorm kernels and the mask kernel share it.
        return tl.rand(seed, offsets) >= p

    @jit
    def bertkit_layer_norm_forward(X, R, W, B, Y, H, Mean, Rstd, Seed, D, p, eps,
                HAS_RESIDUAL: tl.constexpr, HAS_DROPOUT: tl.constexpr, BLOCK_D: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK_D)
        inside = cols < D
        offsets = row.to(tl.int64) * D + cols  # flat element index: also the dropout counter
        h = tl.load(X + offsets, mask=inside, other=0.0).to(tl.float32)
        if HAS_DROPOUT:
            h = tl.where(keep(tl.load(Seed), offsets, p), h / (1.0 - p), 0.0)
        if HAS_RESIDUAL:
            h += tl.load(R + offsets, mask=inside, other=0.0).to(tl.float32)
        mean = tl.sum(h, axis=0) / D
        centered = tl.where(inside, h - mean, 0.0)
        rstd = 1.0 / tl.sqrt(tl.sum(centered * centered, axis=0) / D + eps)
        w = tl.load(W + cols, mask=inside, other=0.0).to(tl.float32)
        b = tl.load(B + cols, mask=inside, other=0.0).to(tl.float32)
        tl.store(Y + offsets, (centered * rstd * w + b).to(Y.dtype.element_ty), mask=inside)
        tl.store(H + offsets, h.to(H.dtype.element_ty), mask=inside)
        tl.store(Mean + row, mean)
        tl.store(Rstd + row, rstd)

    @jit
    def bertkit_layer_norm_backward(DY, H, W, Mean, Rstd, Seed, DX, DR, DW, DB, M, D, p, HAS_DRESIDUAL: tl.constexpr,
                 HAS_DROPOUT: tl.constexpr, BLOCK_D: tl.constexpr, ROWS_PER_PROGRAM: tl.constexpr):
        group = tl.program_id(0)
        cols = tl.arange(0, BLOCK_D)
        inside = cols < D
        w = tl.load(W + cols, mask=inside, other=0.0).to(tl.float32)
        dw = tl.zeros((BLOCK_D,), dtype=tl.float32)
        db = tl.zeros((BLOCK_D,), dtype=tl.float32)
        seed = tl.load(Seed)
        for i in range(ROWS_PER_PROGRAM):
            row = group * ROWS_PER_PROGRAM + i
            live = inside & (row < M)  # the last group may be short: its missing rows add zeros
            offsets = row.to(tl.int64) * D + cols
            dy = tl.load(DY + offsets, mask=live, other=0.0).to(tl.float32)
            h = tl.load(H + offsets, mask=live, other=0.0).to(tl.float32)
            rstd = tl.load(Rstd + row, mask=row < M, other=0.0)
            xhat = tl.where(live, (h - tl.load(Mean + row, mask=row < M, other=0.0)) * rstd, 0.0)
            wdy = w * dy
            c1 = tl.sum(xhat * wdy, axis=0) / D
            c2 = tl.sum(wdy, axis=0) / D
            dh = (wdy - (xhat * c1 + c2)) * rstd
            dw += dy * xhat
            db += dy
            if HAS_DRESIDUAL:
                tl.store(DR + offsets, dh.to(DR.dtype.element_ty), mask=live)
            if HAS_DROPOUT:
                dh = tl.where(keep(seed, offsets, p), dh / (1.0 - p), 0.0)
            tl.store(DX + offsets, dh.to(DX.dtype.element_ty), mask=live)
        # (programs, D) fp32 partials; torch adds them up
        tl.store(DW + group.to(tl.int64) * D + cols, dw, mask=inside)
        tl.store(DB + group.to(tl.int64) * D + cols, db, mask=inside)

    @jit
    def bertkit_dropout_keep_mask(Seed, Out, N, p, BLOCK: tl.constexpr):
        offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        inside = offsets < N
        tl.store(Out + offsets, keep(tl.load(Seed), offsets, p).to(tl.int8), mask=inside)

    return SimpleNamespace(forward=bertkit_layer_norm_forward, backward=bertkit_layer_norm_backward,
                           keep_mask=bertkit_dropout_keep_mask)


@functools.cache
def kernels() -> Any:
    """The jit kernels (forward, backward, keep_mask), interpreted (TRITON_INTERPRET=1) or compiled, defined
    at first use."""
    return triton_support.define_kernels(_define)


def launch_forward(x: Tensor, residual: Tensor | None, weight: Tensor, bias: Tensor, seed: Tensor, p: float,
                   eps: float, y: Tensor, h: Tensor, mean: Tensor, rstd: Tensor) -> None:
    """The Triton forward on contiguous (M, D) x/residual/y/h and (M,) fp32 mean/rstd, written in place."""
    rows, d = x.shape
    if rows == 0:
        return
    config = launch_config(d)
    with triton_support.device_guard(x.device):
        kernels().forward[(rows,)](
            x, residual if residual is not None else x, weight, bias, y, h, mean, rstd, seed, d, p, eps,
            HAS_RESIDUAL=residual is not None, HAS_DROPOUT=p > 0, BLOCK_D=config.block_d,
            num_warps=config.num_warps)


def launch_backward(dy: Tensor, h: Tensor, mean: Tensor, rstd: Tensor, weight: Tensor, seed: Tensor, p: float,
                    dx: Tensor, dresidual: Tensor | None, dweight: Tensor, dbias: Tensor) -> None:
    """The Triton backward on contiguous (M, D) tensors, written in place into dx, dresidual (None: no
    residual), dweight and dbias (D,)."""
    rows, d = dy.shape
    if rows == 0:
        dweight.zero_()
        dbias.zero_()
        return
    config = launch_config(d)
    programs, rows_per_program = backward_groups(rows)
    partial = torch.empty((2, programs, d), dtype=torch.float32, device=dy.device)  # dweight, dbias partials
    with triton_support.device_guard(dy.device):
        kernels().backward[(programs,)](
            dy, h, weight, mean, rstd, seed, dx, dresidual if dresidual is not None else dx, partial[0],
            partial[1], rows, d, p, HAS_DRESIDUAL=dresidual is not None, HAS_DROPOUT=p > 0,
            BLOCK_D=config.block_d, ROWS_PER_PROGRAM=rows_per_program, num_warps=config.num_warps)
    sums = partial.sum(1)  # one reduction for both
    dweight.copy_(sums[0])
    dbias.copy_(sums[1])


def dropout_keep_mask(seed: Tensor, numel: int, p: float) -> Tensor:
    """(numel,) bool on seed's device: the keep mask the Triton kernels draw for flat indices 0..numel-1 (tests
    build the expected LayerNorm from it)."""
    out = torch.empty(numel, dtype=torch.int8, device=seed.device)
    if numel:
        with triton_support.device_guard(seed.device):
            kernels().keep_mask[(triton_support.cdiv(numel, MASK_BLOCK),)](seed, out, numel, p, BLOCK=MASK_BLOCK)
    return out != 0


# ---------------------------------------------------------------- the ops


def _uses_triton(*tensors: Tensor | None) -> bool:
    """The CUDA kernel runs Triton where it can: Triton present, a recent GPU, fp32/fp16/bf16, D <= MAX_D."""
    present = [t for t in tensors if t is not None]
    return (triton_support.available(present[0].device) and present[0].shape[-1] <= MAX_D
            and all(t.dtype in TRITON_DTYPES for t in present))


@torch.library.custom_op("bertkit::dropout_add_layer_norm_fwd", mutates_args=())
def _forward_op(x: Tensor, residual: Tensor | None, weight: Tensor, bias: Tensor, seed: Tensor, p: float, eps: float,
                out_dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    return reference_forward(x, residual, weight, bias, seed, p, eps, out_dtype)


@_forward_op.register_kernel("cuda")
def _forward_cuda(x: Tensor, residual: Tensor | None, weight: Tensor, bias: Tensor, seed: Tensor, p: float,
                  eps: float, out_dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    if not _uses_triton(x, residual, weight, bias):
        return reference_forward(x, residual, weight, bias, seed, p, eps, out_dtype)
    d = x.shape[-1]
    x2 = x.reshape(-1, d).contiguous()  # (M, D)
    r2 = residual.reshape(-1, d).contiguous() if residual is not None else None
    y, h = torch.empty_like(x2, dtype=out_dtype), torch.empty_like(x2, dtype=out_dtype)
    mean = torch.empty(x2.shape[0], dtype=torch.float32, device=x.device)
    rstd = torch.empty_like(mean)
    launch_forward(x2, r2, weight.contiguous(), bias.contiguous(), seed, p, eps, y, h, mean, rstd)
    return y.view(x.shape), h.view(x.shape), mean.view(x.shape[:-1]), rstd.view(x.shape[:-1])


@_forward_op.register_fake
def _forward_fake(x: Tensor, residual: Tensor | None, weight: Tensor, bias: Tensor, seed: Tensor, p: float,
                  eps: float, out_dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    stats = _compute_dtype(x, residual, weight)
    return (x.new_empty(x.shape, dtype=out_dtype), x.new_empty(x.shape, dtype=out_dtype),
            x.new_empty(x.shape[:-1], dtype=stats), x.new_empty(x.shape[:-1], dtype=stats))


@torch.library.custom_op("bertkit::dropout_add_layer_norm_bwd", mutates_args=())
def _backward_op(dy: Tensor, h: Tensor, mean: Tensor, rstd: Tensor, weight: Tensor, seed: Tensor, p: float,
                 x_dtype: torch.dtype, residual_dtype: torch.dtype | None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    return reference_backward(dy, h, mean, rstd, weight, seed, p, x_dtype, residual_dtype)


@_backward_op.register_kernel("cuda")
def _backward_cuda(dy: Tensor, h: Tensor, mean: Tensor, rstd: Tensor, weight: Tensor, seed: Tensor, p: float,
                   x_dtype: torch.dtype, residual_dtype: torch.dtype | None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    if not (_uses_triton(dy, h, weight) and mean.dtype == torch.float32
            and x_dtype in TRITON_DTYPES and residual_dtype in (None, *TRITON_DTYPES)):
        return reference_backward(dy, h, mean, rstd, weight, seed, p, x_dtype, residual_dtype)
    d = dy.shape[-1]
    dy2 = dy.reshape(-1, d).contiguous()  # (M, D)
    dx = torch.empty_like(dy2, dtype=x_dtype)
    dresidual = torch.empty_like(dy2, dtype=residual_dtype) if residual_dtype is not None else None
    dweight, dbias = torch.empty_like(weight), torch.empty_like(weight)
    launch_backward(dy2, h.reshape(-1, d).contiguous(), mean.reshape(-1).contiguous(), rstd.reshape(-1).contiguous(),
                    weight.contiguous(), seed, p, dx, dresidual, dweight, dbias)
    return (dx.view(dy.shape), dresidual.view(dy.shape) if dresidual is not None else dy.new_empty(0),
            dweight, dbias)


@_backward_op.register_fake
def _backward_fake(dy: Tensor, h: Tensor, mean: Tensor, rstd: Tensor, weight: Tensor, seed: Tensor, p: float,
                   x_dtype: torch.dtype, residual_dtype: torch.dtype | None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    dresidual = dy.new_empty(dy.shape, dtype=residual_dtype) if residual_dtype is not None else dy.new_empty(0)
    return dy.new_empty(dy.shape, dtype=x_dtype), dresidual, torch.empty_like(weight), torch.empty_like(weight)


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, ...]) -> None:
    x, residual, weight, _, seed, p, _, _ = inputs
    _, h, mean, rstd = output
    ctx.save_for_backward(h, mean, rstd, weight, seed)
    ctx.p, ctx.x_dtype = p, x.dtype
    ctx.residual_dtype = residual.dtype if residual is not None else None
    ctx.mark_non_differentiable(h, mean, rstd)  # internal: the public function returns y only
    ctx.set_materialize_grads(False)  # no zero-filled (M, D) gradient for h


def _backward(ctx: Any, dy: Tensor | None, *_: Tensor | None) -> tuple[Tensor | None, ...]:
    if dy is None:  # y unused (grads are not materialized)
        return (None,) * 8
    h, mean, rstd, weight, seed = ctx.saved_tensors
    dx, dresidual, dweight, dbias = _backward_op(dy, h, mean, rstd, weight, seed, ctx.p, ctx.x_dtype,
                                                 ctx.residual_dtype)
    return dx, dresidual if ctx.residual_dtype is not None else None, dweight, dbias, None, None, None, None


_forward_op.register_autograd(_backward, setup_context=_setup_context)


def draw_seed(device: torch.device) -> Tensor:
    """(1,) int64 on `device` from torch's default generator there: no host sync on CUDA, and replayed by
    torch.utils.checkpoint (which restores the RNG state before recomputing)."""
    return torch.randint(0, SEED_HIGH, (1,), dtype=torch.int64, device=device)


def dropout_add_layer_norm(x: Tensor, residual: Tensor | None, weight: Tensor, bias: Tensor, p: float, eps: float,
                           *, out_dtype: torch.dtype | None = None) -> Tensor:
    """LayerNorm(residual + dropout_p(x)) over the last dimension (residual None: LayerNorm(dropout_p(x))).

    x, residual: (..., D), bf16/fp16/fp32, possibly different dtypes; weight, bias: (D,) fp32; p in [0, 1)
    (0: no dropout, no seed drawn); output in `out_dtype`, default x.dtype. Gradients: dx in x.dtype,
    dresidual in residual.dtype, dweight/dbias in weight.dtype."""
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout probability must be in [0, 1), got {p}")
    if residual is not None and residual.shape != x.shape:
        raise ValueError(f"residual shape {tuple(residual.shape)} differs from x's {tuple(x.shape)}")
    if weight.shape != (x.shape[-1],) or bias.shape != weight.shape:
        raise ValueError(f"weight and bias must be ({x.shape[-1]},), got {tuple(weight.shape)}, {tuple(bias.shape)}")
    seed = draw_seed(x.device) if p > 0 else torch.zeros(1, dtype=torch.int64, device=x.device)
    y, _, _, _ = _forward_op(x, residual, weight, bias, seed, p, eps, out_dtype or x.dtype)
    return y
