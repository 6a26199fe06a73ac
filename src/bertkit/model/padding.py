"""Remove padding before the dense layers and put it back at the output.

Design decision: a batch (B, T) with an attention mask holds N <= B*T real tokens. Every
projection, feed-forward, LayerNorm and dropout is per token, so it can run on the (N, D) real
tokens alone; only attention needs the (B, T) layout, and it gets it by a cheap scatter/gather of
q, k, v. The gather indices are computed once per forward pass. Numbers are identical to the padded
path at real positions; padded positions come back as zeros.

Reference: the same idea as mosaicml/examples bert_padding.py (unpad_input / pad_input) and
NVIDIA's "packed" BERT; written here with index_select/index_copy.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Unpadded:
    """Where the real tokens of a (B, T) batch live in its flattened (B*T) layout."""

    indices: torch.Tensor  # (N,) int64 positions of real tokens in the flattened batch
    batch_size: int
    seq_len: int

    @classmethod
    def from_mask(cls, attention_mask: torch.Tensor) -> Unpadded:
        batch_size, seq_len = attention_mask.shape
        indices = attention_mask.reshape(-1).nonzero().squeeze(1)
        return cls(indices, batch_size, seq_len)

    def unpad(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, ...) -> (N, ...)."""
        return x.reshape(self.batch_size * self.seq_len, *x.shape[2:]).index_select(0, self.indices)

    def pad(self, x: torch.Tensor) -> torch.Tensor:
        """(N, ...) -> (B, T, ...), zeros at padded positions."""
        out = x.new_zeros(self.batch_size * self.seq_len, *x.shape[1:])
        out.index_copy_(0, self.indices, x)
        return out.view(self.batch_size, self.seq_len, *x.shape[1:])
