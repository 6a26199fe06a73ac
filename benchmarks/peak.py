"""Measured matrix-multiply peak of a dtype on a device, shared by the benchmark scripts.

The achieved TFLOP/s of a model only means something next to what the hardware's matrix multiply
reaches here and now: the best of a few square products, by the fastest kernel PyTorch offers. On CPU
that is the faster of `torch.mm` (MKL for fp32, oneDNN for bf16) and oneDNN with a prepacked weight
(what bertkit's CPU inference uses; on AMD CPUs ~2x MKL in fp32); on CUDA `torch.mm` (cuBLAS).
"""

from __future__ import annotations

import time

import torch

from bertkit.model.accelerate import PackedLinear, onednn_works


def matmul_peak(dtype: torch.dtype, device: str = "cpu", size: int | None = None, repeats: int = 5) -> float:
    """Best-of-N TFLOP/s of a (size x size) @ (size x size) product in `dtype` on `device`."""
    size = size or (2048 if device == "cpu" else 8192)
    a = torch.randn(size, size, dtype=dtype, device=device)
    layer = torch.nn.Linear(size, size, bias=False, dtype=dtype, device=device)
    kernels = [lambda: a @ layer.weight]
    best = float("inf")
    with torch.inference_mode():
        if device == "cpu" and onednn_works(dtype):  # bertkit's CPU inference kernel, its weight packed once
            packed = PackedLinear(layer)
            kernels.append(lambda: packed(a))
        for kernel in kernels:
            kernel()
            best = min(best, *(timed(kernel, device) for _ in range(repeats)))
    return 2 * size ** 3 / best / 1e12


def timed(fn, device: str = "cpu") -> float:
    """Seconds `fn()` takes, waiting for the device to finish."""
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
