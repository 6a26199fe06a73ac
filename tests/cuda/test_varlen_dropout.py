"""`kernels.flash_varlen` (issue 49): flash attention over packed sequences WITH attention dropout, the kernels
SDPA uses; without dropout it equals `varlen_attn`, with dropout it is seeded by torch's generator (the same
seed, the same output and gradients), drops about p of the probability mass, and a training step of a model
with attention dropout on padded rows runs through it."""

from __future__ import annotations

import pytest
import torch

from bertkit.kernels.attention import flash_varlen
from bertkit.model.attention import VarlenFlash

from .conftest import cuda_only

pytestmark = [pytest.mark.cuda, cuda_only]
HEADS, HEAD_SIZE = 4, 64


def _packed(lengths: list[int], seed: int = 0):
    generator = torch.Generator(device="cuda").manual_seed(seed)
    tokens = sum(lengths)
    q, k, v = (torch.randn(tokens, HEADS, HEAD_SIZE, device="cuda", dtype=torch.bfloat16, generator=generator)
               .requires_grad_() for _ in range(3))
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device="cuda", dtype=torch.int32)
    return q, k, v, cu


def _grads(out, *inputs):
    grad = torch.ones_like(out)
    return torch.autograd.grad(out, inputs, grad)


def test_without_dropout_it_is_varlen_attn():
    from torch.nn.attention.varlen import varlen_attn

    q, k, v, cu = _packed([37, 128, 5, 90])
    ours = flash_varlen(q, k, v, cu, 128, 0.0)
    theirs = varlen_attn(q, k, v, cu, cu, 128, 128)
    torch.testing.assert_close(ours, theirs)
    for a, b in zip(_grads(ours, q, k, v), _grads(theirs, q, k, v)):
        torch.testing.assert_close(a, b)


def test_dropout_is_seeded_by_torch_and_its_backward_replays_the_mask():
    q, k, v, cu = _packed([64, 100, 31])
    runs = []
    for _ in range(2):
        torch.manual_seed(5)
        out = flash_varlen(q, k, v, cu, 128, 0.3)
        runs.append((out, _grads(out, q, k, v)))
    torch.testing.assert_close(runs[0][0], runs[1][0], rtol=0, atol=0)
    for a, b in zip(runs[0][1], runs[1][1]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    plain = flash_varlen(q, k, v, cu, 128, 0.0)
    assert not torch.equal(runs[0][0], plain)
    # E[dropout(P)] = P: the mean over many draws approaches the output without dropout
    mean = torch.stack([flash_varlen(q, k, v, cu, 128, 0.3).float() for _ in range(200)]).mean(0)
    assert (mean - plain.float()).abs().mean() < 0.1 * plain.float().abs().mean()
    assert all(torch.isfinite(g).all() for g in runs[0][1])


def test_a_model_with_attention_dropout_trains_through_it(monkeypatch):
    from gpu_check.tiny import pretraining_items, tiny_model

    from bertkit.data import collate_pretraining
    from bertkit.tasks.pretraining import pretraining_loss

    model = tiny_model(hidden_size=256, num_attention_heads=4, intermediate_size=512,
                       attention_probs_dropout_prob=0.1).cuda().train()
    calls = []
    real = VarlenFlash.__call__
    monkeypatch.setattr(VarlenFlash, "__call__", lambda self, qkv, layout, heads, p: calls.append(p)
                        or real(self, qkv, layout, heads, p))
    batch = {k: v.cuda() for k, v in collate_pretraining(pretraining_items(8)).items()}
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss, _ = pretraining_loss(model, batch)
    loss.backward()
    assert calls == [0.1, 0.1] and torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
