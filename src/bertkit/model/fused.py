"""Fused training kernels applied to a BERT model from outside: a bf16 residual stream on the GPU.

    fuse_for_training(model, norm=True, gelu=True)    # in place; weights and state_dict keys unchanged

Design decision: bert.py says what BERT computes and stays as it is; this transform replaces the `forward` of
the embeddings and of each encoder layer (instance attributes, as `compile_model` does) with functions that
compute the same from the same weights through fused ops (`bertkit.kernels`):

- `norm`: each output projection's dropout, residual add and LayerNorm are one kernel
  (`dropout_add_layer_norm`: fp32 statistics, the output in the dtype the projection computed in, so under
  bf16 autocast the residual stream between layers is bf16 and no cast kernel runs between them; the dropout
  mask is regenerated in the backward from one seed, never stored); the embeddings' LayerNorm writes bf16 too.
- `gelu`: the first feed-forward projection runs without its bias, and the bias add and exact-erf GELU are
  one kernel (`bias_gelu`), for models whose activation is "gelu".

Each op has a PyTorch reference as its CPU implementation (so the transform runs and is tested on a CPU) and a
Triton kernel on CUDA. An inference copy (`accelerate_for_inference`) drops these forwards and runs eagerly.
The lever ladder of the GPU check (scripts/gpu_check) measures what each one buys.

Shape legend: B batch, T sequence length, N real tokens, D hidden size.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from bertkit.kernels.gelu import bias_gelu
from bertkit.kernels.norm import dropout_add_layer_norm
from bertkit.model.attention import Attention
from bertkit.model.bert import BertEmbeddings, BertLayer, BertModel, ResidualDense, keep_rows
from bertkit.model.padding import Unpadded

FUSED = "_bertkit_fused"
"""Attribute a fused module carries (the levers it was given), so a second fusion is refused."""


def fuse_for_training(model: nn.Module, *, norm: bool = True, gelu: bool = True) -> nn.Module:
    """`model` with the fused forwards of the levers asked for, in place (module docstring); returns it."""
    if not (norm or gelu):
        return model
    for bert in [m for m in model.modules() if isinstance(m, BertModel)]:
        if getattr(bert, FUSED, None) is not None:
            raise ValueError("this model is already fused; fuse the original once")
        setattr(bert, FUSED, {"norm": norm, "gelu": gelu})
        if norm:
            bert.embeddings.forward = functools.partial(_embeddings_forward, bert.embeddings)  # type: ignore[method-assign]
        for layer in bert.layers:
            assert isinstance(layer, BertLayer)
            exact_gelu = type(layer.act) is nn.GELU and layer.act.approximate == "none"
            layer.forward = functools.partial(_layer_forward, layer, norm, gelu and exact_gelu)  # type: ignore[method-assign]
    return model


def fused_levers(model: nn.Module) -> dict[str, bool]:
    """The levers `fuse_for_training` applied to `model`'s encoder ({} when none)."""
    bert = next((m for m in model.modules() if isinstance(m, BertModel)), None)
    return dict(getattr(bert, FUSED, None) or {})


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype dense layers compute in here: autocast's when it is on for x's device, else x's."""
    device = x.device.type  # (autocast exists for these; torch.compile traces is_autocast_enabled, not all checks)
    autocast = device in ("cuda", "cpu") and torch.is_autocast_enabled(device)
    return torch.get_autocast_dtype(device) if autocast else x.dtype


def _embeddings_forward(embeddings: BertEmbeddings, input_ids: torch.Tensor, token_type_ids: torch.Tensor
                        ) -> torch.Tensor:
    """BertEmbeddings.forward with the LayerNorm writing the compute dtype (bf16 under autocast)."""
    positions = torch.arange(input_ids.shape[1], device=input_ids.device)  # (T,)
    x = embeddings.word(input_ids) + embeddings.position(positions) + embeddings.token_type(token_type_ids)
    norm = embeddings.norm
    x = dropout_add_layer_norm(x, None, norm.weight, norm.bias, 0.0, norm.eps, out_dtype=_compute_dtype(x))
    return embeddings.dropout(x)  # (B, T, D)


def _layer_forward(layer: BertLayer, norm: bool, gelu: bool, x: torch.Tensor, attention: Attention,
                   layout: Unpadded | torch.Tensor | None, rows: torch.Tensor | None = None) -> torch.Tensor:
    """BertLayer.forward through the fused ops chosen (`norm`, `gelu`); the same function of the same weights."""
    dropout_p = layer.attention_dropout if layer.training else 0.0
    context = attention(layer.qkv(x), layout, layer.num_heads, dropout_p)  # (N, 3D) -> (N, D), or batched
    context, x = keep_rows(context, x, rows)
    x = _add_norm(layer.attn_out, layer.attn_norm, context, x) if norm else layer.attn_norm(layer.attn_out(context, x))
    if gelu:
        inner = bias_gelu(F.linear(x, layer.ffn_in.weight), layer.ffn_in.bias)  # (N, I)
    else:
        inner = layer.act(layer.ffn_in(x))
    return _add_norm(layer.ffn_out, layer.ffn_norm, inner, x) if norm else layer.ffn_norm(layer.ffn_out(inner, x))


def _add_norm(dense: ResidualDense, norm: nn.LayerNorm, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """LayerNorm(residual + dropout(dense(x))), the last three in one kernel."""
    p = dense.dropout.p if dense.training else 0.0
    return dropout_add_layer_norm(F.linear(x, dense.weight, dense.bias), residual, norm.weight, norm.bias, p, norm.eps)
