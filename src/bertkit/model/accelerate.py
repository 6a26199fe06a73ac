"""Transforms that make a BERT model faster without changing what it computes, applied from outside.

- `accelerate_for_inference(model, precision)`: a copy for inference, its encoder dense layers swapped
  for frozen packed oneDNN modules (CPU, fp32/bf16, where measured faster) or dynamically quantized
  int8 ones, and its attention `Dispatch` given the measured CPU choices (bmm attention where it won);
  `for_inference(model, precision, device)` resolves `--precision auto` first and is what every
  inference command runs.
- `compile_model(model)`: torch.compile'd encoder layers, for training (`--compile`).
- `train_as_measured(model, choices)`: the model's own attention dispatch given the measured CPU choices, so
  training runs bmm attention where its forward + backward measured faster (on batches at least
  `attention.MIN_BMM_FILL` real tokens), and its dropout modules swapped for
  `MeasuredDropout`, whose CPU masks are counter-based where that measured faster (`bertkit.kernels.dropout`);
  the training workflows' `prepare_training` applies it, to the model itself (no copy: neither holds weights).

Design decision: the accelerated model is a copy and the kernels' state belongs to it. The copy shares
every tensor it does not replace with the original (no second copy of the weights, except those cast to
bf16), the packed weights are made once when it is built, and its swapped modules refuse training and
autograd. So there is nothing to invalidate: the original trains on as before, and whoever wants the
new weights after an optimizer step makes a new copy (fine-tuning does, at each evaluation).

Why packed oneDNN dense layers (`torch.ops.mkldnn._linear_pointwise`, the kernel torch.compile's CPU
backend emits) instead of `F.linear` followed by separate passes for GELU or the residual add:

- fp32: `F.linear` runs on MKL's sgemm, which on AMD CPUs does not use AVX-512; oneDNN does.
- bf16: both use oneDNN, but `F.linear` hands over a plain weight that oneDNN reorders into its
  blocked layout on every call; a weight packed once saves that.
  (What each measured on the machines we have: docs/performance.md, "What is done, and why".)
- GELU (exact erf, or tanh) and ReLU are applied in the GEMM's epilogue (the layer's `act` becomes
  nn.Identity), and the residual add too (`ResidualDense`), so the (N, 4D) intermediate and the sum
  are not written and read again.

Which dtypes are packed is measured, not fixed: `bertkit.runtime.probe` times oneDNN with a packed weight
against `F.linear` at the model's width, once per machine (cached), and a layer is packed only where
that measured at least 1.1x faster (on an Intel CPU, where MKL uses AVX-512 for fp32, the packed fp32
path may not win, and then `F.linear` runs). Layers with hooks (pruning, parametrizations) are left as
they are. `BERTKIT_CPU_KERNELS=0` in the environment turns packing (and bmm attention, attention.py) off.
The environment and the probe are read here, when the copy is built, never inside a forward: the model's
own forward decides from its inputs alone (model/attention.py, `Dispatch`).
"""

from __future__ import annotations

import copy
import functools
import itertools
import os
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from bertkit.kernels import int8
from bertkit.kernels.dropout import dropout as counter_dropout
from bertkit.model.attention import Dispatch, PaddedSDPA
from bertkit.model.bert import BertLayer, BertModel, ResidualDense
from bertkit.runtime import probe
from bertkit.runtime.device import inference_precision

DENSE_LAYERS = ("qkv", "attn_out", "ffn_in", "ffn_out")  # the encoder layer's nn.Linear modules
OUTLIERS = ".outliers"
"""In int8 smoothing, the key of a dense layer's outlier channels: "layers.3.ffn_in" + OUTLIERS."""


def for_inference(model: nn.Module, precision: str, device: torch.device = torch.device("cpu"),
                  smoothing: Callable[[], dict[str, torch.Tensor] | None] | None = None) -> nn.Module:
    """An inference copy of `model` (already on `device`) in an inference precision, 'auto' resolved by
    measurement (`bertkit.runtime.device.inference_precision`): `accelerate_for_inference`. What every inference
    command runs. `smoothing()` gives int8's SmoothQuant scales (bertkit.inference.smoothquant.int8_smoothing),
    asked only when the precision is int8."""
    resolved = inference_precision(precision, model, device)
    scales = smoothing() if smoothing is not None and resolved == "int8" else None
    return accelerate_for_inference(model, resolved, smoothing=scales)


