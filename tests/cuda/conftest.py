"""Shared by the CUDA tests (`pytest -m cuda`; scripts/gpu_check.sh runs them on a GPU).

Every test here is marked `cuda` and skips without a CUDA device. GPU_CHECK_TESTS_ON_CPU=1 runs the
tests that have a CPU meaning (parity, padding patterns, compile) on the CPU instead, to check the tests
themselves on a machine without a GPU; tests of CUDA-only features (flash attention, fp16 with a grad
scaler) still skip. Also puts scripts/ on sys.path for `gpu_check.tiny` (the tiny pre-training data the
GPU check's process-group part trains on too).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

CUDA = torch.cuda.is_available()
ON_CPU = not CUDA and os.environ.get("GPU_CHECK_TESTS_ON_CPU") == "1"
DEVICE = "cuda" if CUDA else "cpu"

cuda_or_cpu_check = pytest.mark.skipif(not (CUDA or ON_CPU), reason="needs a CUDA device")
"""For tests that mean something on the CPU too (run there with GPU_CHECK_TESTS_ON_CPU=1)."""
cuda_only = pytest.mark.skipif(not CUDA, reason="needs a CUDA device (a CUDA-only feature)")


def padded_batch(patterns: list[list[int]], vocab_size: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """A (B, T) batch whose attention mask is `patterns` (1 = real token), two segments a row, on DEVICE."""
    mask = torch.tensor(patterns)
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(1, vocab_size, mask.shape, generator=generator) * mask
    token_type_ids = torch.zeros_like(input_ids)
    token_type_ids[:, mask.shape[1] // 2:] = 1
    return {"input_ids": input_ids.to(DEVICE), "token_type_ids": token_type_ids.to(DEVICE),
            "attention_mask": mask.to(DEVICE)}
