"""Remove padding before the dense layers and put it back at the output.

Design decision: a batch (B, T) with an attention mask holds N <= B*T real tokens. Every
projection, feed-forward, LayerNorm and dropout is per token, so it runs on the (N, D) real tokens
alone; only attention needs sequences:

- on CUDA (bf16/fp16, no attention dropout): flash attention over the packed tokens with cumulative
  sequence lengths (`torch.nn.attention.varlen.varlen_attn`), no padding at all;
- on CUDA otherwise (attention dropout in training, fp32): SDPA on the batch padded back for
  attention alone, with a key-padding mask — one kernel launch rather than one per sequence;
- on CPU: one `scaled_dot_product_attention` call per sequence on its own slice of the packed
  tokens — no padding and no gathers. On an idle 2-core avx512_bf16 CPU this measured fastest
  (12 bert-base layers, 32 verses of 12-70 tokens: per sequence 33 ms fp32 / 39 ms bf16; length-sorted
  groups of 4-8 40-47 ms; re-padding for one masked call 80 ms), and in training too (a bf16 bert-base
  pre-training step, 32 x 128, mostly full-length rows, attention dropout on: 4.7 s per sequence,
  5.9 s re-padded).

The gather indices are computed once per forward pass. Numbers equal the padded path at real
positions; padded positions come back as zeros.

Reference: mosaicml/examples bert_padding.py (unpad_input / pad_input), NVIDIA's packed BERT.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import torch

# attention(qkv (B, T, 3D), key-padding mask (B, 1, 1, T) or None) -> context (B, T, D)
PaddedAttention = Callable[[torch.Tensor, "torch.Tensor | None"], torch.Tensor]


@dataclass
class Unpadded:
    """Where the real tokens of a (B, T) batch live in its flattened (B*T) layout."""

    indices: torch.Tensor  # (N,) int64 positions of real tokens in the flattened batch
    batch_size: int
    seq_len: int
    lengths: torch.Tensor  # (B,) real tokens per sequence

    @classmethod
    def from_mask(cls, attention_mask: torch.Tensor) -> Unpadded:
        """From a (B, T) mask; each row's real tokens stay in order and together once packed."""
        batch_size, seq_len = attention_mask.shape
        indices = attention_mask.reshape(-1).nonzero().squeeze(1)
        return cls(indices, batch_size, seq_len, attention_mask.sum(1))

    @cached_property  # the layout is built once per forward pass and used by every layer
    def cu_seqlens(self) -> torch.Tensor:
        """(B+1,) int32 start of each sequence in the packed (N, ...) tokens."""
        return torch.nn.functional.pad(self.lengths.cumsum(0), (1, 0)).to(torch.int32)

    def attention(self, qkv: torch.Tensor, num_heads: int, dropout_p: float,
                  padded_attention: PaddedAttention) -> torch.Tensor:
        """Self-attention of each sequence over its own tokens: (N, 3D) -> (N, D)."""
        if qkv.is_cuda:
            if dropout_p == 0.0 and qkv.dtype in (torch.float16, torch.bfloat16):
                return self._varlen_attention(qkv, num_heads)
            return self.repadded_attention(qkv, padded_attention)  # one kernel, not one launch per sequence
        # split, not one slice per sequence: in backward, split joins the gradients with one cat, where
        # each slice would scatter its gradient into a zero-filled (N, 3D) tensor and those would be summed
        contexts = [padded_attention(piece.unsqueeze(0), None).squeeze(0)  # (t, 3D) -> (t, D)
                    for piece in qkv.split(self.split_sizes)]
        return torch.cat(contexts)

    @cached_property
    def split_sizes(self) -> list[int]:
        """Real tokens of each sequence, as ints (an all-padding row gives an empty piece)."""
        return self.lengths.tolist()

    @cached_property
    def longest(self) -> int:
        return int(self.lengths.max())

    def repadded_attention(self, qkv: torch.Tensor, padded_attention: PaddedAttention) -> torch.Tensor:
        """Attention on the batch padded back to (B, T, 3D) with a key-padding mask: (N, 3D) -> (N, D).
        An empty row attends to its zero padding rather than to nothing (some kernels give NaN for a row
        with every key masked, in backward too); its outputs are dropped again by the unpad."""
        keys = torch.arange(self.seq_len, device=qkv.device) < self.lengths.clamp(min=1)[:, None]  # (B, T)
        return self.unpad(padded_attention(self.pad(qkv), keys[:, None, None, :]))

    def _varlen_attention(self, qkv: torch.Tensor, num_heads: int) -> torch.Tensor:
        from torch.nn.attention.varlen import varlen_attn  # noqa: PLC0415 - CUDA-only path

        tokens, three_d = qkv.shape
        q, k, v = qkv.view(tokens, 3, num_heads, three_d // (3 * num_heads)).unbind(1)  # 3 x (N, A, Dh)
        cu = self.cu_seqlens
        return varlen_attn(q, k, v, cu, cu, self.longest, self.longest).reshape(tokens, three_d // 3)

    def unpad(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, ...) -> (N, ...)."""
        return x.reshape(self.batch_size * self.seq_len, *x.shape[2:]).index_select(0, self.indices)

    def pad(self, x: torch.Tensor) -> torch.Tensor:
        """(N, ...) -> (B, T, ...), zeros at padded positions."""
        out = x.new_zeros(self.batch_size * self.seq_len, *x.shape[1:])
        out.index_copy_(0, self.indices, x)
        return out.view(self.batch_size, self.seq_len, *x.shape[1:])