def accelerate_for_inference(model: nn.Module, precision: str = "fp32", *, autocast: bool = False,
                             smoothing: dict[str, torch.Tensor] | None = None) -> nn.Module:
    """A copy of `model` in eval mode for inference in `precision`, the original untouched:

    - fp32 / bf16 (the model cast): on a CPU, each encoder layer's dense layers become `PackedLinear`
      modules, GELU and residual adds fused, where the probe measured them faster in that dtype;
      `autocast=True` (fp32 only): the copy will run under CPU bf16 autocast (evaluation inside a bf16
      training loop), so its dense layers compute in bf16 from bf16-packed weights, as autocast's
      F.linear would, and residual sums stay fp32;
    - int8: each encoder layer's dense layers dynamically quantized (`Int8Linear`: int8 weights per
      output channel, activations quantized per call); embeddings, LayerNorms, attention and the task
      head stay fp32. `smoothing` ("layers.<i>.<dense>" -> a scale per input channel;
      bertkit.inference.smoothquant) moves SmoothQuant's scales into those weights (a layer it has no scales
      for is not smoothed; scales of the wrong width are a ValueError), and its "layers.<i>.<dense>.outliers"
      (channel indices) are multiplied in fp32 beside the int8 product.

    The copy's attention is a `Dispatch` holding the CPU choices measured at the model's width (bmm
    attention where it won), unless the model had a fixed backend. The copy runs under torch.no_grad()
    or torch.inference_mode(). A compiled model (`compile_model`) or one with fused training kernels
    (`bertkit.model.fused`) runs eagerly in the copy, with the swapped modules and the measured `Dispatch`."""
    if precision not in ("fp32", "bf16", "int8"):
        raise ValueError(f"precision {precision!r}: use fp32, bf16 or int8 ('auto': for_inference)")
    if autocast and precision != "fp32":
        raise ValueError(f"autocast=True is for an fp32 model under bf16 autocast, not {precision}")
    if any(isinstance(m, _Frozen) for m in model.modules()):
        raise ValueError("this model is already accelerated for inference; accelerate the original")
    accelerated = _copy_sharing_tensors(model, torch.bfloat16 if precision == "bf16" else torch.float32)
    for bert in [m for m in accelerated.modules() if isinstance(m, BertModel)]:
        # a list, not a generator: every compiled or fused forward (bound to the original) must be popped
        replaced = [vars(module).pop("forward", None) for module in (bert.embeddings, *bert.layers)]
        vars(bert).pop("_bertkit_fused", None)  # bertkit.model.fused's mark: the copy runs the plain forwards
        if any(replaced) or isinstance(bert.attention, Dispatch):  # eager again: the padding-free dispatch
            bert.attention = measured_attention(bert)
    if smoothing is not None and precision != "int8":
        raise ValueError(f"smoothing is for int8, not {precision}")
    for index, layer in enumerate([m for m in accelerated.modules() if isinstance(m, BertLayer)]):
        if precision == "int8":
            # the scales of the first encoder's layers, by position (a model never holds two calibrated encoders)
            scales = smoothing or {}
            own = {name: f"layers.{index}.{name}" for name in DENSE_LAYERS}
            _quantize(layer, {name: scales[key] for name, key in own.items() if key in scales},
                      {name: scales[key + OUTLIERS] for name, key in own.items() if key + OUTLIERS in scales})
        else:
            _pack(layer, torch.bfloat16 if autocast else layer.qkv.weight.dtype)
    return accelerated.eval()


def measured_attention(bert: BertModel) -> Dispatch:
    """The default dispatch with this machine's CPU attention choices at the model's width, for a model
    on a CPU with the kernels on: the probe runs (or its cache is read) here, once, not in a forward."""
    if bert.embeddings.word.weight.device.type != "cpu" or not cpu_kernels_enabled():
        return Dispatch()
    return Dispatch(probe.choices(bert.config.hidden_size))


