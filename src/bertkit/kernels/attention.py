"""Attention kernels the backends of `bertkit.model.attention` call. Torch only.

- `bmm_attention`: two batched matrix multiplies, what `CpuBmm` (inference) and `BatchedBmm` (training, with the
  padding mask and attention dropout, its mask counter-based on a CPU: `bertkit.kernels.dropout`) run where the
  probe (`bertkit.runtime.probe`) measured it faster than SDPA for the dtype and length.
- `flash_varlen`: CUDA flash attention over packed sequences (cumulative lengths) WITH attention dropout, for
  training: `torch.nn.attention.varlen.varlen_attn` fixes dropout at 0, but the flash kernels under it
  (`aten._flash_attention_forward` / `_backward`, the ones SDPA uses) take a dropout probability and replay the
  forward's mask in the backward from the random state they return. `flash_varlen` is that pair as one
  autograd function, traceable by torch.compile (both ops have meta kernels).

Shape legend: B batch, A heads, T sequence length, Dh head size, N packed tokens.
"""

from __future__ import annotations

import torch

from bertkit.kernels.dropout import dropout


def bmm_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
                  dropout_p: float = 0.0) -> torch.Tensor:
    """softmax(q k^T / sqrt(Dh)) v for 3 x (B, A, T, Dh) -> (B, A, T, Dh) by two batched matmuls: the
    candidate the probe times against SDPA. `mask` (B, 1, 1, T) bool, True at the keys attended (padding
    False); `dropout_p` drops attention weights after the softmax (training), as BERT does, with a counter-based
    mask on a CPU (`kernels.dropout.dropout`). A row whose keys are all masked attends to them uniformly
    instead of giving NaN (its output is padding, dropped after)."""
    batch, heads, length, size = q.shape
    q = (q * size ** -0.5).reshape(batch * heads, length, size)
    scores = torch.bmm(q, k.reshape(batch * heads, length, size).transpose(1, 2))  # (BA, T, T)
    if mask is not None:
        scores = scores.view(batch, heads, length, length).masked_fill(~mask, torch.finfo(scores.dtype).min)
        scores = scores.view(batch * heads, length, length)
    probs = torch.softmax(scores, dim=-1)  # bf16 in, accumulated in fp32 by the CPU kernel
    if dropout_p > 0.0:
        probs = dropout(probs, dropout_p)
    return torch.bmm(probs, v.reshape(batch * heads, length, size)).view(batch, heads, length, size)


class _FlashVarlen(torch.autograd.Function):
    """Forward and backward of the flash kernels over packed sequences; the random state the forward returns
    (the third and fourth outputs, whatever this torch version calls them) is handed to the backward, which
    regenerates the dropout mask from it."""

    @staticmethod
    def forward(ctx, q, k, v, cu_seqlens, max_length: int, dropout_p: float, scale: float):
        out, lse, rng_a, rng_b, _ = torch.ops.aten._flash_attention_forward(
            q, k, v, cu_seqlens, cu_seqlens, max_length, max_length, dropout_p, False, False, scale=scale)
        ctx.save_for_backward(q, k, v, out, lse, cu_seqlens, rng_a, rng_b)
        ctx.max_length, ctx.dropout_p, ctx.scale = max_length, dropout_p, scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse, cu_seqlens, rng_a, rng_b = ctx.saved_tensors
        dq, dk, dv = torch.ops.aten._flash_attention_backward(
            grad_out.contiguous(), q, k, v, out, lse, cu_seqlens, cu_seqlens, ctx.max_length, ctx.max_length,
            ctx.dropout_p, False, rng_a, rng_b, scale=ctx.scale)
        return dq, dk, dv, None, None, None, None


def flash_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, max_length: int,
                 dropout_p: float = 0.0) -> torch.Tensor:
    """softmax(q k^T / sqrt(Dh)) v within each packed sequence, with attention dropout `dropout_p` (inverted, as
    SDPA's): 3 x (N, A, Dh) -> (N, A, Dh), bf16 or fp16 on a CUDA device; `cu_seqlens` (B+1,) int32 delimits the
    sequences, `max_length` bounds the longest (an upper bound is fine: the padded length)."""
    return _FlashVarlen.apply(q, k, v, cu_seqlens, max_length, dropout_p, q.shape[-1] ** -0.5)
