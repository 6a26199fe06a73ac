"""Attention as two batched matrix multiplies: the kernel `bertkit.model.attention.CpuBmm` runs where the probe
(`bertkit.runtime.probe`) measured it faster than SDPA for the dtype and length. Torch only.

Shape legend: B batch, A heads, T sequence length, Dh head size.
"""

from __future__ import annotations

import torch


def bmm_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(Dh)) v for 3 x (B, A, T, Dh) -> (B, A, T, Dh) by two batched matmuls: the
    candidate the probe times against SDPA."""
    batch, heads, length, size = q.shape
    q = (q * size ** -0.5).reshape(batch * heads, length, size)
    scores = torch.bmm(q, k.reshape(batch * heads, length, size).transpose(1, 2))  # (BA, T, T)
    probs = torch.softmax(scores, dim=-1)  # bf16 in, accumulated in fp32 by the CPU kernel
    return torch.bmm(probs, v.reshape(batch * heads, length, size)).view(batch, heads, length, size)
