"""How fast this machine trains and evaluates a given model: measured, in a second or two, before a run.

Design decision: budgets are planned from measurements on the machine that runs, never from CPU flags
or a table (the same VM type has been a CPU where bf16 is 4.7x fp32 and one where it is 0.6x). A
measurement times real optimizer steps (forward, loss, backward, clipping, AdamW) of the caller's model on the
caller's batches (pre-training: its own data's, so their padding counts), after one warm-up step, and leaves the
global RNG state as it found it, so measuring before a run does not change the run. Callers build the model and the
batches (this module knows nothing about BERT): `bertkit.workflows.pretrain` and the quickstart use it to turn a
time budget into steps.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from bertkit.runtime import device as runtime
from bertkit.train.optim import build_optimizer

LossFn = Callable[[nn.Module, Any], "tuple[torch.Tensor, dict[str, float]]"]


def _rate(step: Callable[[], None], device: torch.device, seconds: float, max_count: int = 50,
          min_count: int = 2) -> float:
    """Calls of `step` per second: one warm-up, then at least `min_count` timed calls, then until `seconds`."""
    step()
    count, started = 0, time.perf_counter()
    while count < min_count or (time.perf_counter() - started < seconds and count < max_count):
        step()
        count += 1
    if device.type == "cuda":
        torch.cuda.synchronize()
    return count / (time.perf_counter() - started)


def training_steps_per_second(build_model: Callable[[], nn.Module], loss_fn: LossFn,
                              batch: dict[str, torch.Tensor] | list[dict[str, torch.Tensor]], precision: str,
                              device: torch.device, seconds: float = 1.5) -> float:
    """Optimizer steps per second of `loss_fn` on `batch` (a list: its batches in turn, so a rate over batches of
    several fills and lengths) for a model from `build_model()` (built here, under a forked RNG, and dropped
    afterwards)."""
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        model = build_model().to(device).train()
        optimizer = build_optimizer(model, "adamw", 1e-4, 0.01, (0.9, 0.999), 1e-6)
        batches = [{key: value.to(device) for key, value in one.items()}
                   for one in (batch if isinstance(batch, list) else [batch])]
        taken = itertools.count()
        # 'auto' as the run will resolve it
        autocast = runtime.autocast(runtime.resolve_precision(precision, device, model), device)()

        def step() -> None:
            with autocast:
                loss, _ = loss_fn(model, batches[next(taken) % len(batches)])
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # the loop clips (--max-grad-norm) every step
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        return _rate(step, device, seconds, min_count=max(2, len(batches)))  # every batch timed at least once


def inference_batches_per_second(build_model: Callable[[], nn.Module], batch: dict[str, torch.Tensor],
                                 device: torch.device, seconds: float = 0.5) -> float:
    """Forward passes per second of a model from `build_model()` on `batch`, in eval mode, fp32, no grad
    (how fine-tuning evaluates)."""
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        model = build_model().to(device).eval()
        batch = {key: value.to(device) for key, value in batch.items()}
        with torch.inference_mode():
            return _rate(lambda: model(**batch), device, seconds)
