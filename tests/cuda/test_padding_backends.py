"""Attention with any padding (left, right, interior, an all-padding row, none) on CUDA, for every CUDA
backend (PaddedSDPA, RepaddedSDPA, VarlenFlash), called as BertModel calls it: outputs at real positions
and input gradients against the attention written out in float64 with the key mask, everything finite;
then whole models with each backend fixed against the CPU float64 model (the per-sequence default).
Tolerances: fp32 1e-4 (GPU kernels sum in other orders), bf16 3e-2 (attention) / 5e-2 (model)."""

from __future__ import annotations

import copy

import pytest
import torch

from bertkit.config import preset
from bertkit.model import BertModel
from bertkit.model.attention import PaddedSDPA, PerSequence, RepaddedSDPA, VarlenFlash
from bertkit.model.padding import Unpadded

from .conftest import DEVICE, cuda_only, cuda_or_cpu_check, padded_batch

pytestmark = [pytest.mark.cuda, cuda_or_cpu_check]

HEADS, HEAD_SIZE = 4, 64  # flash kernels' usual head size
PATTERNS = {  # (B, T) attention masks, 1 = real token
    "left": [[0] * 5 + [1] * 11, [0] * 15 + [1], [1] * 16],
    "right": [[1] * 11 + [0] * 5, [1] + [0] * 15, [1] * 16],
    "interior": [[1, 1, 0, 0] * 4, [1] * 7 + [0] * 2 + [1] * 7, [0] + [1] * 14 + [0]],
    "empty-row": [[1] * 10 + [0] * 6, [0] * 16, [0] * 3 + [1] * 13],
    "none": [[1] * 16] * 3,
}
BACKENDS = [
    pytest.param(PaddedSDPA(), torch.float32, id="PaddedSDPA-fp32"),
    pytest.param(PaddedSDPA(), torch.bfloat16, id="PaddedSDPA-bf16"),
    pytest.param(RepaddedSDPA(), torch.float32, id="RepaddedSDPA-fp32"),
    pytest.param(RepaddedSDPA(), torch.bfloat16, id="RepaddedSDPA-bf16"),
    pytest.param(VarlenFlash(), torch.bfloat16, id="VarlenFlash-bf16", marks=cuda_only),
]


def masked_attention(qkv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(Dh)) v over the real keys, written out: (B, T, 3D) -> (B, T, D). Masked keys
    score the lowest finite value, so an all-padding row (whose queries are padding) has no NaN."""
    batch, seq_len, three_d = qkv.shape
    q, k, v = qkv.view(batch, seq_len, 3, HEADS, HEAD_SIZE).permute(2, 0, 3, 1, 4)  # 3 x (B, A, T, Dh)
    scores = (q @ k.transpose(-1, -2)) / HEAD_SIZE ** 0.5  # (B, A, T, T)
    scores = scores.masked_fill(~mask[:, None, None, :], torch.finfo(scores.dtype).min)
    return (scores.softmax(-1) @ v).transpose(1, 2).reshape(batch, seq_len, three_d // 3)


def run_backend(backend, qkv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, T, 3D) -> (B, T, D) through `backend`, with the layout BertModel.forward gives it."""
    if backend.unpadded:
        layout = Unpadded.from_mask(mask)
        return layout.pad(backend(layout.unpad(qkv), layout, HEADS, 0.0))
    return backend(qkv, None if mask.all() else mask[:, None, None, :], HEADS, 0.0)


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize(("backend", "dtype"), BACKENDS)
def test_backend_equals_masked_attention(backend, dtype, pattern):
    mask = torch.tensor(PATTERNS[pattern], dtype=torch.bool, device=DEVICE)
    generator = torch.Generator().manual_seed(0)
    qkv = torch.randn(*mask.shape, 3 * HEADS * HEAD_SIZE, generator=generator).to(DEVICE, dtype).requires_grad_()
    weights = torch.randn(*mask.shape, HEADS * HEAD_SIZE, generator=generator).to(DEVICE) * mask[..., None]
    reference_qkv = qkv.detach().double().requires_grad_()
    expected = masked_attention(reference_qkv, mask)
    (expected_grad,) = torch.autograd.grad((expected * weights).sum(), reference_qkv)
    actual = run_backend(backend, qkv, mask)
    (grad,) = torch.autograd.grad((actual.float() * weights).sum(), qkv)
    assert torch.isfinite(actual).all() and torch.isfinite(grad).all()
    tolerance = 1e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(actual[mask].double(), expected[mask], atol=tolerance, rtol=tolerance)
    torch.testing.assert_close(grad.double(), expected_grad, atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize("pattern", ["left", "interior", "empty-row"])
@pytest.mark.parametrize(("backend", "dtype"), BACKENDS)
def test_model_with_backend_equals_cpu_float64_model(backend, dtype, pattern):
    """Hidden states at real positions, the pooled output and every parameter's gradient."""
    torch.manual_seed(0)
    config = preset("bert-debug", vocab_size=99, hidden_size=HEADS * HEAD_SIZE, num_attention_heads=HEADS,
                    intermediate_size=512)
    reference = BertModel(config).double().eval()
    reference.attention = PerSequence()
    model = copy.deepcopy(reference).float().to(DEVICE).eval()
    model.attention = backend
    batch = padded_batch(PATTERNS[pattern], vocab_size=99)
    real = batch["attention_mask"].bool()
    weights = torch.randn(*real.shape, config.hidden_size, device=DEVICE) * real[..., None]

    def forward(net: BertModel, inputs: dict, autocast: bool):
        with torch.autocast(DEVICE, dtype=torch.bfloat16, enabled=autocast):
            out = net(**inputs)
        loss = (out.last_hidden_state.double() * weights.to(out.last_hidden_state.device).double()).sum()
        loss = loss + out.pooler_output.double().sum()
        loss.backward()
        return out

    expected = forward(reference, {k: v.cpu() for k, v in batch.items()}, autocast=False)
    actual = forward(model, batch, autocast=dtype == torch.bfloat16)
    tolerance = 1e-4 if dtype == torch.float32 else 5e-2
    torch.testing.assert_close(actual.last_hidden_state[real].double().cpu(), expected.last_hidden_state[real.cpu()],
                               atol=tolerance, rtol=tolerance)
    torch.testing.assert_close(actual.pooler_output.double().cpu(), expected.pooler_output, atol=tolerance,
                               rtol=tolerance)
    assert (actual.last_hidden_state[~real] == 0).all()
    for (name, ours), theirs in zip(model.named_parameters(), reference.parameters(), strict=True):
        assert ours.grad is not None and torch.isfinite(ours.grad).all(), name
        error = float((ours.grad.double().cpu() - theirs.grad).norm() / theirs.grad.norm().clamp(min=1e-12))
        assert error < tolerance, f"{name}: relative gradient error {error:.2e}"

