"""The masked-LM loss and accuracy over a (M, V) block of logits in one read, as one op with a PyTorch reference
(CPU, and the specification) and a Triton kernel (CUDA).

Design decision: no fp32 copy of the (M, V) logits is ever made. The forward reads the bf16 logits once,
keeping a running max and sum over blocks of the vocabulary (the online softmax) and the first argmax, and
saves one fp32 logsumexp a row; the backward recomputes softmax from the logits and that logsumexp and writes
the gradient once, in the logits' dtype. At BERT's 30522-word vocabulary this is the largest activation of
pre-training, so an fp32 copy (what `F.cross_entropy(logits.float(), ...)` makes) costs more than the head.

Weights follow Google's `masked_lm_weights`: 1 for a real prediction, 0 for the padding entries of a static-size
index (whose targets may be anything, 0 usually). A zero-weight row contributes nothing to the loss, the count
of correct predictions or the gradient, and the kernel does not read its logits. The op returns per-row values;
`masked_lm_loss` sums them (the caller divides by the masked-token count across the global batch).

Shape legend: M masked positions (rows), V vocabulary.

References: Milakov & Gimelshein 2018 (online softmax); Liger-Kernel's `ops/cross_entropy.py`;
google-research/bert `run_pretraining.py` (`get_masked_lm_output`, masked_lm_weights).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch
from torch import Tensor

from bertkit.kernels import triton_support

TRITON_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class LaunchConfig:
    """Vocabulary block and warps of the one-row-a-program kernels, shared by the launchers and the compile
    test."""

    block_v: int
    num_warps: int


def launch_config(v: int) -> LaunchConfig:
    """Blocks of up to 4096 logits (16 a thread at 8 warps), looped over the row."""
    block = min(4096, triton_support.next_power_of_2(v))
    return LaunchConfig(block_v=block, num_warps=8 if block >= 2048 else 4)


# ---------------------------------------------------------------- the reference (CPU; the specification)


def reference_forward(logits: Tensor, targets: Tensor, weights: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(loss, correct, lse), each (M,) in the compute dtype (fp32; fp64 for fp64 logits):
    loss_i = w_i (lse_i - logits_i[t_i]), correct_i = w_i [argmax_j logits_ij == t_i] (the first maximum),
    all three 0 where w_i = 0; a target outside [0, V) counts as a logit of 0, never correct."""
    dtype = torch.promote_types(logits.dtype, torch.float32)
    x = logits.to(dtype)
    lse = torch.logsumexp(x, dim=-1)
    valid = (targets >= 0) & (targets < x.shape[-1])
    target_logit = x.gather(-1, targets.clamp(0, x.shape[-1] - 1)[:, None])[:, 0]
    target_logit = torch.where(valid, target_logit, 0.0)
    live = weights != 0
    w = weights.to(dtype)
    loss = torch.where(live, w * (lse - target_logit), 0.0)
    correct = torch.where(live, w * (logits.argmax(-1) == targets).to(dtype), 0.0)
    return loss, correct, torch.where(live, lse, 0.0)


def reference_backward(dloss: Tensor, logits: Tensor, targets: Tensor, weights: Tensor, lse: Tensor) -> Tensor:
    """dlogits_i = w_i dloss_i (softmax(logits_i) - onehot(t_i)), 0 where w_i = 0, in logits' dtype."""
    dtype = torch.promote_types(logits.dtype, torch.float32)
    softmax = torch.exp(logits.to(dtype) - lse.to(dtype)[:, None])
    onehot = torch.arange(logits.shape[-1], device=logits.device) == targets[:, None]
    scale = (weights.to(dtype) * dloss.to(dtype))[:, None]
    grad = torch.where((weights != 0)[:, None], scale * (softmax - onehot.to(dtype)), 0.0)
    return grad.to(logits.dtype)


# ---------------------------------------------------------------- the Triton kernels (CUDA; CPU interpreter)


