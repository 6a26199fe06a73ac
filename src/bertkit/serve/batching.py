"""Length-sorted batching for inference: group encoded inputs of similar length, pad each group to its own
longest member, run it, and put the per-input results back in the caller's order.

Design decision: sorting by length before cutting batches keeps padding to a minimum (a batch of
one long and fifteen short inputs would otherwise pay for sixteen long ones), and the encoder's
padding-free path removes what padding is left from the dense layers. Results are scattered back to
their original positions, so callers never see the reordering. Reference: the "bucketing" of
sequence models (e.g. the length-grouped sampler of Hugging Face's Trainer).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np
import torch

R = TypeVar("R")
INPUT_KEYS = ("input_ids", "token_type_ids", "attention_mask")


def length_sorted_batches(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """Indices of the inputs cut into batches of at most `batch_size`, longest inputs first."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]


def pad_features(features: Sequence[dict[str, Any]], pad_token_id: int) -> dict[str, torch.Tensor]:
    """input_ids / token_type_ids / attention_mask of the features as (B, T) int64 tensors, T = longest."""
    longest = max(len(f["input_ids"]) for f in features)
    batch = {}
    for key in INPUT_KEYS:
        pad = pad_token_id if key == "input_ids" else 0
        rows = [list(f[key]) + [pad] * (longest - len(f[key])) for f in features]
        batch[key] = torch.tensor(rows, dtype=torch.long)
    return batch


def run_sorted(features: Sequence[dict[str, Any]], step: Callable[[dict[str, torch.Tensor]], list[R]],
               batch_size: int, pad_token_id: int) -> list[R]:
    """`step(batch)` over length-sorted batches of `features`; one result per feature, in input order."""
    results: list[Any] = [None] * len(features)
    for indices in length_sorted_batches([len(f["input_ids"]) for f in features], batch_size):
        batch = pad_features([features[i] for i in indices], pad_token_id)
        with torch.inference_mode():
            rows = step(batch)
        for index, row in zip(indices, rows):
            results[index] = row
    return results


def trim(tensor: torch.Tensor, attention_mask: torch.Tensor) -> list[np.ndarray]:
    """(B, T, ...) -> B float32 arrays (T_i, ...) holding each row's real positions only."""
    lengths = attention_mask.sum(dim=1).tolist()
    values = tensor.float().cpu().numpy()
    return [values[i, :n] for i, n in enumerate(lengths)]
