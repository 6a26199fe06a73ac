"""Attention backends: how multi-head self-attention runs, each one a small named object.

Design decision: attention is what BERT computes the same way everywhere, softmax(q k^T / sqrt(Dh)) v
over each sequence's real tokens, but the fastest way to run it depends on the device, the dtype,
whether attention dropout is on and on measurements of this machine. So each way is a backend with one
call, `backend(qkv, layout, num_heads, dropout_p) -> context` (packed Q|K|V in, the heads' outputs
before the output projection out). A model's default backend is `Dispatch`, which picks one of the others
per forward pass from what that pass is given alone (device, compute dtype, padding, dropout, autograd):
no probe, no environment variable, no cache file is read inside a forward. The measured CPU kernel
(`CpuBmm`) is installed from outside by whoever builds the run: `accelerate_for_inference`
(model/accelerate.py) probes once and sets `Dispatch(choices)`; `model.bert.attention = PaddedSDPA()`
fixes one backend instead (torch.compile and ONNX export do). A backend with `unpadded = True` gets the
(N, 3D) real tokens and their `Unpadded` layout; the others get the (B, T, 3D) padded batch and a
(B, 1, 1, T) key-padding mask, or None when nothing is padded. Any mask works (left, right or interior
padding, an all-padding row), and all give the same numbers and gradients at real positions, within
rounding (tests/model/test_attention.py).

What runs where (why, with the measurements behind each choice: docs/performance.md, "Attention backends"):

- CPU, padded batch: `PerSequence`, one SDPA call per sequence on its own slice of the packed tokens, no
  padding and no gathers; measured fastest on CPUs for inference.
- CPU training (a backward will run: the embeddings require gradients): `BatchedBmm`, two batched matrix
  multiplies over the padded batch with its key mask, on batches with at least the dispatch's gate of real tokens
  (the dense layers then run on the padding too; the gate is measured on the run's step by the training workflows,
  else MIN_BMM_FILL), at the dtypes and lengths where the probe measured its
  forward + backward at least 1.1x faster than SDPA's (SDPA's CPU backward is slow in bf16 at short lengths),
  measured without attention dropout (the short recipe's) and with it (fine-tuning's 0.1: bmm's mask is the
  counter-based one of `bertkit.kernels.dropout`, torch's own costing about what bmm saved); SDPA (`PerSequence`,
  or on the whole batch) elsewhere. Installed with the measured choices by the training workflows
  (`bertkit.workflows.prepare.prepare_training`).
- CPU inference copies (no autograd, no dropout): `CpuBmm` inside, two batched matrix multiplies instead
  of SDPA at the dtypes and lengths where `bertkit.runtime.probe` measured them at least 1.1x faster on the
  machine that runs. Only a `Dispatch` given those choices runs it (`accelerate_for_inference`, which leaves
  them out under `BERTKIT_CPU_KERNELS=0`).
- CUDA, padded batch, bf16/fp16: `VarlenFlash`, flash attention over the packed tokens with cumulative
  sequence lengths (`torch.nn.attention.varlen.varlen_attn`; in training with attention dropout, the same
  kernels with their dropout, `kernels.attention.flash_varlen`).
- CUDA, fp32: `RepaddedSDPA`, SDPA on the batch padded back for attention alone, one kernel launch rather
  than one per sequence. On a CPU under torch.compile too (PerSequence's loop would split the graph).
- Nothing padded: `PaddedSDPA` (or `CpuBmm`) on the whole batch in one call.

Reference: torch.nn.functional.scaled_dot_product_attention; mosaicml/examples bert_padding.py.
Shape legend: B batch, T sequence length, N real tokens, D hidden size, A heads, Dh head size.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Generic, Protocol, TypeVar, cast

import torch
import torch.nn.functional as F

from bertkit.kernels import attention as kernels
from bertkit.model.padding import Unpadded

MIN_BMM_FILL = 0.875
"""The least share of real tokens in a batch for which training runs `BatchedBmm` unless the run measured its own
gate (`bertkit.workflows.fill_gate`): the least full batch the attention probe times it on (two rows, one a quarter
padding). It runs every layer on the padded batch, so a batch far emptier pays
for its padding in the dense layers: a bert-mini step at 55% fill measured 15-17% slower than SDPA over the real
tokens (docs/performance.md, "Attention backends on the CPU")."""

Layout = TypeVar("Layout", contravariant=True)
"""What a backend takes beside qkv: an `Unpadded` layout, or a key-padding mask (or None)."""


class Attention(Generic[Layout]):
    """The interface: `backend(qkv, layout, num_heads, dropout_p)`, self-attention of packed q|k|v up to
    (not including) the output projection: (N, 3D) -> (N, D) with an `Unpadded` layout when `unpadded`,
    else (B, T, 3D) -> (B, T, D) with a (B, 1, 1, T) bool key-padding mask or None. Backends hold no
    weights, so they are plain objects, not modules: they never show in a state_dict."""

    unpadded = False

    def __call__(self, qkv: torch.Tensor, layout: Layout, num_heads: int, dropout_p: float) -> torch.Tensor:
        raise NotImplementedError(type(self).__name__)

    def select(self, x: torch.Tensor, padded: bool, dropout_p: float, fill: float = 1.0) -> Attention:
        """The backend that runs a forward pass over embeddings `x` (B, T, D), `fill` the share of its positions
        that are real tokens: a backend runs itself (`Dispatch` picks one)."""
        return self

    def __repr__(self) -> str:
        inner = getattr(self, "inner", None)
        return f"{type(self).__name__}({inner!r})" if inner is not None else f"{type(self).__name__}()"


class PaddedSDPA(Attention[torch.Tensor | None]):
    """PyTorch's SDPA on the padded batch; padded keys are masked out."""

    def __call__(self, qkv: torch.Tensor, mask: torch.Tensor | None, num_heads: int, dropout_p: float) -> torch.Tensor:
        batch, seq_len, three_d = qkv.shape
        head_size = three_d // (3 * num_heads)
        q, k, v = qkv.view(batch, seq_len, 3, num_heads, head_size).permute(2, 0, 3, 1, 4)  # 3 x (B, A, T, Dh)
        context = self.kernel(q, k, v, mask, dropout_p)  # (B, A, T, Dh)
        return context.transpose(1, 2).reshape(batch, seq_len, three_d // 3)  # (B, T, A, Dh) -> (B, T, D)

    def kernel(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
               dropout_p: float) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)