def _define(jit: Any, tl: Any) -> Any:
    """The kernels, built by `triton_support.define_kernels` at first use. V is a constexpr: one vocabulary a
    model, so one compilation, and a loop the compiler knows the length of."""

    @jit
    def bertkit_mlm_loss_forward(Logits, Targets, Weights, Loss, Correct, Lse, V: tl.constexpr, BLOCK_V: tl.constexpr):
        row = tl.program_id(0)
        w = tl.load(Weights + row)
        if w == 0.0:  # a padding entry: its logits are not read
            tl.store(Loss + row, 0.0)
            tl.store(Correct + row, 0.0)
            tl.store(Lse + row, 0.0)
            return
        base = Logits + row.to(tl.int64) * V  # int64: M * V passes 2**31 at BERT's sizes
        running_max = float("-inf")
        running_sum = 0.0
        first_argmax = 0
        for start in range(0, V, BLOCK_V):
            cols = start + tl.arange(0, BLOCK_V)
            x = tl.load(base + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
            block_max = tl.max(x, axis=0)
            # strictly greater: an equal maximum in a later block leaves the first one (as torch.argmax)
            first_argmax = tl.where(block_max > running_max, start + tl.argmax(x, axis=0, tie_break_left=True),
                                    first_argmax)
            new_max = tl.maximum(running_max, block_max)
            running_sum = running_sum * tl.exp(running_max - new_max) + tl.sum(tl.exp(x - new_max), axis=0)
            running_max = new_max
        lse = running_max + tl.log(running_sum)
        target = tl.load(Targets + row)
        valid = (target >= 0) & (target < V)
        target_logit = tl.load(base + target, mask=valid, other=0.0).to(tl.float32)
        tl.store(Loss + row, w * (lse - target_logit))
        tl.store(Correct + row, w * (first_argmax == target).to(tl.float32))
        tl.store(Lse + row, lse)

    @jit
    def bertkit_mlm_loss_backward(DLoss, Logits, Targets, Weights, Lse, DLogits, V: tl.constexpr,
                                  BLOCK_V: tl.constexpr):
        row = tl.program_id(0)
        w = tl.load(Weights + row)
        offset = row.to(tl.int64) * V
        if w == 0.0:  # a padding entry: a zero gradient, its logits not read
            for start in range(0, V, BLOCK_V):
                cols = start + tl.arange(0, BLOCK_V)
                tl.store(DLogits + offset + cols, tl.zeros((BLOCK_V,), dtype=DLogits.dtype.element_ty),
                         mask=cols < V)
            return
        scale = w * tl.load(DLoss + row)
        lse = tl.load(Lse + row)
        target = tl.load(Targets + row)
        for start in range(0, V, BLOCK_V):
            cols = start + tl.arange(0, BLOCK_V)
            x = tl.load(Logits + offset + cols, mask=cols < V, other=0.0).to(tl.float32)
            grad = scale * (tl.exp(x - lse) - tl.where(cols == target, 1.0, 0.0))
            tl.store(DLogits + offset + cols, grad.to(DLogits.dtype.element_ty), mask=cols < V)

    return SimpleNamespace(forward=bertkit_mlm_loss_forward, backward=bertkit_mlm_loss_backward)


@functools.cache
def kernels() -> Any:
    """The jit kernels (forward, backward), interpreted (TRITON_INTERPRET=1) or compiled, defined at first use."""
    return triton_support.define_kernels(_define)


def launch_forward(logits: Tensor, targets: Tensor, weights: Tensor, loss: Tensor, correct: Tensor,
                   lse: Tensor) -> None:
    """The Triton forward on contiguous (M, V) logits, (M,) int64 targets and fp32 weights, written in place
    into (M,) fp32 loss, correct and lse."""
    rows, v = logits.shape
    if rows == 0:
        return
    config = launch_config(v)
    with triton_support.device_guard(logits.device):
        kernels().forward[(rows,)](logits, targets, weights, loss, correct, lse, V=v, BLOCK_V=config.block_v,
                                    num_warps=config.num_warps)


def launch_backward(dloss: Tensor, logits: Tensor, targets: Tensor, weights: Tensor, lse: Tensor,
                    dlogits: Tensor) -> None:
    """The Triton backward on contiguous tensors, written in place into (M, V) dlogits."""
    rows, v = logits.shape
    if rows == 0:
        return
    config = launch_config(v)
    with triton_support.device_guard(logits.device):
        kernels().backward[(rows,)](dloss, logits, targets, weights, lse, dlogits, V=v, BLOCK_V=config.block_v,
                                     num_warps=config.num_warps)


# ---------------------------------------------------------------- the ops


def _uses_triton(logits: Tensor) -> bool:
    """The CUDA kernel runs Triton where it can: Triton present, a recent GPU, fp32/fp16/bf16 logits."""
    return triton_support.available(logits.device) and logits.dtype in TRITON_DTYPES


@torch.library.custom_op("bertkit::masked_lm_loss_fwd", mutates_args=())
def _forward_op(logits: Tensor, targets: Tensor, weights: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    return reference_forward(logits, targets, weights)


@_forward_op.register_kernel("cuda")
def _forward_cuda(logits: Tensor, targets: Tensor, weights: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    if not _uses_triton(logits):
        return reference_forward(logits, targets, weights)
    rows = logits.shape[0]
    loss, correct, lse = (torch.empty(rows, dtype=torch.float32, device=logits.device) for _ in range(3))
    launch_forward(logits.contiguous(), targets.to(torch.int64).contiguous(),
                   weights.to(torch.float32).contiguous(), loss, correct, lse)
    return loss, correct, lse


@_forward_op.register_fake
def _forward_fake(logits: Tensor, targets: Tensor, weights: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    rows, dtype = logits.shape[:1], torch.promote_types(logits.dtype, torch.float32)
    return (logits.new_empty(rows, dtype=dtype), logits.new_empty(rows, dtype=dtype),
            logits.new_empty(rows, dtype=dtype))


@torch.library.custom_op("bertkit::masked_lm_loss_bwd", mutates_args=())
def _backward_op(dloss: Tensor, logits: Tensor, targets: Tensor, weights: Tensor, lse: Tensor) -> Tensor:
    return reference_backward(dloss, logits, targets, weights, lse)


@_backward_op.register_kernel("cuda")
def _backward_cuda(dloss: Tensor, logits: Tensor, targets: Tensor, weights: Tensor, lse: Tensor) -> Tensor:
    if not (_uses_triton(logits) and lse.dtype == torch.float32):
        return reference_backward(dloss, logits, targets, weights, lse)
    logits = logits.contiguous()
    dlogits = torch.empty_like(logits)
    launch_backward(dloss.to(torch.float32).contiguous(), logits, targets.to(torch.int64).contiguous(),
                    weights.to(torch.float32).contiguous(), lse.contiguous(), dlogits)
    return dlogits


@_backward_op.register_fake
def _backward_fake(dloss: Tensor, logits: Tensor, targets: Tensor, weights: Tensor, lse: Tensor) -> Tensor:
    return torch.empty_like(logits)


def _setup_context(ctx: Any, inputs: tuple[Tensor, Tensor, Tensor], output: tuple[Tensor, Tensor, Tensor]) -> None:
    logits, targets, weights = inputs
    _, correct, lse = output
    ctx.save_for_backward(logits, targets, weights, lse)
    ctx.mark_non_differentiable(correct, lse)
    ctx.set_materialize_grads(False)  # no zero-filled gradients for them


def _backward(ctx: Any, dloss: Tensor | None, *_: Tensor | None) -> tuple[Tensor | None, None, None]:
    if dloss is None:  # the loss unused (grads are not materialized)
        return None, None, None
    logits, targets, weights, lse = ctx.saved_tensors
    return _backward_op(dloss, logits, targets, weights, lse), None, None


_forward_op.register_autograd(_backward, setup_context=_setup_context)


def masked_lm_loss(logits: Tensor, targets: Tensor, weights: Tensor) -> tuple[Tensor, Tensor]:
    """(loss_sum, correct_sum), fp32 0-d: sum_i w_i (logsumexp(logits_i) - logits_i[t_i]) and
    sum_i w_i [argmax logits_i == t_i] (the first maximum, as torch.argmax).

    logits (M, V) bf16/fp16/fp32, targets (M,) int64 in [0, V) where the weight is not 0, weights (M,) fp32
    (0 for padding entries). Only loss_sum has a gradient: w_i g (softmax(logits_i) - onehot(t_i)), in
    logits' dtype."""
    if logits.dim() != 2 or targets.shape != logits.shape[:1] or weights.shape != logits.shape[:1]:
        raise ValueError(f"expected logits (M, V), targets (M,), weights (M,); got {tuple(logits.shape)}, "
                         f"{tuple(targets.shape)}, {tuple(weights.shape)}")
    loss, correct, _ = _forward_op(logits, targets, weights)
    return loss.sum(), correct.sum()
