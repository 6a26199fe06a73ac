"""Remove padding before the dense layers and put it back at the output: the layout, nothing else.

Design decision: a batch (B, T) with an attention mask holds N <= B*T real tokens. Every
projection, feed-forward, LayerNorm and dropout is per token, so it runs on the (N, D) real tokens
alone; only attention needs sequences, and the attention backends (attention.py) find them here: as
slices (`split_sizes`), as cumulative lengths (`cu_seqlens`), or by padding back (`pad`). The gather
indices are computed once per forward pass (by the model from the mask, or by the collator on the host, which
keeps a GPU step from waiting for the device: `from_collated`); padded positions come back as zeros. Any mask
works: left, right or interior padding, all-padding rows; each row's real tokens keep their order and their absolute
positions (position embeddings were added in the padded layout, as transformers does), and `pad` puts
them back where they were.

Reference: mosaicml/examples bert_padding.py (unpad_input / pad_input), NVIDIA's packed BERT.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch


@dataclass
class Unpadded:
    """Where the real tokens of a (B, T) batch live in its flattened (B*T) layout."""

    indices: torch.Tensor  # (N,) int64 positions of real tokens in the flattened batch
    batch_size: int
    seq_len: int
    lengths: torch.Tensor  # (B,) real tokens per sequence
    mask: torch.Tensor  # (B, T) bool, True at real tokens: where they are, not only how many
    cu_seqlens: torch.Tensor  # (B+1,) int32 start of each sequence in the packed (N, ...) tokens
    max_length: int | None = None
    """A bound on the longest sequence known without reading the device (the collator's padded length T);
    None: `longest` reads it once, when a backend first asks."""
    _split_sizes: list[int] | None = dataclasses.field(default=None, repr=False)

    @classmethod
    def from_mask(cls, attention_mask: torch.Tensor) -> Unpadded:
        """From a (B, T) mask of any pattern; each row's real tokens stay in order and together once packed.
        (Finding the real tokens reads their count from the device: `from_collated` does not.)"""
        batch_size, seq_len = attention_mask.shape
        indices = attention_mask.reshape(-1).nonzero().squeeze(1)
        lengths = attention_mask.sum(1)
        cu_seqlens = torch.nn.functional.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)
        return cls(indices, batch_size, seq_len, lengths, attention_mask.bool(), cu_seqlens)

    @classmethod
    def from_collated(cls, attention_mask: torch.Tensor, indices: torch.Tensor, cu_seqlens: torch.Tensor) -> Unpadded:
        """From what the collator computed on the host (`bertkit.data.collate_static`): the real tokens'
        positions (N,) and the cumulative lengths (B+1,) of right-padded rows. Nothing is read from the device,
        and the longest sequence is bounded by the padded length T, so a compiled step sees one shape per
        batch size whatever the lengths (N varies: a dynamic dimension)."""
        batch_size, seq_len = attention_mask.shape
        lengths = cu_seqlens[1:] - cu_seqlens[:-1]
        return cls(indices, batch_size, seq_len, lengths, attention_mask.bool(), cu_seqlens, seq_len)

    @property
    def longest(self) -> int:
        """The length attention kernels size their work by: `max_length`, else the longest sequence (read once
        per forward pass and kept for every layer)."""
        if self.max_length is None:
            self.max_length = int(self.lengths.max())
        return self.max_length

    @property
    def split_sizes(self) -> list[int]:
        """Real tokens of each sequence, as ints (an all-padding row gives an empty piece; read once)."""
        if self._split_sizes is None:
            self._split_sizes = self.lengths.tolist()
        return self._split_sizes

    def unpad(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, ...) -> (N, ...)."""
        return x.reshape(self.batch_size * self.seq_len, *x.shape[2:]).index_select(0, self.indices)

    def pad(self, x: torch.Tensor) -> torch.Tensor:
        """(N, ...) -> (B, T, ...), zeros at padded positions."""
        out = x.new_zeros(self.batch_size * self.seq_len, *x.shape[1:])
        out.index_copy_(0, self.indices, x)
        return out.view(self.batch_size, self.seq_len, *x.shape[1:])