class AttentionProbes(PaddedSDPA):
    """Softmax attention written out on the padded batch, keeping every layer's attention distributions (B, A, T, T),
    taken before dropout, in `probabilities` (in layer order), for an objective that reads them (distillation's
    attention loss). Slower than SDPA, so it is installed only around the forward passes that are read
    (`recording_attention`)."""

    def __init__(self) -> None:
        self.probabilities: list[torch.Tensor] = []

    def kernel(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
               dropout_p: float) -> torch.Tensor:
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])  # (B, A, T, T)
        if mask is not None:  # (B, 1, 1, T): padded keys get no weight
            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        probabilities = scores.softmax(-1)
        self.probabilities.append(probabilities)
        return F.dropout(probabilities, dropout_p, training=dropout_p > 0) @ v  # (B, A, T, Dh)


@contextlib.contextmanager
def recording_attention(bert: torch.nn.Module) -> Iterator[AttentionProbes]:
    """`bert` (a BertModel) attending through `AttentionProbes` inside the block, its own backend again after."""
    kept, probes = bert.attention, AttentionProbes()
    setattr(bert, "attention", probes)  # noqa: B010 - a plain attribute (backends are not modules)
    try:
        yield probes
    finally:
        setattr(bert, "attention", kept)  # noqa: B010


class MeasuredChoices(Protocol):
    """What the machine's probe measured of attention (`bertkit.runtime.probe.Choices`), as the backends ask it."""

    def bmm(self, dtype: torch.dtype, length: int) -> bool:
        """Whether batched-matmul attention beat SDPA in `dtype` near `length` tokens."""
        ...

    def bmm_anywhere(self, dtype: torch.dtype) -> bool:
        """Whether it beat SDPA in `dtype` at any probed length."""
        ...

    def bmm_for_training(self, dtype: torch.dtype, length: int, dropout: bool = False) -> bool:
        """Whether its forward + backward beat SDPA's in `dtype` near `length` tokens, without attention dropout or
        with it."""
        ...


class CpuBmm(PaddedSDPA):
    """`kernels.bmm_attention` (two batched matmuls) where the probe measured it faster than SDPA for the
    dtype and length (`choices`), SDPA elsewhere and whenever there is a mask or dropout."""

    def __init__(self, choices: MeasuredChoices) -> None:
        self.choices = choices

    def kernel(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
               dropout_p: float) -> torch.Tensor:
        if mask is None and dropout_p == 0.0 and self.choices.bmm(q.dtype, q.shape[2]):
            return kernels.bmm_attention(q, k, v)
        return super().kernel(q, k, v, mask, dropout_p)


class BatchedBmm(PaddedSDPA):
    """`kernels.bmm_attention` on the whole padded batch, with its key mask and attention dropout: what training
    on a CPU runs where the probe measured its forward + backward faster than SDPA's."""

    def kernel(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
               dropout_p: float) -> torch.Tensor:
        return kernels.bmm_attention(q, k, v, mask, dropout_p)


class PerSequence(Attention[Unpadded]):
    """`inner` (PaddedSDPA or CpuBmm) on each sequence's own tokens, one call per sequence."""

    unpadded = True

    def __init__(self, inner: PaddedSDPA | None = None) -> None:
        self.inner = inner if inner is not None else PaddedSDPA()

    def __call__(self, qkv: torch.Tensor, layout: Unpadded, num_heads: int, dropout_p: float) -> torch.Tensor:
        # split, not one slice per sequence: in backward, split joins the gradients with one cat, where
        # each slice would scatter its gradient into a zero-filled (N, 3D) tensor and those would be summed
        contexts = [self.inner(piece.unsqueeze(0), None, num_heads, dropout_p).squeeze(0)  # (t, 3D) -> (t, D)
                    for piece in qkv.split(layout.split_sizes)]
        return torch.cat(contexts)  # (N, D)


