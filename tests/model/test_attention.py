"""The attention backends (model/attention.py) give the same numbers and gradients, and `choose_attention`
picks the one documented for each device, dtype, mode and measurement."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from bertkit import hardware
from bertkit.config import preset
from bertkit.model import BertModel
from bertkit.model.attention import CpuBmm, PaddedSDPA, PerSequence, RepaddedSDPA, VarlenFlash, choose_attention
from bertkit.model.padding import Unpadded

MASK = torch.tensor([[1] * 9, [1] * 4 + [0] * 5, [0] * 9, [1] * 7 + [0] * 2])  # row 2 is empty
HEADS, WIDTH = 4, 32


def bmm_everywhere() -> hardware.Choices:
    """Choices under which CpuBmm takes batched matmuls at every length and dtype."""
    lengths = hardware.ATTENTION_LENGTHS
    return hardware.Choices("fp32", "fp32", ("fp32", "bf16"), {"fp32": lengths, "bf16": lengths}, ())


def _context(backend, qkv: torch.Tensor, layout: Unpadded) -> torch.Tensor:
    """(N, 3D) -> (N, D) through any backend; a padded one gets the batch padded back and its key mask."""
    if backend.unpadded:
        return backend(qkv, layout, HEADS, 0.0)
    keys = MASK.bool().clone()
    keys[2, 0] = True  # the empty row attends to its padding, as RepaddedSDPA does, rather than to nothing
    return layout.unpad(backend(layout.pad(qkv), keys[:, None, None, :], HEADS, 0.0))


@pytest.mark.parametrize("backend", [RepaddedSDPA(), PaddedSDPA(), PerSequence(CpuBmm(bmm_everywhere()))], ids=repr)
def test_every_backend_equals_per_sequence_attention_with_gradients(backend):
    torch.manual_seed(0)
    layout = Unpadded.from_mask(MASK.bool())
    qkv = torch.randn(int(MASK.sum()), 3 * WIDTH, requires_grad=True)
    weights = torch.randn(int(MASK.sum()), WIDTH)
    expected = PerSequence()(qkv, layout, HEADS, 0.0)  # the CPU default
    (expected_grad,) = torch.autograd.grad((expected * weights).sum(), qkv)
    actual = _context(backend, qkv, layout)
    (grad,) = torch.autograd.grad((actual * weights).sum(), qkv)
    torch.testing.assert_close(actual, expected, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(grad, expected_grad, atol=1e-6, rtol=1e-6)
    assert torch.isfinite(grad).all()


@pytest.mark.parametrize("backend", [PaddedSDPA(), PerSequence(), RepaddedSDPA(),
                                     PerSequence(CpuBmm(bmm_everywhere()))], ids=repr)
def test_a_model_with_a_fixed_backend_equals_the_chosen_one(backend, batch):
    torch.manual_seed(0)
    model = BertModel(preset("bert-debug", vocab_size=99)).eval()
    with torch.no_grad():
        chosen = model(**batch, output_hidden_states=True)
        model.attention = backend
        fixed = model(**batch, output_hidden_states=True)
    real = batch["attention_mask"].bool()
    for a, b in zip(fixed.hidden_states, chosen.hidden_states, strict=True):
        torch.testing.assert_close(a[real], b[real], atol=1e-5, rtol=1e-5)
        assert (a[~real] == 0).all()  # padded positions are zeros whichever backend runs
    torch.testing.assert_close(fixed.pooler_output, chosen.pooler_output, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bmm_attention_equals_sdpa(dtype):
    generator = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(3, 2, 4, 64, 16, generator=generator).to(dtype)
    expected = F.scaled_dot_product_attention(q.float(), k.float(), v.float())
    tolerance = 1e-6 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(hardware.bmm_attention(q, k, v).float(), expected, atol=tolerance, rtol=tolerance)


def test_cpu_bmm_only_at_its_lengths_without_mask_or_dropout(monkeypatch):
    """With the AMD machine's measurements (tests/conftest.py): bf16 at about 49-192 tokens only."""
    calls = []
    monkeypatch.setattr(hardware, "bmm_attention",
                        lambda *qkv: calls.append(qkv[0].shape) or F.scaled_dot_product_attention(*qkv))
    backend = CpuBmm(hardware.choices(WIDTH))
    for length, dtype, mask, dropout in [(64, torch.bfloat16, None, 0.0), (64, torch.bfloat16, True, 0.0),
                                         (64, torch.bfloat16, None, 0.1), (64, torch.float32, None, 0.0),
                                         (16, torch.bfloat16, None, 0.0), (256, torch.bfloat16, None, 0.0)]:
        qkv = torch.randn(1, length, 3 * WIDTH, dtype=dtype)
        keys = torch.ones(1, 1, 1, length, dtype=torch.bool) if mask else None
        backend(qkv, keys, HEADS, dropout)
    assert calls == [(1, HEADS, 64, WIDTH // HEADS)]


def test_choose_attention_on_a_cpu(monkeypatch):
    x = torch.zeros(2, 8, WIDTH)
    with torch.no_grad():
        assert repr(choose_attention(x, padded=True, dropout_p=0.0)) == "PerSequence(PaddedSDPA())"  # fp32: no bmm here
        assert repr(choose_attention(x.bfloat16(), padded=True, dropout_p=0.0)) == "PerSequence(CpuBmm())"
        assert repr(choose_attention(x.bfloat16(), padded=False, dropout_p=0.0)) == "CpuBmm()"
        with torch.autocast("cpu", dtype=torch.bfloat16):  # evaluation inside a bf16 training loop
            assert repr(choose_attention(x, padded=True, dropout_p=0.0)) == "PerSequence(CpuBmm())"
        with torch.autocast("cpu", dtype=torch.float16):
            assert repr(choose_attention(x, padded=True, dropout_p=0.0)) == "PerSequence(PaddedSDPA())"
        monkeypatch.setenv("BERTKIT_CPU_KERNELS", "0")
        assert repr(choose_attention(x.bfloat16(), padded=True, dropout_p=0.0)) == "PerSequence(PaddedSDPA())"
    monkeypatch.delenv("BERTKIT_CPU_KERNELS")
    assert repr(choose_attention(x.bfloat16(), padded=True, dropout_p=0.0)) == "PerSequence(PaddedSDPA())"  # autograd
    assert repr(choose_attention(x, padded=False, dropout_p=0.1)) == "PaddedSDPA()"  # training


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA only")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_cuda_backends_equal_per_sequence_attention(dtype):
    torch.manual_seed(0)
    mask = MASK.clone()
    mask[2, :3] = 1  # flash attention wants every sequence non-empty
    layout = Unpadded.from_mask(mask.bool().cuda())
    qkv = torch.randn(int(mask.sum()), 3 * WIDTH, device="cuda", dtype=dtype)
    x = torch.zeros(4, 9, WIDTH, device="cuda", dtype=dtype)
    chosen = choose_attention(x, padded=True, dropout_p=0.0)
    assert type(chosen) is (VarlenFlash if dtype == torch.bfloat16 else RepaddedSDPA)
    assert type(choose_attention(x, padded=True, dropout_p=0.1)) is RepaddedSDPA
    expected = PerSequence()(qkv.float(), layout, HEADS, 0.0)
    tolerance = 2e-2 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(chosen(qkv, layout, HEADS, 0.0).float(), expected, atol=tolerance, rtol=tolerance)
