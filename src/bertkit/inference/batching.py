"""Length-sorted batching: group encoded inputs of similar length, pad each group to its own longest member,
run it, and put the per-input results back in the caller's order. The one padding rule (`pad_batch`) is
also the fine-tuning collate.

A feature is a dict of Python lists as the tasks and predictors build them: `input_ids`,
`token_type_ids`, `attention_mask` (T tokens, or C lists of tokens for multiple choice), optionally
`labels`, `start_positions`, `end_positions`, and any keys of the caller's own, which are left alone.

Design decision: sorting by length before cutting batches keeps padding to a minimum (a batch of one
long and fifteen short inputs would otherwise pay for sixteen long ones), and the encoder's
padding-free path removes what padding is left from the dense layers. Batches go longest first, so a
batch size too large for the memory fails at once. Results are scattered back to their original
positions, so callers never see the reordering. Reference: the "bucketing" of sequence models (e.g.
the length-grouped sampler of Hugging Face's Trainer).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any, TypeVar

import numpy as np
import torch
from torch import nn

from bertkit.errors import ModelFault

R = TypeVar("R")
INPUT_KEYS = ("input_ids", "token_type_ids", "attention_mask")
MODEL_KEYS = (*INPUT_KEYS, "labels", "start_positions", "end_positions")
IGNORE_INDEX = -100  # padded labels: ignored by the losses


def check_finite(results: R, model_id: str) -> R:
    """`results` (arrays, floats, and lists or dicts of them) as they are, or ModelFault when any number in them
    is NaN or infinite: the model's weights, or the int8 scales kept beside it, compute garbage."""
    if not _finite(results):
        raise ModelFault(f"model {model_id} computed NaN or infinite values; its weights or the int8 scales kept "
                         "beside it (int8_smoothing.safetensors) are damaged: check them, or run it with --precision "
                         "fp32")
    return results


def _finite(value: Any) -> bool:
    if isinstance(value, np.ndarray):
        return value.dtype.kind not in "fc" or bool(np.isfinite(value).all())
    if isinstance(value, torch.Tensor):
        return not value.is_floating_point() or bool(torch.isfinite(value).all())
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return all(_finite(v) for v in value)
    return True


def feature_length(feature: dict[str, Any]) -> int:
    """Tokens of a feature (the longest choice for multiple choice): what padding depends on."""
    ids = feature["input_ids"]
    return max(len(choice) for choice in ids) if ids and isinstance(ids[0], list) else len(ids)


def pad_batch(features: Sequence[dict[str, Any]], pad_token_id: int) -> dict[str, torch.Tensor]:
    """The model keys the features have as int64 tensors padded to the longest feature: (B, T), or
    (B, C, T) for multiple choice; input_ids padded with `pad_token_id`, labels with -100, the others with 0."""
    batch = {}
    for key in MODEL_KEYS:
        if key in features[0]:
            pad = pad_token_id if key == "input_ids" else IGNORE_INDEX if key == "labels" else 0
            batch[key] = torch.tensor(_padded([f[key] for f in features], pad), dtype=torch.long)
    return batch


def _padded(values: list, pad: int) -> list:
    if not isinstance(values[0], (list, tuple)):
        return values  # one number per feature (a class label, a span position)
    if values[0] and isinstance(values[0][0], (list, tuple)):  # choices: pad every choice of every example
        longest = max(len(seq) for group in values for seq in group)
        return [[[*seq, *[pad] * (longest - len(seq))] for seq in group] for group in values]
    longest = max(len(seq) for seq in values)
    return [[*seq, *[pad] * (longest - len(seq))] for seq in values]


def length_sorted_batches(features: Sequence[dict[str, Any]], batch_size: int) -> list[list[int]]:
    """Indices of the features cut into batches of at most `batch_size`, longest features first."""
    lengths = [feature_length(f) for f in features]
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]


def sorted_batches(features: Sequence[dict[str, Any]], batch_size: int, pad_token_id: int,
                   device: torch.device | None = None) -> Iterator[tuple[list[int], dict[str, torch.Tensor]]]:
    """(indices, padded batch on `device`) for each length-sorted batch of the features."""
    for indices in length_sorted_batches(features, batch_size):
        batch = pad_batch([features[i] for i in indices], pad_token_id)
        yield indices, batch if device is None else {k: v.to(device) for k, v in batch.items()}


def run_sorted(features: Sequence[dict[str, Any]], step: Callable[[dict[str, torch.Tensor]], Sequence[R]],
               batch_size: int, pad_token_id: int, device: torch.device | None = None,
               grad_free: Callable[[], AbstractContextManager] = torch.inference_mode) -> list[R]:
    """`step(batch)` (one result per row) over length-sorted batches under `grad_free`; one result per
    feature, in input order. Code that trains the model afterwards passes `torch.no_grad`: tensors made
    under inference mode must never reach autograd."""
    results: list[Any] = [None] * len(features)
    with grad_free():
        for indices, batch in sorted_batches(features, batch_size, pad_token_id, device):
            for index, row in zip(indices, step(batch)):
                results[index] = row
    return results


def model_outputs(model: nn.Module, features: Sequence[dict[str, Any]], names: Sequence[str],
                  token_level: Sequence[str], batch_size: int, pad_token_id: int,
                  device: torch.device | None = None,
                  grad_free: Callable[[], AbstractContextManager] = torch.inference_mode,
                  ) -> dict[str, list[np.ndarray]]:
    """The outputs `names` of `model` (an eval-mode task model) for each feature, as float32 arrays in input
    order; those in `token_level` are cut to the feature's own tokens."""
    def step(batch: dict[str, torch.Tensor]) -> list[list[np.ndarray]]:
        out = model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
        lengths = batch["attention_mask"].sum(dim=-1).tolist()  # (B,), or (B, C) for multiple choice
        per_name = []
        for name in names:
            values = getattr(out, name).float().cpu().numpy()  # (B, ...)
            per_name.append([row[:n] for row, n in zip(values, lengths)] if name in token_level else list(values))
        return [list(row) for row in zip(*per_name)]

    rows = run_sorted(features, step, batch_size, pad_token_id, device, grad_free)
    return {name: [row[k] for row in rows] for k, name in enumerate(names)}
