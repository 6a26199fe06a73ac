"""Remove padding before the dense layers and put it back at the output.

Design decision: a batch (B, T) with an attention mask holds N <= B*T real tokens. Every
projection, feed-forward, LayerNorm and dropout is per token, so it runs on the (N, D) real tokens
alone; only attention needs sequences, and gets them without padding waste:

- on CUDA (bf16/fp16, no attention dropout): flash attention over the packed tokens with cumulative
  sequence lengths (`torch.nn.attention.varlen.varlen_attn`);
- elsewhere: sequences sorted by length and cut into groups of `ATTENTION_GROUP_SIZE`; each group is
  gathered into a (Bg, Tg, 3D) block padded only to its own longest member, and goes through
  `scaled_dot_product_attention`. Measured on a 2-core avx512_bf16 CPU (benchmarks/inference.py).

All gather indices are computed once per forward pass. Numbers equal the padded path at real
positions; padded positions come back as zeros.

Reference: mosaicml/examples bert_padding.py (unpad_input / pad_input), NVIDIA's packed BERT.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

ATTENTION_GROUP_SIZE = 8  # sequences per attention block on CPU (measured: see module docstring)

# attention(qkv (Bg, Tg, 3D), key-padding mask (Bg, 1, 1, Tg) or None) -> context (Bg, Tg, D)
PaddedAttention = Callable[[torch.Tensor, "torch.Tensor | None"], torch.Tensor]


@dataclass
class AttentionGroup:
    """A block of similar-length sequences: where to gather its tokens and where they go back."""

    gather: torch.Tensor  # (Bg*Tg,) rows of the (N, ...) tokens; padding slots point at row 0 (masked out)
    real: torch.Tensor  # (n_g,) slots of the block that hold real tokens, in packed order
    batch_size: int
    seq_len: int
    mask: torch.Tensor | None  # (Bg, 1, 1, Tg) key-padding mask, None when all lengths are equal


@dataclass
class Unpadded:
    """Where the real tokens of a (B, T) batch live in its flattened (B*T) layout."""

    indices: torch.Tensor  # (N,) int64 positions of real tokens in the flattened batch
    batch_size: int
    seq_len: int
    lengths: torch.Tensor  # (B,) real tokens per sequence
    _groups: list[AttentionGroup] | None = field(default=None, repr=False)
    _unsort: torch.Tensor | None = field(default=None, repr=False)

    @classmethod
    def from_mask(cls, attention_mask: torch.Tensor) -> Unpadded:
        """From a (B, T) mask whose real tokens form a prefix of each row (right padding)."""
        batch_size, seq_len = attention_mask.shape
        indices = attention_mask.reshape(-1).nonzero().squeeze(1)
        return cls(indices, batch_size, seq_len, attention_mask.sum(1))

    @property
    def cu_seqlens(self) -> torch.Tensor:
        """(B+1,) int32 start of each sequence in the packed (N, ...) tokens."""
        return torch.nn.functional.pad(self.lengths.cumsum(0), (1, 0)).to(torch.int32)

    def attention(self, qkv: torch.Tensor, num_heads: int, dropout_p: float,
                  padded_attention: PaddedAttention) -> torch.Tensor:
        """Self-attention of each sequence over its own tokens: (N, 3D) -> (N, D)."""
        if qkv.is_cuda and dropout_p == 0.0 and qkv.dtype in (torch.float16, torch.bfloat16):
            return self._varlen_attention(qkv, num_heads)
        if self._groups is None:
            self._build_groups()
        blocks = []
        for group in self._groups:
            block = qkv.index_select(0, group.gather).view(group.batch_size, group.seq_len, -1)
            context = padded_attention(block, group.mask)  # (Bg, Tg, D)
            blocks.append(context.reshape(group.batch_size * group.seq_len, -1).index_select(0, group.real))
        return torch.cat(blocks).index_select(0, self._unsort)  # back from length-sorted to packed order

    def _varlen_attention(self, qkv: torch.Tensor, num_heads: int) -> torch.Tensor:
        from torch.nn.attention.varlen import varlen_attn  # noqa: PLC0415 - CUDA-only path

        tokens, three_d = qkv.shape
        q, k, v = qkv.view(tokens, 3, num_heads, three_d // (3 * num_heads)).unbind(1)  # 3 x (N, A, Dh)
        cu, longest = self.cu_seqlens, int(self.lengths.max())
        return varlen_attn(q, k, v, cu, cu, longest, longest).reshape(tokens, three_d // 3)

    def _build_groups(self) -> None:
        lengths = self.lengths.tolist()
        starts = [0]
        for length in lengths[:-1]:
            starts.append(starts[-1] + length)
        order = sorted(range(len(lengths)), key=lambda i: lengths[i])
        device = self.indices.device
        groups, packed_rows = [], []
        for first in range(0, len(order), ATTENTION_GROUP_SIZE):
            members = order[first:first + ATTENTION_GROUP_SIZE]
            longest = lengths[members[-1]]
            gather, real = [], []
            for slot, i in enumerate(members):
                rows = list(range(starts[i], starts[i] + lengths[i]))
                gather += rows + [0] * (longest - lengths[i])
                real += range(slot * longest, slot * longest + lengths[i])
                packed_rows += rows
            mask = None
            if lengths[members[0]] != longest:
                mask = torch.tensor([[t < lengths[i] for t in range(longest)] for i in members], device=device)
                mask = mask[:, None, None, :]
            groups.append(AttentionGroup(torch.tensor(gather, device=device), torch.tensor(real, device=device),
                                         len(members), longest, mask))
        self._groups = groups
        self._unsort = torch.empty(len(packed_rows), dtype=torch.long, device=device)
        self._unsort[torch.tensor(packed_rows, device=device)] = torch.arange(len(packed_rows), device=device)

    def unpad(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, ...) -> (N, ...)."""
        return x.reshape(self.batch_size * self.seq_len, *x.shape[2:]).index_select(0, self.indices)

    def pad(self, x: torch.Tensor) -> torch.Tensor:
        """(N, ...) -> (B, T, ...), zeros at padded positions."""
        out = x.new_zeros(self.batch_size * self.seq_len, *x.shape[1:])
        out.index_copy_(0, self.indices, x)
        return out.view(self.batch_size, self.seq_len, *x.shape[1:])
