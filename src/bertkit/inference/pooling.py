"""Sentence vectors from token vectors: sentence-transformers' Pooling and Normalize modules as functions.

`pool` reduces (B, T, H) hidden states to (B, H) at [CLS], or by mean, max or mean/sqrt(length) over
the real tokens (specials included); `sentence_vectors` pools chosen layers by chosen modes, concatenated,
optionally unit length. Which modes a directory asks for is read by the owner of that directory format,
`bertkit.interop.sentence_transformers`, so `bertkit extract`, `Predictor.embed`, `/embed` and embedding
training give the vectors sentence-transformers' `encode` gives for the same directory.

Reference: sentence-transformers' Pooling and Normalize modules (Reimers and Gurevych, 2019,
"Sentence-BERT", arXiv:1908.10084).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

POOLINGS = ("cls", "mean", "max", "mean_sqrt_len_tokens")
"""The pooling modes bertkit computes (sentence-transformers' names)."""


def pool(hidden: torch.Tensor, attention_mask: torch.Tensor, pooling: str) -> torch.Tensor:
    """(B, T, H) -> (B, H) float32: the [CLS] position, or mean / max / sum over sqrt(count) of the
    positions where the mask is 1."""
    if pooling == "cls":
        return hidden[:, 0].float()
    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
    if pooling == "max":
        return hidden.masked_fill(mask == 0, float("-inf")).amax(dim=1).float()
    total = (hidden * mask).sum(dim=1, dtype=torch.float32)  # (B, H)
    count = mask.sum(dim=1, dtype=torch.float32).clamp(min=1)  # (B, 1)
    return total / (count if pooling == "mean" else count.sqrt())


def sentence_vectors(layers: Sequence[torch.Tensor], attention_mask: torch.Tensor, poolings: Sequence[str],
                     normalize: bool) -> torch.Tensor:
    """Each (B, T, H) layer pooled by each mode, concatenated layer by layer -> (B, layers * modes * H)."""
    vectors = torch.cat([pool(hidden, attention_mask, mode) for hidden in layers for mode in poolings], dim=-1)
    return F.normalize(vectors, dim=-1) if normalize else vectors
