"""`--compile` smoke test on CUDA (the GPU check runs it last, when time is left): a model with
torch.compile'd encoder layers (`compile_model`) takes bf16 training steps at two sequence lengths (dynamic
shapes) with the same loss as eager (2e-2) and finite gradients within 5e-2 (relative norm) of eager's."""

from __future__ import annotations

import copy

import pytest
import torch

from bertkit.data import collate_pretraining
from bertkit.model import compile_model
from bertkit.tasks.pretraining import pretraining_loss

from .conftest import DEVICE, cuda_or_cpu_check

pytestmark = [pytest.mark.cuda, cuda_or_cpu_check]


def test_compile_smoke():
    from gpu_check.tiny import pretraining_items, tiny_model

    eager = tiny_model(hidden_size=128, num_attention_heads=2, intermediate_size=256, hidden_dropout_prob=0.0,
                       attention_probs_dropout_prob=0.0).to(DEVICE).train()
    compiled = compile_model(copy.deepcopy(eager))
    for max_length in (64, 40):
        batch = {k: v.to(DEVICE) for k, v in collate_pretraining(pretraining_items(8, max_length)).items()}
        with torch.autocast(DEVICE, dtype=torch.bfloat16):
            losses = [pretraining_loss(model, batch)[0] for model in (eager, compiled)]
        for model, loss in zip((eager, compiled), losses):
            model.zero_grad(set_to_none=True)
            loss.backward()
        eager_loss, compiled_loss = (float(loss.detach()) for loss in losses)
        assert abs(compiled_loss - eager_loss) < 2e-2 * abs(eager_loss)
        for (name, ours), theirs in zip(compiled.named_parameters(), eager.parameters(), strict=True):
            assert ours.grad is not None and torch.isfinite(ours.grad).all(), name
            error = float((ours.grad - theirs.grad).norm() / theirs.grad.norm().clamp(min=1e-12))
            assert error < 5e-2, f"{name} at length {max_length}: relative gradient error {error:.2e}"