def train_as_measured(model: nn.Module, choices: probe.Choices) -> bool:
    """`attend_as_measured_for_training` and `drop_as_measured_for_training`: whether either changed anything."""
    attends = attend_as_measured_for_training(model, choices)
    return drop_as_measured_for_training(model, choices) or attends


class MeasuredDropout(nn.Dropout):
    """nn.Dropout whose masks on a CPU are counter-based (`kernels.dropout`) in the dtypes where the probe measured
    that faster (`choices.dropout_by_counter`); torch's elsewhere. Holds no state, so checkpoints are unchanged."""

    def __init__(self, p: float, choices: probe.Choices, inplace: bool = False) -> None:
        super().__init__(p, inplace)
        self.choices = choices

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and x.device.type == "cpu" and self.choices.dropout_by_counter(x.dtype):
            return counter_dropout(x, self.p)
        return super().forward(x)


def drop_as_measured_for_training(model: nn.Module, choices: probe.Choices) -> bool:
    """Swap each plain nn.Dropout of `model` (with BERTKIT_CPU_KERNELS unset) for a
    `MeasuredDropout` of the same p given `choices`, where they say the counter-based masks are faster in some
    precision; returns whether any was swapped."""
    if not choices.counter_dropout or not cpu_kernels_enabled():
        return False
    swapped = False
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Dropout:  # on any device: MeasuredDropout runs torch's off a CPU
                setattr(parent, name, MeasuredDropout(child.p, choices, child.inplace).train(child.training))
                swapped = True
    return swapped


def attend_as_measured_for_training(model: nn.Module, choices: probe.Choices) -> bool:
    """Give every encoder in `model` still on the plain default dispatch (a fixed backend, e.g. the compiled
    path's, is left alone) this machine's measured CPU attention `choices`, so that its training steps run
    `BatchedBmm` where bmm attention's forward + backward measured faster than SDPA's, on batches full enough
    (model/attention.py, MIN_BMM_FILL).
    Nothing changes on a GPU or with BERTKIT_CPU_KERNELS=0. Returns whether any encoder was given them."""
    given = False
    for bert in (m for m in model.modules() if isinstance(m, BertModel)):
        if bert.embeddings.word.weight.device.type != "cpu" or not cpu_kernels_enabled():
            continue
        if type(bert.attention) is Dispatch and bert.attention.cpu is None:
            bert.attention = Dispatch(choices)
            given = True
    return given


def cpu_kernels_enabled() -> bool:
    """False when the environment has BERTKIT_CPU_KERNELS=0: no bmm attention, no packed dense layers."""
    return os.environ.get("BERTKIT_CPU_KERNELS", "1") != "0"


