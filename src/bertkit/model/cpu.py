"""Faster kernels for inference on a CPU: oneDNN dense layers with prepacked weights, and bmm attention.

Design decision: at inference on a CPU, each of the encoder's dense layers is one oneDNN call
(`torch.ops.mkldnn._linear_pointwise`, the kernel torch.compile's CPU backend emits) instead of
`F.linear` followed by separate passes for GELU or the residual add:

- fp32: `F.linear` runs on MKL's sgemm, which on AMD CPUs does not use AVX-512; oneDNN does.
  Measured on a 2-core AMD EPYC (avx512_bf16), bert-base shapes, 1,100 rows: 0.17-0.19 TFLOP/s for
  `F.linear` + GELU against 0.40-0.41 for the fused oneDNN call.
- bf16: both use oneDNN, but `F.linear` hands over a plain weight that oneDNN reorders into its
  blocked layout on every call; a weight packed once saves that (0.65 -> 0.83 TFLOP/s with GELU fused).
- GELU (exact erf, or tanh) and ReLU are applied in the GEMM's epilogue, and the residual add too,
  so the (N, 4D) intermediate and the sum are not written and read again.

The packed weight is cached per `nn.Linear` and rebuilt whenever the weight changes: in-place
updates and `load_state_dict` bump its version, `.to(dtype)` and new Parameters give it other memory,
and any training or autograd forward drops it (an optimizer step may follow; fused optimizers do not
bump versions). So training and inference can interleave. Writes PyTorch does not count (through
`.data` or a numpy view) need `forget_all()`. It is a second copy of the dense weights (about 170 MB
for bert-base in bf16). Layers with hooks (pruning, parametrizations) keep the eager path.

Which of these fast paths run is measured, not fixed: `bertkit.hardware` times oneDNN with a packed
weight against `F.linear`, and batched-matmul attention (`hardware.bmm_attention`) against PyTorch's
SDPA at lengths 32-512, per dtype, at the model's width, once per machine (cached), and a fast path is
taken only where it measured faster. On the 2-core AMD EPYC above, bmm attention won in bf16 at
about 49-192 tokens (12 heads of 64, per call: 64 tokens 124 vs 89 us, 128 tokens 404 vs 219 us,
32 x 128 tokens 13.9 vs 7.2 ms) and the packed weight won in both dtypes; on an Intel CPU, where MKL
uses AVX-512 for fp32, the packed fp32 path may not win, and then `F.linear` runs.

Under bf16 autocast (evaluation during training, `bertkit predict`) the layers compute in bf16 as
autocast would, from a bf16 packed copy of the weights. Training, other autocast dtypes, CUDA,
tracing (ONNX export) and torch.compile keep the eager path, which gives the same numbers within
rounding. `BERTKIT_CPU_KERNELS=0` in the environment, or `with cpu.disabled():` (process-wide,
all threads), turns all of this off.
"""

from __future__ import annotations

import contextlib
import functools
import os
import weakref
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from bertkit import hardware
from bertkit.hardware import bmm_attention as bmm_attention  # re-exported: the kernel bert.py calls

# hidden_act -> (oneDNN post-op, algorithm)
POST_OPS = {
    "gelu": ("gelu", "none"),  # exact erf GELU
    "gelu_new": ("gelu", "tanh"),
    "gelu_pytorch_tanh": ("gelu", "tanh"),
    "relu": ("relu", ""),
}
DTYPES = (torch.float32, torch.bfloat16)

_enabled = os.environ.get("BERTKIT_CPU_KERNELS", "1") != "0"
# nn.Linear -> {compute dtype: (the weight it was packed from, its version then, packed weight)}
_packed: weakref.WeakKeyDictionary[nn.Linear, dict[torch.dtype, tuple[torch.Tensor, int, torch.Tensor]]] = (
    weakref.WeakKeyDictionary())


@functools.cache
def _onednn_works(dtype: torch.dtype) -> bool:
    """Whether this PyTorch build runs the oneDNN kernels in `dtype` and gets F.linear's numbers: probed
    once on a tiny layer, so a build or CPU without them quietly keeps the eager path."""
    try:
        with torch.autocast("cpu", enabled=False), torch.no_grad():
            return _probe(dtype)
    except (AttributeError, RuntimeError, NotImplementedError):
        return False


def _probe(dtype: torch.dtype) -> bool:
    generator = torch.Generator().manual_seed(0)
    x, weight, bias, other = (torch.randn(shape, generator=generator).to(dtype) for shape in
                              ((3, 16), (8, 16), (8,), (3, 8)))
    packed = torch.ops.mkldnn._reorder_linear_weight(weight)
    fused = torch.ops.mkldnn._linear_pointwise(x, packed, bias, "gelu", [], "none")
    added = torch.ops.mkldnn._linear_pointwise.binary(x, other, packed, bias, "add")
    expected = F.linear(x.float(), weight.float(), bias.float())
    tolerance = 1e-4 if dtype == torch.float32 else 0.1
    return (torch.allclose(fused.float(), F.gelu(expected), atol=tolerance, rtol=tolerance)
            and torch.allclose(added.float(), expected + other.float(), atol=tolerance, rtol=tolerance))


