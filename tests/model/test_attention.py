"""The attention backends (model/attention.py) give the same numbers and gradients for any padding mask,
`Dispatch` picks the one documented for each device, dtype, mode and measurement, and a model's forward
decides from its inputs alone (no probe, no environment, no cache file)."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch
import torch.nn.functional as F

from bertkit.config import preset
from bertkit.kernels import attention as attention_kernels
from bertkit.kernels import dropout as dropout_kernels
from bertkit.model import BertModel, accelerate
from bertkit.model.attention import BatchedBmm, CpuBmm, Dispatch, PaddedSDPA, PerSequence, RepaddedSDPA, VarlenFlash
from bertkit.model.padding import Unpadded
from bertkit.runtime import probe

HEADS, WIDTH = 4, 32


def bmm_everywhere() -> probe.Choices:
    """Choices under which CpuBmm takes batched matmuls at every length and dtype."""
    lengths = probe.ATTENTION_LENGTHS
    return probe.Choices("fp32", "fp32", ("fp32", "bf16"), {"fp32": lengths, "bf16": lengths}, ())


PATTERNS = {  # (B, T) attention masks, 1 = real token
    "left": [[0, 0, 1, 1, 1, 1, 1], [0, 0, 0, 0, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]],
    "right": [[1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1, 1]],
    "interior": [[1, 1, 0, 0, 1, 1, 1], [1, 0, 1, 0, 1, 0, 1], [0, 1, 1, 1, 1, 1, 0]],
    "empty-row": [[1, 1, 1, 1, 1, 0, 0], [0, 0, 0, 0, 0, 0, 0], [0, 0, 1, 1, 1, 1, 1]],
    "none": [[1, 1, 1, 1, 1, 1, 1]] * 3,
}
needs_cuda = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA only")]
BACKENDS = [  # (backend, device, dtype): every backend, as the model calls it
    pytest.param(PaddedSDPA(), "cpu", torch.float32, id="PaddedSDPA"),
    pytest.param(CpuBmm(bmm_everywhere()), "cpu", torch.float32, id="CpuBmm"),
    pytest.param(PerSequence(), "cpu", torch.float32, id="PerSequence"),
    pytest.param(PerSequence(CpuBmm(bmm_everywhere())), "cpu", torch.float32, id="PerSequence(CpuBmm)"),
    pytest.param(RepaddedSDPA(), "cpu", torch.float32, id="RepaddedSDPA"),
    pytest.param(BatchedBmm(), "cpu", torch.float32, id="BatchedBmm"),
    pytest.param(BatchedBmm(), "cpu", torch.bfloat16, id="BatchedBmm-bf16"),
    pytest.param(PaddedSDPA(), "cuda", torch.float32, id="cuda-PaddedSDPA", marks=needs_cuda),
    pytest.param(PerSequence(), "cuda", torch.float32, id="cuda-PerSequence", marks=needs_cuda),
    pytest.param(RepaddedSDPA(), "cuda", torch.float32, id="cuda-RepaddedSDPA", marks=needs_cuda),
    pytest.param(VarlenFlash(), "cuda", torch.bfloat16, id="cuda-VarlenFlash-bf16", marks=needs_cuda),
]


def reference_attention(qkv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(Dh) + mask) v written out, (B, T, 3D) -> (B, T, D). Masked keys get the
    lowest finite score, not -inf, so a row with no real key has no NaN (its queries are padding)."""
    batch, seq_len, three_d = qkv.shape
    head_size = three_d // (3 * HEADS)
    q, k, v = qkv.view(batch, seq_len, 3, HEADS, head_size).permute(2, 0, 3, 1, 4)  # 3 x (B, A, T, Dh)
    scores = (q @ k.transpose(-1, -2)) / head_size ** 0.5  # (B, A, T, T)
    scores = scores.masked_fill(~mask[:, None, None, :], torch.finfo(scores.dtype).min)
    context = scores.softmax(-1) @ v  # (B, A, T, Dh)
    return context.transpose(1, 2).reshape(batch, seq_len, three_d // 3)


def run_backend(backend, qkv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, T, 3D) -> (B, T, D) through `backend` with the layout BertModel.forward gives it."""
    if backend.unpadded:
        layout = Unpadded.from_mask(mask)
        return layout.pad(backend(layout.unpad(qkv), layout, HEADS, 0.0))
    return backend(qkv, None if mask.all() else mask[:, None, None, :], HEADS, 0.0)


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize(("backend", "device", "dtype"), BACKENDS)
def test_every_backend_equals_masked_softmax_for_any_padding(backend, device, dtype, pattern):
    """Outputs at real positions and input gradients equal the written-out attention, for left, right
    and interior padding, an all-padding row and a full batch (no NaN anywhere)."""
    mask = torch.tensor(PATTERNS[pattern], dtype=torch.bool, device=device)
    generator = torch.Generator().manual_seed(0)
    qkv = torch.randn(*mask.shape, 3 * WIDTH, generator=generator).to(device, dtype).requires_grad_()
    weights = torch.randn(*mask.shape, WIDTH, generator=generator).to(device) * mask[..., None]  # real only
    reference_qkv = qkv.detach().double().requires_grad_()
    expected = reference_attention(reference_qkv, mask)
    (expected_grad,) = torch.autograd.grad((expected * weights).sum(), reference_qkv)
    actual = run_backend(backend, qkv, mask)
    (grad,) = torch.autograd.grad((actual.float() * weights).sum(), qkv)
    tolerance = 1e-5 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(actual[mask].double(), expected[mask], atol=tolerance, rtol=tolerance)
    torch.testing.assert_close(grad.double(), expected_grad, atol=tolerance, rtol=tolerance)
    assert torch.isfinite(actual).all() and torch.isfinite(grad).all()


@pytest.mark.parametrize("backend", [PaddedSDPA(), PerSequence(), RepaddedSDPA(),
                                     PerSequence(CpuBmm(bmm_everywhere())), BatchedBmm()], ids=repr)
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
    actual = attention_kernels.bmm_attention(q, k, v).float()
    torch.testing.assert_close(actual, expected, atol=tolerance, rtol=tolerance)


def test_batched_bmm_drops_attention_weights_as_bert_does():
    """With attention dropout, BatchedBmm's output is the written-out attention with the counter-based dropout
    (kernels.dropout, the same seed drawn) applied to the weights after the softmax, and its gradient flows
    through the kept weights only."""
    mask = torch.tensor(PATTERNS["right"], dtype=torch.bool)
    qkv = torch.randn(*mask.shape, 3 * WIDTH, generator=torch.Generator().manual_seed(0)).requires_grad_()
    torch.manual_seed(7)
    actual = BatchedBmm()(qkv, mask[:, None, None, :], HEADS, 0.25)
    batch, length, _ = qkv.shape
    q, k, v = qkv.detach().view(batch, length, 3, HEADS, WIDTH // HEADS).permute(2, 0, 3, 1, 4)
    scores = (q @ k.transpose(-1, -2)) / (WIDTH // HEADS) ** 0.5
    weights = scores.masked_fill(~mask[:, None, None, :], torch.finfo(scores.dtype).min).softmax(-1)
    torch.manual_seed(7)
    expected = (dropout_kernels.dropout(weights.reshape(batch * HEADS, length, length), 0.25).view_as(weights) @ v)
    expected = expected.transpose(1, 2).reshape(batch, length, WIDTH)
    torch.testing.assert_close(actual[mask], expected[mask], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(actual[mask], run_backend(PaddedSDPA(), qkv.detach(), mask)[mask], atol=1e-3)
    actual.sum().backward()
    assert torch.isfinite(qkv.grad).all()


def test_cpu_bmm_only_at_its_lengths_without_mask_or_dropout(monkeypatch):
    """With the AMD machine's measurements (tests/conftest.py): bf16 at about 49-192 tokens only."""
    calls = []
    monkeypatch.setattr(attention_kernels, "bmm_attention",
                        lambda *qkv: calls.append(qkv[0].shape) or F.scaled_dot_product_attention(*qkv))
    backend = CpuBmm(probe.choices(WIDTH))
    for length, dtype, mask, dropout in [(64, torch.bfloat16, None, 0.0), (64, torch.bfloat16, True, 0.0),
                                         (64, torch.bfloat16, None, 0.1), (64, torch.float32, None, 0.0),
                                         (16, torch.bfloat16, None, 0.0), (256, torch.bfloat16, None, 0.0)]:
        qkv = torch.randn(1, length, 3 * WIDTH, dtype=dtype)
        keys = torch.ones(1, 1, 1, length, dtype=torch.bool) if mask else None
        backend(qkv, keys, HEADS, dropout)
    assert calls == [(1, HEADS, 64, WIDTH // HEADS)]


def test_dispatch_for_training_on_a_cpu():
    """A backward will run (the embeddings require gradients, grad mode on): BatchedBmm on the padded or full batch
    wherever the profile measured bmm's forward + backward faster, without attention dropout or with it as the pass
    has it (tests/conftest.py's AMD machine: bf16 at 32-256 tokens, 32-128 with dropout, fp32 at 32); SDPA
    elsewhere, without measured choices, and in inference."""
    measured = Dispatch(probe.choices(WIDTH))
    def chosen(length, dtype, padded=True, dropout_p=0.0, grad=True, backend=measured, fill=1.0):
        x = torch.zeros(2, length, WIDTH, dtype=dtype).requires_grad_(grad)
        return repr(backend.select(x, padded=padded, dropout_p=dropout_p, fill=fill))
    for length in (24, 64, 128, 256):
        assert chosen(length, torch.bfloat16) == "BatchedBmm()"
    assert chosen(64, torch.bfloat16, padded=False) == "BatchedBmm()"
    assert chosen(64, torch.bfloat16, padded=False, dropout_p=0.1) == "BatchedBmm()"  # measured with dropout too
    assert chosen(256, torch.bfloat16, dropout_p=0.1) == "PerSequence(PaddedSDPA())"  # with dropout: slower there
    assert chosen(64, torch.bfloat16, fill=0.875) == "BatchedBmm()"
    assert chosen(64, torch.bfloat16, fill=0.8) == "PerSequence(PaddedSDPA())"  # the dense layers would run on padding
    assert chosen(512, torch.bfloat16) == "PerSequence(PaddedSDPA())"  # measured slower there
    assert chosen(32, torch.float32) == "BatchedBmm()" and chosen(64, torch.float32) == "PerSequence(PaddedSDPA())"
    assert chosen(64, torch.bfloat16, grad=False) == "PerSequence(CpuBmm())"  # no backward: inference's verdict
    with torch.no_grad():
        assert chosen(64, torch.bfloat16) == "PerSequence(CpuBmm())"
    with torch.autocast("cpu", dtype=torch.bfloat16):  # an fp32 model training under bf16 autocast
        assert chosen(64, torch.float32) == "BatchedBmm()"
    assert chosen(64, torch.bfloat16, backend=Dispatch()) == "PerSequence(PaddedSDPA())"


def test_dispatch_on_a_cpu():
    """Measured choices (tests/conftest.py's AMD machine: bmm in bf16 only) give CpuBmm in inference;
    without them, or with dropout or autograd, SDPA."""
    measured, plain = Dispatch(probe.choices(WIDTH)), Dispatch()
    x = torch.zeros(2, 8, WIDTH)
    assert repr(measured.select(x, padded=True, dropout_p=0.0)) == "PerSequence(PaddedSDPA())"  # fp32: no bmm
    assert repr(measured.select(x.bfloat16(), padded=True, dropout_p=0.0)) == "PerSequence(CpuBmm())"
    assert repr(measured.select(x.bfloat16(), padded=False, dropout_p=0.0)) == "CpuBmm()"
    with torch.autocast("cpu", dtype=torch.bfloat16):  # evaluation inside a bf16 training loop
        assert repr(measured.select(x, padded=True, dropout_p=0.0)) == "PerSequence(CpuBmm())"
    with torch.autocast("cpu", dtype=torch.float16):
        assert repr(measured.select(x, padded=True, dropout_p=0.0)) == "PerSequence(PaddedSDPA())"
    plain_only = Dispatch(dataclasses.replace(probe.choices(WIDTH), bmm_training={}))
    trained = x.bfloat16().requires_grad_()  # a backward will run through it: training's own verdict
    assert repr(plain_only.select(trained, padded=True, dropout_p=0.0)) == "PerSequence(PaddedSDPA())"
    assert repr(measured.select(x.bfloat16(), padded=False, dropout_p=0.1)) == "PaddedSDPA()"  # training
    assert repr(plain.select(x.bfloat16(), padded=True, dropout_p=0.0)) == "PerSequence(PaddedSDPA())"
    assert repr(plain.select(x, padded=False, dropout_p=0.0)) == "PaddedSDPA()"
    fixed = PerSequence()
    assert fixed.select(x, padded=False, dropout_p=0.1) is fixed  # a fixed backend runs itself


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA only")
def test_dispatch_on_cuda():
    x = torch.zeros(4, 9, WIDTH, device="cuda")
    for dispatch in (Dispatch(), Dispatch(bmm_everywhere())):  # CPU choices never apply on CUDA
        assert type(dispatch.select(x.bfloat16(), padded=True, dropout_p=0.0)) is VarlenFlash
        assert type(dispatch.select(x.bfloat16(), padded=True, dropout_p=0.1)) is VarlenFlash  # with its dropout
        assert type(dispatch.select(x, padded=True, dropout_p=0.0)) is RepaddedSDPA  # fp32
        with torch.autocast("cuda", dtype=torch.bfloat16):
            assert type(dispatch.select(x, padded=True, dropout_p=0.0)) is VarlenFlash
        assert type(dispatch.select(x, padded=False, dropout_p=0.0)) is PaddedSDPA


class _NoBertkitVariables(dict):
    """os.environ for one test: reading any BERTKIT_ variable fails."""

    def _check(self, key: object) -> None:
        if isinstance(key, str) and key.startswith("BERTKIT_"):
            raise AssertionError(f"{key} read inside a forward pass")

    def __getitem__(self, key):
        self._check(key)
        return super().__getitem__(key)

    def __contains__(self, key) -> bool:
        self._check(key)
        return super().__contains__(key)

    def get(self, key, default=None):
        self._check(key)
        return super().get(key, default)


def _forbidden(*args, **kwargs):
    raise AssertionError("the hardware probe, its cache or the environment was consulted inside a forward pass")


@pytest.mark.parametrize("mode", ["eval-fp32", "eval-bf16-autocast", "train", "train-measured", "accelerated-copy"])
def test_a_forward_runs_no_probe_and_reads_no_environment(mode, batch, monkeypatch):
    """The backend and kernels are chosen by whoever builds the run; a forward pass (plain model in eval
    or training mode, or an inference copy once built) decides from its inputs alone."""
    torch.manual_seed(0)
    model = BertModel(preset("bert-debug", vocab_size=99))
    if mode == "accelerated-copy":
        model = accelerate.accelerate_for_inference(model)  # the probe (its cached result) is read here
    if mode == "train-measured":  # as prepare_training gives it: BatchedBmm runs under bf16 autocast below
        accelerate.attend_as_measured_for_training(model, probe.choices(WIDTH))
    with monkeypatch.context() as patch:
        for name in ("choices", "measurements", "measure", "auto_precision"):
            patch.setattr(probe, name, _forbidden)
        patch.setattr(accelerate, "cpu_kernels_enabled", _forbidden)
        patch.setattr(os, "environ", _NoBertkitVariables(os.environ))
        for inputs in (batch, {**batch, "attention_mask": torch.ones_like(batch["attention_mask"])}):
            if mode.startswith("train"):
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mode == "train-measured"):
                    model.train()(**inputs).last_hidden_state.sum().backward()
                continue
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=mode == "eval-bf16-autocast"):
                model.eval()(**inputs)


