"""The attention and dropout parts of the hardware probe (`bertkit.runtime.probe.measure` calls them): SDPA against
two batched matrix multiplies (`bertkit.kernels.attention.bmm_attention`) at a few sequence lengths, for inference
(forward, one call per sequence, as the padding-free encoder makes them) and for training (forward + backward over
padded rows, as `bertkit.model.attention.BatchedBmm` runs them against `PerSequence`'s SDPA; without attention
dropout and with BERT's 0.1); and torch's dropout against the counter-based one (`bertkit.kernels.dropout`).
Times in microseconds; the probe decides from them (`probe.decide`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F

from bertkit.kernels.attention import bmm_attention
from bertkit.kernels.dropout import dropout

DROPOUT_P = 0.1
"""The dropout probability the probe times with: BERT's, what fine-tuning and the paper's recipe run."""
DROPOUT_ROWS = 16
"""The dropout probe's tensor is (DROPOUT_ROWS x tokens, width): a micro-batch's hidden states, not one row's."""

ATTENTION_LENGTHS = (32, 64, 128, 256, 512)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
Times = dict[str, list[tuple[int, float, float]]]
"""precision -> [(length, SDPA microseconds, bmm microseconds)]."""
Fastest = Callable[[dict[str, Callable[[], object]]], tuple[dict[str, float], bool]]
"""The probe's timer: candidates -> (best seconds of each, whether they were steady)."""


def attention_times(width: int, generator: torch.Generator, tokens: int, fastest: Fastest) -> Times:
    """SDPA and bmm attention over `tokens` tokens of sequences of each length, one call per sequence
    as the padding-free encoder makes them, on q, k, v laid out as the model has them (views into one
    packed Q|K|V)."""
    heads = width // 64
    times: Times = {}
    for p, dtype in DTYPES.items():
        times[p] = []
        for length in ATTENTION_LENGTHS:
            sequences = []
            for _ in range(max(1, tokens // length)):
                qkv = torch.randn(1, length, 3 * heads * 64, generator=generator).to(dtype)
                sequences.append(qkv.view(1, length, 3, heads, 64).permute(2, 0, 3, 1, 4))  # 3 x (1, A, T, 64)
            runs: dict[str, Callable[[], object]] = {
                "sdpa": lambda s=sequences: [F.scaled_dot_product_attention(*qkv) for qkv in s],  # type: ignore[misc]
                "bmm": lambda s=sequences: [bmm_attention(*qkv) for qkv in s]}  # type: ignore[misc]
            best, _ = fastest(runs)
            times[p].append((length, best.get("sdpa", 0.0) * 1e6, best.get("bmm", 0.0) * 1e6))
    return times


def attention_training_times(width: int, generator: torch.Generator, tokens: int, fastest: Fastest,
                             dropout_p: float = 0.0) -> Times:
    """Forward + backward of attention over at least two sequences of each length (`tokens` tokens when that is
    more), the last a quarter padding, attention dropout `dropout_p`, as training runs it: SDPA one call per
    sequence on its real tokens (`PerSequence`, SDPA's own dropout), or bmm once over the padded rows with their
    key mask (`BatchedBmm`, the counter-based dropout)."""
    heads = width // 64
    times: Times = {}
    for p, dtype in DTYPES.items():
        times[p] = []
        for length in ATTENTION_LENGTHS:
            rows = max(2, tokens // length)
            qkv = torch.randn(rows, length, 3 * heads * 64, generator=generator).to(dtype)
            grad = torch.randn(rows, heads, length, 64, generator=generator).to(dtype)
            real = [length] * (rows - 1) + [length - length // 4]
            mask = (torch.arange(length) < torch.tensor(real)[:, None])[:, None, None, :]  # (B, 1, 1, T)
            packed = torch.cat([qkv[i, :n] for i, n in enumerate(real)])  # (N, 3D): the real tokens
            packed_grad = torch.cat([grad[i, :, :n].transpose(0, 1).reshape(n, -1) for i, n in enumerate(real)])
            runs: dict[str, Callable[[], object]] = {
                "sdpa": functools.partial(_per_sequence_step, packed.requires_grad_(), real, packed_grad, heads,
                                          dropout_p),
                "bmm": functools.partial(_bmm_step, qkv.requires_grad_(), mask, grad, heads, dropout_p)}
            best, _ = fastest(runs)
            times[p].append((length, best.get("sdpa", 0.0) * 1e6, best.get("bmm", 0.0) * 1e6))
    return times


def _per_sequence_step(packed: torch.Tensor, real: list[int], grad: torch.Tensor, heads: int,
                       dropout_p: float) -> None:
    """`PerSequence`'s work: SDPA on each sequence's own slice of the packed tokens, split (one gradient join)."""
    contexts = []
    for piece in packed.split(real):  # (t, 3D)
        q, k, v = piece.view(1, len(piece), 3, heads, 64).permute(2, 0, 3, 1, 4)  # 3 x (1, A, t, 64)
        context = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)
        contexts.append(context.transpose(1, 2).reshape(len(piece), -1))
    (torch.cat(contexts) * grad).sum().backward()
    packed.grad = None


def _bmm_step(qkv: torch.Tensor, mask: torch.Tensor, grad: torch.Tensor, heads: int, dropout_p: float) -> None:
    rows, length, _ = qkv.shape
    q, k, v = qkv.view(rows, length, 3, heads, 64).permute(2, 0, 3, 1, 4)
    (bmm_attention(q, k, v, mask, dropout_p) * grad).sum().backward()
    qkv.grad = None


def dropout_times(width: int, generator: torch.Generator, tokens: int,
                  fastest: Fastest) -> dict[str, tuple[float, float]]:
    """precision -> (F.dropout, counter-based dropout) microseconds of forward + backward at DROPOUT_P over a
    (DROPOUT_ROWS x `tokens`, `width`) tensor, as the encoder's hidden-state dropouts run."""
    times = {}
    for p, dtype in DTYPES.items():
        x = torch.randn(DROPOUT_ROWS * tokens, width, generator=generator).to(dtype).requires_grad_()
        grad = torch.randn(DROPOUT_ROWS * tokens, width, generator=generator).to(dtype)
        runs: dict[str, Callable[[], object]] = {
            "torch": functools.partial(_dropout_step, F.dropout, x, grad),
            "counter": functools.partial(_dropout_step, dropout, x, grad)}
        best, _ = fastest(runs)
        times[p] = (best.get("torch", 0.0) * 1e6, best.get("counter", 0.0) * 1e6)
    return times


def _dropout_step(drop: Callable[[torch.Tensor, float], torch.Tensor], x: torch.Tensor, grad: torch.Tensor) -> None:
    drop(x, DROPOUT_P).backward(grad)
    x.grad = None
