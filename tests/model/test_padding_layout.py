"""The attention strategies of model/padding.py give the same numbers and gradients: per sequence
(CPU) and re-padded with a key-padding mask (CUDA with attention dropout, checked here on CPU)."""

from __future__ import annotations

import torch

from bertkit.config import preset
from bertkit.model import BertModel
from bertkit.model.padding import Unpadded


def test_repadded_attention_equals_per_sequence_attention_and_gradients():
    torch.manual_seed(0)
    layer = BertModel(preset("bert-debug", vocab_size=99)).eval().layers[0]  # eval: no attention dropout
    mask = torch.tensor([[1] * 9, [1] * 4 + [0] * 5, [0] * 9, [1] * 7 + [0] * 2])  # row 2 is empty
    layout = Unpadded.from_mask(mask.bool())
    qkv = torch.randn(int(mask.sum()), 3 * layer.qkv.in_features, requires_grad=True)
    weights = torch.randn(int(mask.sum()), layer.qkv.in_features)

    per_sequence = layout.attention(qkv, layer.num_heads, 0.0, layer.padded_attention)  # the CPU strategy
    (grad_per_sequence,) = torch.autograd.grad((per_sequence * weights).sum(), qkv)
    repadded = layout.repadded_attention(qkv, layer.padded_attention)
    (grad_repadded,) = torch.autograd.grad((repadded * weights).sum(), qkv)

    torch.testing.assert_close(repadded, per_sequence, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(grad_repadded, grad_per_sequence, atol=1e-6, rtol=1e-6)
    assert torch.isfinite(grad_repadded).all()