def _copy_sharing_tensors(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """A deep copy of the modules holding the original's tensors (the same memory; floating ones not in
    `dtype` cast), detached: the copy's parameters never require gradients, so it builds no autograd
    graph even where gradients are on, and the original's gradients are its own."""
    memo: dict[int, torch.Tensor] = {}
    for tensor in itertools.chain(model.parameters(), model.buffers()):
        shared = tensor.detach()
        if tensor.is_floating_point() and tensor.dtype != dtype:
            shared = shared.to(dtype)
        memo[id(tensor)] = nn.Parameter(shared, requires_grad=False) if isinstance(tensor, nn.Parameter) else shared
    return copy.deepcopy(model, memo)


def _plain(linear: nn.Module) -> bool:
    """A dense layer as bert.py builds it, with no hooks (pruning, for one, recomputes the weight in one)."""
    return type(linear) in (nn.Linear, ResidualDense) and not linear._forward_hooks and not linear._forward_pre_hooks


def _pack(layer: BertLayer, dtype: torch.dtype) -> None:
    """Swap the layer's dense layers for ones packed in `dtype` where that is faster here (module docstring)."""
    if not (layer.qkv.weight.device.type == "cpu" and cpu_kernels_enabled() and onednn_works(dtype)
            and probe.choices(layer.qkv.in_features).packed(dtype)):
        return
    _swap_dense_layers(layer, lambda linear, post_op: PackedLinear(linear, post_op, dtype))


def _swap_dense_layers(layer: BertLayer, make: Callable[[nn.Linear, tuple[str, str]], nn.Module]) -> None:
    """Replace each plain dense layer of `layer` by make(linear, post_op), the activation moved into ffn_in's
    post-op (and the layer's own `act` made an identity) where the kernel has it."""
    for name in DENSE_LAYERS:
        linear = getattr(layer, name)
        if not _plain(linear):
            continue
        post_op = _post_op(layer.act) if name == "ffn_in" else None
        setattr(layer, name, make(linear, post_op or ("none", "")))
        if post_op:
            layer.act = nn.Identity()  # applied inside ffn_in now


def _post_op(activation: nn.Module) -> tuple[str, str] | None:
    """oneDNN's (post-op, algorithm) for an activation module, None if it has none."""
    if type(activation) is nn.GELU:
        return "gelu", activation.approximate  # "none" (exact erf) or "tanh": oneDNN's names too
    if type(activation) is nn.ReLU:
        return "relu", ""
    return None


def quantize_linear_layers(module: nn.Module) -> nn.Module:
    """`module` with every plain nn.Linear inside it swapped, in place, for an `Int8Linear` (any model, e.g.
    transformers' encoder in the benchmarks); bertkit's own layers get GELU fused too (`_quantize`)."""
    if not int8.works():
        raise RuntimeError(int8.MISSING)
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear and _plain(child):
                setattr(parent, name, Int8Linear(child))
    return module


def _quantize(layer: BertLayer, smoothing: dict[str, torch.Tensor],
              outliers: dict[str, torch.Tensor] | None = None) -> None:
    """Swap the layer's dense layers for int8 ones (`Int8Linear`, with SmoothQuant's scales of the dense layers
    `smoothing` names and the outlier channels `outliers` names), GELU fused into the first feed-forward."""
    if not int8.works():
        raise RuntimeError(int8.MISSING)
    scales = {id(getattr(layer, name)): scale for name, scale in smoothing.items()}
    kept = {id(getattr(layer, name)): channels for name, channels in (outliers or {}).items()}
    floors = {id(layer.ffn_out): _least_output(layer.act)}  # what the second feed-forward reads: act's outputs
    _swap_dense_layers(layer, lambda linear, post_op: Int8Linear(linear, post_op, scales.get(id(linear)),
                                                                 floors.get(id(linear)), kept.get(id(linear))))


def _least_output(activation: nn.Module) -> float | None:
    """A bound below every output of `activation` (GELU's least is -0.16997, its tanh form's -0.17004), or None
    where it has none known."""
    if type(activation) is nn.GELU:
        return -0.1701
    if type(activation) is nn.ReLU:
        return 0.0
    return None


class _Frozen(nn.Module):
    """An inference-only module: its kernels have no backward, so it refuses training and autograd."""

    def __init__(self) -> None:
        super().__init__()
        self.training = False

    def train(self, mode: bool = True) -> _Frozen:
        if mode:
            raise RuntimeError(f"{type(self).__name__} is for inference only (accelerate_for_inference); "
                               "train the original model")
        return super().train(False)

    @staticmethod
    def check_no_grad(x: torch.Tensor) -> None:
        if x.requires_grad and torch.is_grad_enabled():
            raise RuntimeError("a model accelerated for inference has no backward; run it under torch.no_grad() "
                               "or torch.inference_mode(), and train the original model")


class PackedLinear(_Frozen):
    """A frozen dense layer in one oneDNN call: post_op(x W^T + b), or residual + x W^T + b; the weight
    packed once into oneDNN's blocked layout in `dtype` (default: the weight's), and the input cast to it.
    A residual of another dtype (fp32 under bf16 autocast) is added outside the call, so the sum has its
    dtype, as in eager autocast."""

    def __init__(self, linear: nn.Linear, post_op: tuple[str, str] = ("none", ""),
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.dtype = dtype or linear.weight.dtype
        self.weight = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach().to(self.dtype))
        self.bias = None if linear.bias is None else linear.bias.detach().to(self.dtype)
        self.post_op = post_op

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        self.check_no_grad(x)
        x = x.to(self.dtype)
        if residual is not None and residual.dtype == self.dtype:
            return torch.ops.mkldnn._linear_pointwise.binary(x, residual, self.weight, self.bias, "add")
        name, algorithm = self.post_op
        y = torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, name, [], algorithm)
        return y if residual is None else residual + y

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, post_op={self.post_op[0]}, "
                f"dtype={self.dtype}")


