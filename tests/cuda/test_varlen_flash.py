"""VarlenFlash (flash attention over the packed tokens, `cu_seqlens`) against SDPA on the padded batch, in
bf16 on ragged lengths (one token, full rows, anything between): outputs and input gradients each within
3e-2 of the fp32 answer and no further from it than SDPA's own bf16 result + 2x; then a whole bf16
training step of a model that picks it (attention dropout off) against the same model on PaddedSDPA."""

from __future__ import annotations

import copy

import pytest
import torch

from bertkit.data import collate_pretraining
from bertkit.model.attention import PaddedSDPA, VarlenFlash
from bertkit.model.padding import Unpadded
from bertkit.tasks.pretraining import pretraining_loss

from .conftest import cuda_only

pytestmark = [pytest.mark.cuda, cuda_only]

LENGTHS = [128, 77, 1, 128, 33, 100, 2, 64]
HEADS, HEAD_SIZE = 12, 64  # bert-base's


def _close_as_bf16_can_be(actual: torch.Tensor, baseline: torch.Tensor, reference: torch.Tensor, what: str) -> None:
    """`actual` (bf16 result) near the fp32 `reference`, and not much further from it than `baseline`."""
    actual, baseline, reference = actual.float(), baseline.float(), reference.float()
    torch.testing.assert_close(actual, reference, atol=3e-2, rtol=3e-2, msg=what)
    error, baseline_error = float((actual - reference).abs().max()), float((baseline - reference).abs().max())
    assert error <= 2 * baseline_error + 1e-3, f"{what}: VarlenFlash error {error:.3g}, SDPA's {baseline_error:.3g}"


def test_varlen_flash_equals_padded_sdpa_with_gradients():
    lengths = torch.tensor(LENGTHS, device="cuda")
    mask = torch.arange(128, device="cuda") < lengths[:, None]  # (B, T)
    layout = Unpadded.from_mask(mask)
    generator = torch.Generator(device="cuda").manual_seed(0)
    width = HEADS * HEAD_SIZE
    qkv32 = torch.randn(int(lengths.sum()), 3 * width, device="cuda", generator=generator)
    weights = torch.randn(int(lengths.sum()), width, device="cuda", generator=generator)

    def padded_sdpa(qkv: torch.Tensor) -> torch.Tensor:  # (N, 3D) -> (N, D) through the padded batch
        return layout.unpad(PaddedSDPA()(layout.pad(qkv), mask[:, None, None, :], HEADS, 0.0))

    results = {}
    for name, attend, source in (("fp32 SDPA", padded_sdpa, qkv32), ("bf16 SDPA", padded_sdpa, qkv32.bfloat16()),
                                 ("bf16 VarlenFlash", lambda x: VarlenFlash()(x, layout, HEADS, 0.0),
                                  qkv32.bfloat16())):
        qkv = source.clone().requires_grad_()
        out = attend(qkv)
        (grad,) = torch.autograd.grad((out.float() * weights).sum(), qkv)
        assert torch.isfinite(out).all() and torch.isfinite(grad).all(), name
        results[name] = (out.detach(), grad)
    assert results["bf16 VarlenFlash"][0].dtype == torch.bfloat16
    for index, what in enumerate(("output", "gradient")):
        _close_as_bf16_can_be(results["bf16 VarlenFlash"][index], results["bf16 SDPA"][index],
                              results["fp32 SDPA"][index], what)


def test_bf16_training_step_with_varlen_flash_matches_padded_sdpa(monkeypatch):
    from gpu_check.tiny import pretraining_items, tiny_model

    model = tiny_model(hidden_size=256, num_attention_heads=4, intermediate_size=512, hidden_dropout_prob=0.0,
                       attention_probs_dropout_prob=0.0).cuda().train()
    other = copy.deepcopy(model)
    other.bert.attention = PaddedSDPA()
    batch = {k: v.cuda() for k, v in collate_pretraining(pretraining_items(8, max_length=64)).items()}
    calls = []
    flash = VarlenFlash.__call__
    monkeypatch.setattr(VarlenFlash, "__call__", lambda self, *args: calls.append(1) or flash(self, *args))
    with torch.autocast("cuda", dtype=torch.bfloat16):
        losses = [pretraining_loss(net, batch)[0] for net in (model, other)]
    assert len(calls) == 2  # the model's own choice, one call per layer: training without attention dropout
    for loss in losses:
        loss.backward()
    flash_loss, sdpa_loss = (float(loss.detach()) for loss in losses)
    assert abs(flash_loss - sdpa_loss) < 2e-2 * abs(sdpa_loss)
    for (name, ours), theirs in zip(model.named_parameters(), other.parameters(), strict=True):
        assert torch.isfinite(ours.grad).all(), name
        error = float((ours.grad - theirs.grad).norm() / theirs.grad.norm().clamp(min=1e-12))
        assert error < 5e-2, f"{name}: relative gradient error {error:.2e}"
