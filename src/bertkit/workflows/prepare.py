"""Training applied from outside: what a workflow does to a built model and its TrainConfig before
`bertkit.train.fit` runs them.

    prepare_training(model, config, ctx, rows, length) -> (model ready to train, resolved config)
    sample_length(dataset, count) -> the longest input_ids among the first `count` examples

Design decision: the loop receives a model already placed and wrapped and a config already resolved
(torchtitan's shape); every choice that depends on the machine or on the process group is made here, once, by
rank 0 where it is a measurement, so every rank runs the same: `--precision auto` (the step probe times the
run's own step at its micro-batch and length, `bertkit.runtime.device.resolve_precision`), glibc's allocator
thresholds (`bertkit.runtime.allocator`), the device, and DistributedDataParallel under torchrun.
torch.compile and gradient checkpointing are model transforms the workflows' `build_model` applies
(`bertkit.model.compile_model`, `enable_gradient_checkpointing`).
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn
from torch.utils.data import Dataset

from bertkit.runtime.allocator import keep_freed_memory
from bertkit.runtime.device import resolve_precision
from bertkit.settings import TrainConfig
from bertkit.train.distributed import DistributedContext, broadcast_object, wrap_model


def prepare_training(model: nn.Module, config: TrainConfig, ctx: DistributedContext, rows: int | None = None,
                     length: int | None = None) -> tuple[nn.Module, TrainConfig]:
    """(the model on `ctx.device`, wrapped for DDP under torchrun; `config` with its precision resolved).
    `--precision auto` measures the step at `rows` x `length` tokens on rank 0 (every rank runs its choice);
    large activations are reused rather than page-faulted from here on. The learning rate must be resolved by
    the workflow's own rule first (a recipe, the fine-tuning rule)."""
    keep_freed_memory()
    if config.learning_rate is None:
        raise ValueError("prepare_training: resolve the learning rate first (the workflow's rule decides it)")
    precision = config.precision
    if precision == "auto":
        measured = resolve_precision("auto", ctx.device, model, rows, length) if ctx.is_main else None
        precision = broadcast_object(measured, ctx)
    model.to(ctx.device)
    return wrap_model(model, ctx), dataclasses.replace(config, precision=precision)


def sample_length(dataset: Dataset, count: int) -> int | None:
    """The longest `input_ids` among the first `count` examples (the length a step runs at; the last
    dimension, for multiple choice's one row per choice), or None when the examples hold none."""
    lengths = []
    for index in range(min(count, len(dataset))):  # type: ignore[arg-type]  # fit's datasets are sized
        item = dataset[index]
        ids = item.get("input_ids") if isinstance(item, dict) else None
        if ids is None:
            return None
        try:
            lengths.append(int(torch.as_tensor(ids).shape[-1]))
        except (ValueError, TypeError, RuntimeError, IndexError):  # ragged rows, not token ids
            return None
    return max(lengths) if lengths else None