def _inference(x: torch.Tensor) -> bool:
    """CPU tensor, fp32 or bf16, no autograd, no autocast other than bf16, not traced or compiled, not
    switched off."""
    return (_enabled and x.device.type == "cpu" and x.dtype in DTYPES and not torch.is_grad_enabled()
            and (not torch.is_autocast_enabled("cpu") or torch.get_autocast_dtype("cpu") == torch.bfloat16)
            and not torch.jit.is_tracing() and not torch.compiler.is_compiling())


def linear_applies(x: torch.Tensor, layer: nn.Linear, activation: str | None = None) -> bool:
    """Whether `linear` can run this input and is faster here: the weight has the input's dtype, or bf16
    autocast is on; the layer is a plain nn.Linear without hooks (pruning or parametrizations compute the
    weight in them); and the probe measured the packed weight faster than F.linear in that dtype at the
    layer's width (the smaller of its sizes: the model's hidden size for every encoder layer)."""
    autocast = torch.is_autocast_enabled("cpu")
    dtype = torch.bfloat16 if autocast else x.dtype
    return (_inference(x) and (activation is None or activation in POST_OPS) and _plain(layer)
            and (layer.weight.dtype == x.dtype or (autocast and layer.weight.dtype in DTYPES))
            and _onednn_works(dtype)
            and hardware.choices(min(layer.in_features, layer.out_features)).packed(dtype))


def _plain(layer: nn.Module) -> bool:
    module_hooks = torch.nn.modules.module
    return (type(layer) is nn.Linear and not layer._forward_hooks and not layer._forward_pre_hooks
            and not module_hooks._global_forward_hooks and not module_hooks._global_forward_pre_hooks)


def linear(x: torch.Tensor, layer: nn.Linear, activation: str | None = None,
           residual: torch.Tensor | None = None) -> torch.Tensor:
    """activation(layer(x)), or residual + layer(x): (..., in) -> (..., out), in one oneDNN call.

    Under bf16 autocast it computes in bf16 like autocast's `F.linear`, and an fp32 residual is added
    outside the call, so the sum is fp32 as in eager autocast."""
    if activation is not None and residual is not None:
        raise ValueError("cpu.linear takes an activation or a residual, not both")
    dtype = torch.bfloat16 if torch.is_autocast_enabled("cpu") else x.dtype
    weight = _packed_weight(layer, dtype)
    x = x.to(dtype)
    bias = None if layer.bias is None else layer.bias.to(dtype)
    if residual is not None and residual.dtype == dtype:
        return torch.ops.mkldnn._linear_pointwise.binary(x, residual, weight, bias, "add")
    post_op, algorithm = POST_OPS[activation] if activation is not None else ("none", "")
    y = torch.ops.mkldnn._linear_pointwise(x, weight, bias, post_op, [], algorithm)
    return y if residual is None else residual + y


def _packed_weight(layer: nn.Linear, dtype: torch.dtype) -> torch.Tensor:
    """The cached packed weight in `dtype`, repacked if the weight changed: in place (an optimizer step,
    `load_state_dict`) bumps its version; `.to()`, `param.data = ...` or a new Parameter give it other
    memory. Holding the packed-from tensor keeps its memory allocated, so new values cannot reuse its
    address unnoticed."""
    weight = layer.weight
    if weight.is_inference():  # made under torch.inference_mode: no version counter, so no cache
        return torch.ops.mkldnn._reorder_linear_weight(weight.to(dtype))
    per_dtype = _packed.setdefault(layer, {})
    cached = per_dtype.get(dtype)
    if cached is None or not _current(cached, weight):
        for other in [d for d, entry in per_dtype.items() if not _current(entry, weight)]:
            del per_dtype[other]  # e.g. the fp32 packing after `.to(torch.bfloat16)`: free it
        source = weight.detach()
        cached = (source, weight._version, torch.ops.mkldnn._reorder_linear_weight(source.to(dtype)))
        per_dtype[dtype] = cached
    return cached[2]


def _current(entry: tuple[torch.Tensor, int, torch.Tensor], weight: torch.Tensor) -> bool:
    source, version, _ = entry
    return (source.data_ptr() == weight.data_ptr() and source.dtype == weight.dtype
            and source.shape == weight.shape and version == weight._version)


def forget(layer: nn.Linear) -> None:
    """Drop the layer's packed weights. Called on every training or autograd forward, since an
    optimizer step may follow, and PyTorch's fused optimizers do not bump the weights' version."""
    _packed.pop(layer, None)


def forget_all() -> None:
    """Drop every packed weight: needed after changing weights in a way PyTorch does not count (writes
    through `.data` or a numpy view) between two inference calls without a training forward."""
    _packed.clear()


def bmm_attention_applies(q: torch.Tensor, mask: torch.Tensor | None, dropout_p: float) -> bool:
    """For (B, A, T, Dh) queries with no mask and no dropout, of a dtype and length where the probe
    measured `bmm_attention` faster than SDPA at this width (A * Dh)."""
    return (mask is None and dropout_p == 0.0 and _inference(q)
            and hardware.choices(q.shape[1] * q.shape[3]).bmm(q.dtype, q.shape[2]))


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """Run the eager PyTorch path inside this block (e.g. to compare the two)."""
    global _enabled
    previous, _enabled = _enabled, False
    try:
        yield
    finally:
        _enabled = previous