class RepaddedSDPA(Attention[Unpadded]):
    """SDPA on the batch padded back to (B, T, 3D) for attention alone, the tokens where they were, with
    the layout's own key mask (so left or interior padding is masked too). An empty row attends to its
    zero padding rather than to nothing (some kernels give NaN for a row with every key masked, in
    backward too); its outputs are dropped again by the unpad."""

    unpadded = True

    def __init__(self) -> None:
        self.inner = PaddedSDPA()

    def __call__(self, qkv: torch.Tensor, layout: Unpadded, num_heads: int, dropout_p: float) -> torch.Tensor:
        keys = layout.mask | (layout.lengths == 0)[:, None]  # (B, T)
        context = self.inner(layout.pad(qkv), keys[:, None, None, :], num_heads, dropout_p)  # (B, T, D)
        return layout.unpad(context)  # (N, D)


class VarlenFlash(Attention[Unpadded]):
    """CUDA flash attention over the packed tokens, sequences delimited by cumulative lengths (bf16/fp16):
    `varlen_attn` without dropout, `kernels.flash_varlen` (the same kernels) with attention dropout."""

    unpadded = True

    def __call__(self, qkv: torch.Tensor, layout: Unpadded, num_heads: int, dropout_p: float) -> torch.Tensor:
        from torch.nn.attention.varlen import varlen_attn  # noqa: PLC0415 - CUDA only

        tokens, three_d = qkv.shape
        q, k, v = qkv.view(tokens, 3, num_heads, three_d // (3 * num_heads)).unbind(1)  # 3 x (N, A, Dh)
        cu, longest = layout.cu_seqlens, layout.longest
        if dropout_p:
            context = kernels.flash_varlen(q, k, v, cu, longest, dropout_p)
        else:
            context = cast(torch.Tensor, varlen_attn(q, k, v, cu, cu, longest, longest))  # a tuple with return_aux
        return context.reshape(tokens, three_d // 3)  # (N, A, Dh) -> (N, D)


class Dispatch(Attention[None]):
    """Every model's default backend: picks one of the others for each forward pass from what the pass is
    given (the device, the dtype the layers compute in, whether anything is padded and the share of real
    tokens, attention dropout, whether a backward will run through it) and nothing else, so a forward reads no
    environment, runs no probe and writes no file. `cpu` holds CPU choices measured once by whoever built the run
    (`accelerate_for_inference`, `prepare_training`): `CpuBmm` (inference) or `BatchedBmm` (gradients on)
    runs where they won; without them, SDPA."""

    def __init__(self, cpu: MeasuredChoices | None = None, min_bmm_fill: float | None = None) -> None:
        self.cpu = cpu
        # the least share of real tokens in a batch that training runs BatchedBmm on: the gate measured on the
        # run's own step (bertkit.workflows.fill_gate), else MIN_BMM_FILL
        self.min_bmm_fill = MIN_BMM_FILL if min_bmm_fill is None else min_bmm_fill

    def __call__(self, qkv: torch.Tensor, layout: None, num_heads: int, dropout_p: float) -> torch.Tensor:
        raise TypeError("Dispatch runs nothing itself: BertModel asks it to select() a backend per forward")

    def select(self, x: torch.Tensor, padded: bool, dropout_p: float, fill: float = 1.0) -> Attention:
        device = x.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype
        if device == "cuda":
            if not padded:
                return PaddedSDPA()
            return VarlenFlash() if dtype in (torch.float16, torch.bfloat16) else RepaddedSDPA()
        backward = x.requires_grad and torch.is_grad_enabled()  # a backward will run through this pass
        # with dropout bmm was measured with the counter-based masks, which a compiled graph replaces by torch's
        measured_dropout = dropout_p > 0.0 and not torch.compiler.is_compiling()
        if self.cpu is not None and device == "cpu" and backward and (dropout_p == 0.0 or measured_dropout) \
                and fill >= self.min_bmm_fill and self.cpu.bmm_for_training(dtype, x.shape[1], dropout_p > 0.0):
            return BatchedBmm()  # the padded batch in one call, its key mask in the kernel
        batched = (None if backward else self._measured(x, dtype, dropout_p)) or PaddedSDPA()
        if padded and torch.compiler.is_compiling():  # PerSequence's Python loop over sequences would split the graph
            return RepaddedSDPA()
        return PerSequence(batched) if padded else batched

    def _measured(self, x: torch.Tensor, dtype: torch.dtype, dropout_p: float) -> CpuBmm | None:
        """CpuBmm for CPU inference (no backward) in a dtype where the measured bmm attention won at some length
        (it was timed without dropout; CpuBmm still checks each call's length), else None."""
        if self.cpu is None or x.device.type != "cpu" or dropout_p != 0.0:
            return None
        return CpuBmm(self.cpu) if self.cpu.bmm_anywhere(dtype) else None

    def __repr__(self) -> str:
        if self.cpu is None:
            return "Dispatch()"
        gate = "" if self.min_bmm_fill == MIN_BMM_FILL else f", bmm from fill {self.min_bmm_fill:g}"
        return f"Dispatch(measured{gate})"