class Int8Linear(_Frozen):
    """A frozen dense layer in int8 (`bertkit.kernels.int8`: oneDNN's int8 kernel, int8 weights per output channel,
    activations quantized per call with one scale per row): post_op(x W^T + b), or residual + x W^T + b.
    `smooth` (SmoothQuant, bertkit.inference.smoothquant): a scale per input channel moved from x into W.
    `floor`: a bound below every input (the second feed-forward's, GELU's outputs): x is then quantized unsigned
    from it (`bertkit.kernels.int8`), twice the levels a range mirrored around zero leaves it.
    `outliers`: input channels (indices, chosen by calibration) multiplied in fp32 beside the int8 product."""

    def __init__(self, linear: nn.Linear, post_op: tuple[str, str] = ("none", ""),
                 smooth: torch.Tensor | None = None, floor: float | None = None,
                 outliers: torch.Tensor | None = None) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        if smooth is not None and tuple(smooth.shape) != (linear.in_features,):
            raise ValueError(f"SmoothQuant scales of shape {tuple(smooth.shape)} for a layer of {linear.in_features} "
                             "inputs: they were measured on another model")
        if outliers is not None and not int8.valid_channels(outliers, linear.in_features):
            raise ValueError(f"outlier channels {outliers.tolist()} for a layer of {linear.in_features} inputs: "
                             "invalid or damaged (distinct channel indices below the width expected)")
        weight = linear.weight if smooth is None else linear.weight.detach().float() * smooth.float()[None, :]
        self.inverse_smooth = None if smooth is None else smooth.float().reciprocal()
        self.shift = None
        if floor is not None:  # x / s >= floor / s: shifted by -floor / s, every input is >= 0
            shift = torch.full((linear.in_features,), -floor)
            self.shift = shift if self.inverse_smooth is None else shift * self.inverse_smooth
        self.packed = int8.pack(weight, linear.bias, self.shift, outliers)
        self.post_op = post_op

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        self.check_no_grad(x)
        return int8.linear(x, self.packed, self.post_op, residual, self.inverse_smooth, self.shift)

    def extra_repr(self) -> str:
        smoothed = ", smoothed" if self.inverse_smooth is not None else ""
        unsigned = ", unsigned inputs" if self.shift is not None else ""
        kept = self.packed.outliers
        outliers = "" if kept is None else f", {kept.numel()} outlier channels fp32"
        return (f"in_features={self.in_features}, out_features={self.out_features}, post_op={self.post_op[0]}, "
                f"int8{smoothed}{unsigned}{outliers}")


@functools.cache
def onednn_works(dtype: torch.dtype) -> bool:
    """Whether this PyTorch build runs the oneDNN kernels in `dtype` and gets F.linear's numbers: probed
    once on a tiny layer, so a build or CPU without them quietly keeps the eager layers."""
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


def enable_gradient_checkpointing(model: nn.Module) -> nn.Module:
    """`model` with every encoder recomputing its layers in the backward (`--gradient-checkpointing`;
    BertModel.gradient_checkpointing), in place: less activation memory for about one more forward."""
    encoders = [m for m in model.modules() if isinstance(m, BertModel)]
    if not encoders:
        raise TypeError(f"{type(model).__name__} holds no BertModel to checkpoint")
    for bert in encoders:
        bert.gradient_checkpointing_enable()
    return model


def compile_model(model: nn.Module) -> nn.Module:
    """`model` with each encoder layer's forward compiled by torch.compile (dynamic shapes, one graph for
    all layers, and one more for a last layer run at the masked positions alone), in place; weights and state_dict
    keys unchanged, so checkpoints are the same.

    It fuses what eager mode runs as separate passes over memory (dtype casts, dropout, GELU, residual +
    LayerNorm); where that pays, and what the first steps pay for compiling, is measured in
    docs/performance.md. Attention is set to the padded backend (`PaddedSDPA`),
    since the padding-free one loops over the batch's sequences in Python."""
    for bert in [m for m in model.modules() if isinstance(m, BertModel)]:
        bert.attention = PaddedSDPA()
        for layer in bert.layers:
            layer.forward = torch.compile(layer.forward, dynamic=True)
    return model
