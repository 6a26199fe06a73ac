"""The encoder as ONNX Runtime's BERT fusions recognise it, and those fusions run on an exported graph.

    fusable_encoder(encoder)                    swap embeddings and layers for fusable forms (same weights, numbers)
    optimize_graph(src, dst, config) -> counts  onnxruntime.transformers.optimizer on src, written to dst

Design decision: bertkit's layer projects q|k|v with one packed Linear and hands the (B, T, 3D) result to an
attention backend (model/attention.py), which ONNX export records as Split and SDPA's masked-softmax
decomposition. ONNX Runtime's attention fusion (`FusionAttention`, model_type "bert") looks for another
graph: three MatMul+Add projections of the same input, Reshape/Transpose per head, MatMul, Div by
sqrt(Dh), + an additive mask made as (1 - mask) * min, Softmax, MatMul, Transpose, Reshape, then the
output MatMul+Add and the residual Add before LayerNormalization: the graph transformers' eager
BertSelfAttention exports. Measured on the packed export (ORT 1.32): 0 Attention fused, only
SkipLayerNormalization and BiasGelu. So export swaps each layer for a `FusableLayer` that holds the same
weights (the packed one split in three) and computes that graph, and the embeddings for a
`FusableEmbeddings` (positions sliced from a buffer, as transformers has them: EmbedLayerNormalization's
pattern); the outputs equal bertkit's within fp32 rounding (tests/export/test_onnx_export.py). The mask is
ONNX Runtime's raw 2D attention mask (`use_raw_attention_mask`), correct for any padding; its BERT default
(a per-row length) assumes right padding. opt_level 1 (basic graph optimizations): the optimizer's own
default for model_type "bert"; levels above 1 write graphs for one provider (its docstring: "use_gpu shall
be set properly since the optimized graph might contain operators for GPU or CPU only").

References: onnxruntime/python/tools/transformers (optimizer.py, fusion_attention.py, fusion_options.py);
transformers models/bert/modeling_bert.py (BertSelfAttention, eager).
Shape legend: B batch, T sequence length, D hidden size, A heads, Dh head size.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import cast

import torch
from torch import nn

from bertkit.config import BertConfig
from bertkit.model import BertModel
from bertkit.model.attention import Attention
from bertkit.model.bert import BertEmbeddings, BertLayer, keep_rows

FUSED_OPS = ("Attention", "MultiHeadAttention", "EmbedLayerNormalization", "SkipLayerNormalization", "BiasGelu",
             "FastGelu", "Gelu", "LayerNormalization")
"""The fused operators counted in the optimized graph (com.microsoft contrib ops, and LayerNormalization)."""
OPT_LEVEL = 1


class FusableLayer(nn.Module):
    """A BertLayer computed as transformers' eager BertLayer: separate q, k, v projections (the packed
    weight's three row blocks), explicit scores, additive mask, softmax."""

    def __init__(self, layer: BertLayer) -> None:
        super().__init__()
        d = layer.qkv.out_features // 3
        self.num_heads, self.layer = layer.num_heads, layer
        self.query, self.key, self.value = (nn.Linear(d, d) for _ in range(3))
        with torch.no_grad():
            for index, projection in enumerate((self.query, self.key, self.value)):
                projection.weight.copy_(layer.qkv.weight[index * d:(index + 1) * d])
                projection.bias.copy_(layer.qkv.bias[index * d:(index + 1) * d])

    def forward(self, x: torch.Tensor, attention: Attention, layout: torch.Tensor | None,
                rows: torch.Tensor | None = None) -> torch.Tensor:
        """`x` (B, T, D), `layout` the (B, 1, 1, T) key-padding mask (True = real) or None; `attention` is
        not used (this layer is its own attention); `rows` as BertLayer's (the output at those rows alone)."""
        batch, length, d = x.shape
        heads, head_size = self.num_heads, d // self.num_heads
        q = self.query(x).view(batch, length, heads, head_size).permute(0, 2, 1, 3)  # (B, A, T, Dh)
        k = self.key(x).view(batch, length, heads, head_size).permute(0, 2, 3, 1)  # (B, A, Dh, T)
        v = self.value(x).view(batch, length, heads, head_size).permute(0, 2, 1, 3)  # (B, A, T, Dh)
        scores = torch.matmul(q, k) / math.sqrt(head_size)  # (B, A, T, T)
        if layout is not None:
            scores = scores + (1.0 - layout.to(scores.dtype)) * torch.finfo(scores.dtype).min
        context = torch.matmul(scores.softmax(-1), v)  # (B, A, T, Dh)
        context = context.permute(0, 2, 1, 3).reshape(batch, length, d)  # (B, T, A, Dh) -> (B, T, D)
        layer = self.layer
        context, x = keep_rows(context, x, rows)
        x = layer.attn_norm(layer.attn_out(context, x))
        return layer.ffn_norm(layer.ffn_out(layer.act(layer.ffn_in(x)), x))


class FusableEmbeddings(nn.Module):
    """BertEmbeddings computed as transformers' BertEmbeddings: positions sliced from a (1, P) buffer of
    position ids (where bertkit counts them with arange), the sum taken as word + token type + position.
    It holds the same modules under the same names (a masked-LM head reads `embeddings.word`)."""

    def __init__(self, embeddings: BertEmbeddings) -> None:
        super().__init__()
        self.word, self.position, self.token_type = embeddings.word, embeddings.position, embeddings.token_type
        self.norm, self.dropout = embeddings.norm, embeddings.dropout
        self.register_buffer("position_ids", torch.arange(self.position.num_embeddings)[None], persistent=False)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        positions = cast(torch.Tensor, self.position_ids)[:, :input_ids.shape[1]]  # (1, T)
        x = self.word(input_ids) + self.token_type(token_type_ids) + self.position(positions)  # (B, T, D)
        return self.dropout(self.norm(x))


def fusable_encoder(encoder: BertModel) -> None:
    """Replace the encoder's embeddings and layers by their fusable forms (in place; for export only)."""
    encoder.embeddings = FusableEmbeddings(encoder.embeddings)  # type: ignore[assignment]
    encoder.layers = nn.ModuleList(FusableLayer(layer) for layer in encoder.layers)  # type: ignore[arg-type]


def optimize_graph(source: Path, target: Path, config: BertConfig) -> dict[str, int]:
    """Run ONNX Runtime's BERT optimizer on `source`, write `target`; return the count of each FUSED_OPS
    operator in the written graph."""
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    options = FusionOptions("bert")
    options.use_raw_attention_mask(True)
    model = optimize_model(str(source), model_type="bert", num_heads=config.num_attention_heads,
                           hidden_size=config.hidden_size, optimization_options=options, opt_level=OPT_LEVEL)
    model.save_model_to_file(str(target))
    counts = Counter(node.op_type for node in model.model.graph.node)
    return {op: counts.get(op, 0) for op in FUSED_OPS}
