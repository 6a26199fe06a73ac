"""The three ops under torch.compile(fullgraph=True) on the CPU: custom ops with fake implementations and
registered backwards trace as single nodes, so a training step that uses all three compiles as one graph, and
it computes what eager computes, gradients included. One test: a CPU compile costs tens of seconds."""

from __future__ import annotations

import torch
from torch._dynamo.utils import counters

from bertkit.kernels.cross_entropy import masked_lm_loss
from bertkit.kernels.gelu import bias_gelu
from bertkit.kernels.norm import dropout_add_layer_norm


def _step(x, residual, weight, bias, hidden, ffn_bias, logits, targets, weights):
    y = dropout_add_layer_norm(x, residual, weight, bias, 0.1, 1e-12)
    activation = bias_gelu(hidden, ffn_bias)
    loss, correct = masked_lm_loss(logits, targets, weights)
    return y.float().square().sum() + activation.float().sum() + loss, correct


def test_the_ops_compile_as_one_graph_and_match_eager():
    generator = torch.Generator().manual_seed(0)
    leaves = [torch.randn(4, 8, 32, generator=generator, dtype=torch.bfloat16),  # x (bf16 branch)
              torch.randn(4, 8, 32, generator=generator),  # residual (fp32 stream)
              torch.rand(32, generator=generator) + 0.5, torch.randn(32, generator=generator),
              torch.randn(4, 8, 64, generator=generator, dtype=torch.bfloat16), torch.randn(64, generator=generator),
              torch.randn(6, 50, generator=generator, dtype=torch.bfloat16)]
    targets, weights = torch.randint(0, 50, (6,), generator=generator), torch.tensor([1.0] * 5 + [0.0])

    results = []
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(_step, fullgraph=True, dynamic=False)
    # fallback_random: the seed is drawn by aten's generator, as in eager, so both draw the same mask
    with torch._inductor.config.patch(fallback_random=True):
        for step in (_step, compiled):
            inputs = [t.clone().requires_grad_() for t in leaves]
            torch.manual_seed(3)
            total, correct = step(*inputs, targets, weights)
            total.backward()
            results.append((total.detach(), correct, [t.grad for t in inputs]))
    assert sum(counters["graph_break"].values()) == 0
    (eager_total, eager_correct, eager_grads), (total, correct, grads) = results
    torch.testing.assert_close(total, eager_total, rtol=1e-5, atol=1e-4)
    assert torch.equal(correct, eager_correct)
    for ours, theirs in zip(grads, eager_grads):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
