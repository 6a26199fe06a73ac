"""Dropout with a counter-based random mask, for CPU training. Torch only.

PyTorch's CPU dropout draws each element's Bernoulli sample from its Mersenne Twister one at a time, a large share
of a small model's training step (the measurements: docs/performance.md, "Dropout on the CPU"). Here the mask is a
hash of the element's index instead, SplitMix64 (Steele et al. 2014, "Fast splittable pseudorandom number
generators"; Java's SplittableRandom): the i-th 64-bit word is mix(seed + (i + 1) * GAMMA), computed for every word
at once with vectorised integer tensor ops, and each word gives four 16-bit lanes, one per element. An element is
dropped when its lane, as a 16-bit value with the top bit flipped (the lanes are compared signed), falls below
round(p * 65536), so the drop probability is that over 65536 (p = 0.1: 0.1000061); kept elements are scaled by 1 /
(1 - that), so the output's expectation is the input exactly, as inverted dropout's is.

One 64-bit seed a call is drawn from torch's default CPU generator: `torch.manual_seed` reproduces every mask,
a checkpoint's saved RNG state resumes them, and gradient checkpointing's RNG replay recomputes the same mask.
The backward multiplies by the saved mask (one byte an element, as torch's dropout keeps).

`dropout` takes CPU tensors; anything else (a CUDA tensor, a graph torch.compile traces) gets F.dropout.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

_GAMMA = 0x9E3779B97F4A7C15 - (1 << 64)  # SplitMix64's constants, as int64 (two's complement)
_MIX1 = 0xBF58476D1CE4E5B9 - (1 << 64)
_MIX2 = 0x94D049BB133111EB - (1 << 64)
LANES = 4  # 16-bit lanes per 64-bit word
RESOLUTION = 1 << 16


def _logical_shift(z: torch.Tensor, bits: int) -> torch.Tensor:
    """z >>> bits (unsigned): torch's >> on int64 keeps the sign bit."""
    return z.bitwise_right_shift(bits).bitwise_and_((1 << (64 - bits)) - 1)


def splitmix64(count: int, seed: int) -> torch.Tensor:
    """The first `count` outputs of SplitMix64 from state `seed`, as int64 (two's complement of the uint64)."""
    z = torch.arange(1, count + 1, dtype=torch.int64).mul_(_GAMMA).add_(seed)  # wraps as uint64 arithmetic does
    z.bitwise_xor_(_logical_shift(z, 30)).mul_(_MIX1)
    z.bitwise_xor_(_logical_shift(z, 27)).mul_(_MIX2)
    return z.bitwise_xor_(_logical_shift(z, 31))


def drop_threshold(p: float) -> int:
    """How many of the 65536 lane values drop an element: round(p * 65536)."""
    return round(p * RESOLUTION)


def keep_mask(shape: torch.Size | tuple[int, ...], p: float, seed: int) -> torch.Tensor:
    """A bool mask of `shape`, True where an element is kept: lane value >= drop_threshold(p)."""
    count = math.prod(shape)
    lanes = splitmix64(-(-count // LANES), seed).view(torch.int16)[:count]  # signed: -32768 is lane value 0
    return lanes.ge(drop_threshold(p) - RESOLUTION // 2).view(shape)


class _CounterDropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, p: float, seed: int) -> torch.Tensor:
        mask = keep_mask(x.shape, p, seed)
        ctx.save_for_backward(mask)
        ctx.scale = RESOLUTION / (RESOLUTION - drop_threshold(p))
        return _apply(x, mask, ctx.scale)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (mask,) = ctx.saved_tensors
        return _apply(grad, mask, ctx.scale), None, None


def _apply(x: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """x * mask * scale (the scale a Python float, applied in one multiply). The bool mask goes through its bytes
    to x's dtype: measured several times faster on a CPU than torch.where or a bool cast."""
    return torch.mul(x, mask.view(torch.uint8).to(x.dtype)).mul_(scale)


def draw_seed() -> int:
    """One 64-bit seed from torch's default CPU generator."""
    return int(torch.randint(-(1 << 63), (1 << 63) - 1, (), dtype=torch.int64))


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """Inverted dropout of `x` with a counter-based mask on a CPU (see the module docstring); F.dropout elsewhere
    and for p too near 0 or 1 for 16-bit lanes (|p| < 2^-17, p > 1 - 2^-17)."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or not 0 < drop_threshold(p) < RESOLUTION or torch.compiler.is_compiling():
        return F.dropout(x, p, training)
    return _CounterDropout.apply(x, p, draw_seed())
