"""CompiledObjective (issue 49): the whole pre-training objective as one graph with no graph break, compiled once
over a run's batches (padded batches of any real-token count share a graph; full rows are a second one), giving
the eager objective's loss and gradients; Inductor itself, with the fused kernels, once."""

from __future__ import annotations

import torch
from static_batches import items, tiny, totals
from torch._dynamo.utils import counters

from bertkit.data import collate_static
from bertkit.kernels.cross_entropy import masked_lm_loss
from bertkit.model.fused import fuse_for_training
from bertkit.tasks.pretraining import PretrainingObjective
from bertkit.train.compiled import CompiledObjective


def _loss_and_grads(objective, model, batch):
    loss, metrics = objective(model, batch, totals(objective, batch))
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad(set_to_none=True)
    return loss.detach(), metrics, grads


def _batches() -> list[dict]:
    padded = [collate_static(items(4, seed=seed), 0, 24, 10) for seed in range(4)]
    assert len({int(b["token_indices"].numel()) for b in padded}) == 4  # four real-token counts
    return [*padded, collate_static(items(4, seed=9, full=True), 0, 24, 10)]


def test_one_graph_per_batch_kind_no_graph_break_and_the_eager_numbers():
    torch._dynamo.reset()
    counters.clear()
    model = tiny()
    eager = PretrainingObjective()
    compiled = CompiledObjective(eager, backend="aot_eager")
    for batch in _batches():
        want_loss, _, want_grads = _loss_and_grads(eager, model, batch)
        got_loss, _, got_grads = _loss_and_grads(compiled, model, batch)
        torch.testing.assert_close(got_loss, want_loss, atol=1e-6, rtol=1e-6)
        for a, b in zip(got_grads, want_grads):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    assert dict(counters["graph_break"]) == {}
    assert counters["stats"]["unique_graphs"] == 2  # padded (the token count dynamic) and full rows
    assert counters["stats"]["calls_captured"] > 0


def test_inductor_compiles_the_fused_step_once_with_the_eager_numbers():
    """The real backend, on a CPU: Inductor's generated code around the fused ops' reference kernels."""
    torch._dynamo.reset()
    counters.clear()
    model = fuse_for_training(tiny())
    eager = PretrainingObjective(mlm_loss=masked_lm_loss)
    compiled = CompiledObjective(eager)
    for batch in _batches()[:2]:
        want_loss, _, want_grads = _loss_and_grads(eager, model, batch)
        got_loss, _, got_grads = _loss_and_grads(compiled, model, batch)
        torch.testing.assert_close(got_loss, want_loss, atol=1e-5, rtol=1e-5)
        for a, b in zip(got_grads, want_grads):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    assert dict(counters["graph_break"]) == {} and counters["stats"]["unique_graphs"] == 1
