"""Remove padding before the dense layers and put it back at the output: the layout, nothing else.

Design decision: a batch (B, T) with an attention mask holds N <= B*T real tokens. Every
projection, feed-forward, LayerNorm and dropout is per token, so it runs on the (N, D) real tokens
alone; only attention needs sequences, and the attention backends (attention.py) find them here: as
slices (`split_sizes`), as cumulative lengths (`cu_seqlens`), or by padding back (`pad`). The gather
indices are computed once per forward pass; padded positions come back as zeros. Any mask works: left,
right or interior padding, all-padding rows; each row's real tokens keep their order and their absolute
positions (position embeddings were added in the padded layout, as transformers does), and `pad` puts
them back where they were.

Reference: mosaicml/examples bert_padding.py (unpad_input / pad_input), NVIDIA's packed BERT.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch


@dataclass
class Unpadded:
    """Where the real tokens of a (B, T) batch live in its flattened (B*T) layout."""

    indices: torch.Tensor  # (N,) int64 positions of real tokens in the flattened batch
    batch_size: int
    seq_len: int
    lengths: torch.Tensor  # (B,) real tokens per sequence
    mask: torch.Tensor  # (B, T) bool, True at real tokens: where they are, not only how many

    @classmethod
    def from_mask(cls, attention_mask: torch.Tensor) -> Unpadded:
        """From a (B, T) mask of any pattern; each row's real tokens stay in order and together once packed."""
        batch_size, seq_len = attention_mask.shape
        indices = attention_mask.reshape(-1).nonzero().squeeze(1)
        return cls(indices, batch_size, seq_len, attention_mask.sum(1), attention_mask.bool())

    @cached_property  # the layout is built once per forward pass and used by every layer
    def cu_seqlens(self) -> torch.Tensor:
        """(B+1,) int32 start of each sequence in the packed (N, ...) tokens."""
        return torch.nn.functional.pad(self.lengths.cumsum(0), (1, 0)).to(torch.int32)

    @cached_property
    def split_sizes(self) -> list[int]:
        """Real tokens of each sequence, as ints (an all-padding row gives an empty piece)."""
        return self.lengths.tolist()

    @cached_property
    def longest(self) -> int:
        return int(self.lengths.max())

    def unpad(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, ...) -> (N, ...)."""
        return x.reshape(self.batch_size * self.seq_len, *x.shape[2:]).index_select(0, self.indices)

    def pad(self, x: torch.Tensor) -> torch.Tensor:
        """(N, ...) -> (B, T, ...), zeros at padded positions."""
        out = x.new_zeros(self.batch_size * self.seq_len, *x.shape[1:])
        out.index_copy_(0, self.indices, x)
        return out.view(self.batch_size, self.seq_len, *x.shape[1:])
