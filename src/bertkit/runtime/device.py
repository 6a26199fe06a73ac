"""Where and how a run computes: the device, the precision (training and inference) and the seeds.

- Devices: `resolve_device` (the values of --device, `DEVICES`, are bertkit.settings').
- Training precision: `default_precision`, `resolve_precision`, and `autocast`, the context the loop and
  the throughput probe run forward passes under (values: `bertkit.settings.PRECISIONS`).
- Inference precision: `check_inference_precision`, `inference_precision` (what
  `bertkit.model.for_inference` and every inference command resolve --precision with; values:
  `bertkit.settings.INFERENCE_PRECISIONS`).
- Seeding: `seed_everything`.

Design decision: every layer may import this module (pre-training, fine-tuning, inference, serving and
the quickstart all pick a device and a precision), so at import it imports only torch, `bertkit.errors`,
`bertkit.settings` and `bertkit.runtime.probe` (`bertkit.runtime.step_probe`, which builds models, when 'auto' is
resolved); 'auto' precisions are the faster choice as measured on this machine, the model's own step
(`bertkit.runtime.step_probe`) or a dense layer at its width (`bertkit.runtime.probe`), never read from CPU flags:
avx512_bf16 has meant 4.7x on one CPU and 0.6x on another.
"""

from __future__ import annotations

import contextlib
import logging
import random
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

from bertkit.errors import BertkitError
from bertkit.kernels import int8
from bertkit.runtime import probe
from bertkit.settings import DEVICES, INFERENCE_PRECISIONS

log = logging.getLogger(__name__)


def resolve_device(device: str, local_rank: int = 0) -> torch.device:
    """'auto' -> the local CUDA device when there is one, else CPU; 'cpu'/'cuda' as asked."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        if not torch.cuda.is_available():
            raise BertkitError("--device cuda was asked for but no CUDA device is available; use --device cpu")
        return torch.device("cuda", local_rank)
    if device != "cpu":
        raise BertkitError(f"--device {device!r} is not supported; use {', '.join(DEVICES)}")
    return torch.device("cpu")


def reset_peak_memory(device: torch.device) -> None:
    """Start a new peak for `peak_memory` on a CUDA device (the process's peak RSS cannot be reset)."""
    if device.type == "cuda" and torch.cuda.is_initialized():  # before CUDA's first use there is no peak yet
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory(device: torch.device) -> dict[str, float]:
    """The most memory this process has held, in MiB: `rss_mib` (resident, the process's lifetime peak:
    weights, activations, optimizer state and everything else) and, on a CUDA device,
    `cuda_allocated_mib` (tensors, since the last `reset_peak_memory`) and `cuda_reserved_mib` (what the
    caching allocator took from the GPU)."""
    import resource
    import sys

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    peak = {"rss_mib": round(rss / (2**20 if sys.platform == "darwin" else 2**10), 1)}
    if device.type == "cuda" and torch.cuda.is_initialized():
        peak["cuda_allocated_mib"] = round(torch.cuda.max_memory_allocated(device) / 2**20, 1)
        peak["cuda_reserved_mib"] = round(torch.cuda.max_memory_reserved(device) / 2**20, 1)
    return peak


def default_precision(device: torch.device, model: nn.Module | None = None, rows: int | None = None,
                      length: int | None = None) -> str:
    """bf16 on CUDA GPUs that support it; on a CPU the faster of fp32 and bf16 for training as measured on
    this machine: the model's own step at `rows` x `length` tokens (bertkit.runtime.step_probe; bf16 when >= 1.05x),
    or, without a model or with BERTKIT_PROBE_FILE set, the dense-layer probe at its width (bf16 when >=
    1.2x; bertkit.runtime.probe)."""
    if device.type == "cpu" and model is not None:
        from bertkit.runtime import step_probe  # imports bertkit.model, which imports this module

        chosen = step_probe.auto_precision(model, "training", rows, length)
        if chosen is not None:
            return chosen
    width = probe.model_width(model) if model is not None else probe.DEFAULT_WIDTH
    return probe.auto_precision(device, width, purpose="training")


def resolve_precision(precision: str, device: torch.device, model: nn.Module | None = None, rows: int | None = None,
                      length: int | None = None) -> str:
    """The training precision to run: 'auto' becomes default_precision(device, model, rows, length)."""
    return default_precision(device, model, rows, length) if precision == "auto" else precision


def autocast(precision: str, device: torch.device) -> Callable[[], Any]:
    """A factory of the context a forward pass runs under in a resolved training precision: nothing for
    fp32, torch.autocast to bf16 or fp16 otherwise (fp16 also needs a grad scaler: the loop's business)."""
    if precision == "fp32":
        return contextlib.nullcontext
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    return lambda: torch.autocast(device.type, dtype=dtype)


def check_inference_precision(precision: str) -> str:
    """`precision` itself when it is one of INFERENCE_PRECISIONS, else a BertkitError naming them."""
    if precision not in INFERENCE_PRECISIONS:
        raise BertkitError(f"--precision {precision!r} is not supported for inference; "
                           f"use one of {', '.join(INFERENCE_PRECISIONS)}")
    return precision


def inference_precision(precision: str, model: nn.Module, device: torch.device) -> str:
    """The inference precision to run: 'auto' is the faster of fp32 and bf16 as measured on this machine:
    the model's inference forward at 8 x 128 tokens (bertkit.runtime.step_probe), else (BERTKIT_PROBE_FILE
    set) the dense-layer probe at its width (bertkit.runtime.probe); bf16 on CUDA where supported. int8 is
    never chosen by 'auto': it changes outputs by more than rounding, so it is asked for by name (accuracy:
    docs/performance.md).
    The choice is logged in one line: auto's with its reason (bertkit.runtime.probe), a given one as given."""
    if check_inference_precision(precision) == "auto":
        if device.type == "cpu":
            from bertkit.runtime import step_probe

            chosen = step_probe.auto_precision(model, "inference")
            if chosen is not None:
                return chosen
        return probe.auto_precision(device, probe.model_width(model), purpose="inference")
    if precision == "int8" and device.type != "cpu":
        raise BertkitError(f"--precision int8 runs on CPUs only; on {device.type} use bf16 or fp32")
    if precision == "int8" and not int8.works():
        raise BertkitError(int8.MISSING)
    # the default (fp32) and a given precision alike: say what runs and how to have it measured, not who chose it
    log.info("precision for inference: %s (--precision auto would measure this machine and pick the faster of "
             "fp32 and bf16)", precision)
    return precision


def apply_threads(threads: int | None) -> None:
    """torch.set_num_threads(threads), a run's --threads; unset: torch's default, untouched. Called by the library
    functions that run a model (a caller of `pretrain()` or `run_finetuning()` gets the threads it recorded)."""
    if threads is not None:
        torch.set_num_threads(threads)


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (CPU and CUDA) generators."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
