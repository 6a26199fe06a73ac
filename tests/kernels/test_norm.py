"""dropout_add_layer_norm: the Triton kernels (interpreted on the CPU) against plain torch with the same keep
mask; the public op (the reference path on the CPU) against F.layer_norm(residual + dropout(x)); the dropout
statistics; the mask replayed by the backward and by torch.utils.checkpoint."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from bertkit.kernels import norm

from .conftest import DEVICE, needs_triton, poisoned, tolerance

EPS = 1e-12  # BERT's layer_norm_eps
FP32, BF16 = torch.float32, torch.bfloat16


def _inputs(rows: int, d: int, x_dtype: torch.dtype, residual_dtype: torch.dtype | None, device: torch.device,
            seed: int = 0) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, d, generator=generator).to(device, x_dtype)
    residual = (torch.randn(rows, d, generator=generator).to(device, residual_dtype)
                if residual_dtype is not None else None)
    weight = (1 + 0.5 * torch.randn(d, generator=generator)).to(device)
    bias = (0.1 * torch.randn(d, generator=generator)).to(device)
    return x, residual, weight, bias


def _composition(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, bias: torch.Tensor,
                 keep: torch.Tensor, p: float) -> torch.Tensor:
    """Plain torch in fp32: LayerNorm(residual + x * keep / (1 - p)), the dropout given by its mask."""
    h = x.float() * keep / (1 - p) if p > 0 else x.float()
    if residual is not None:
        h = h + residual.float()
    return F.layer_norm(h, h.shape[-1:], weight, bias, EPS)


# (rows, D, x dtype, residual dtype, output dtype, p): D 48 and 768 are not powers of two, 37 rows no multiple
# of anything (nor of the backward's rows per program).
LAUNCH_CASES = [
    (37, 48, FP32, None, FP32, 0.0),
    (37, 48, FP32, FP32, FP32, 0.25),
    (6, 768, FP32, FP32, FP32, 0.0),
    (37, 48, BF16, BF16, BF16, 0.25),
    (6, 768, BF16, BF16, BF16, 0.1),
    (37, 48, BF16, FP32, FP32, 0.1),  # a bf16 branch into an fp32 residual stream
    (37, 48, BF16, None, BF16, 0.5),
]


@needs_triton
@pytest.mark.parametrize(("rows", "d", "x_dtype", "residual_dtype", "out_dtype", "p"), LAUNCH_CASES)
def test_triton_kernels_match_torch_with_the_same_mask(rows, d, x_dtype, residual_dtype, out_dtype, p):
    x, residual, weight, bias = _inputs(rows, d, x_dtype, residual_dtype, DEVICE)
    seed = torch.tensor([1234], device=DEVICE)
    y, h = poisoned(rows, d, dtype=out_dtype), poisoned(rows, d, dtype=out_dtype)
    mean, rstd = poisoned(rows, dtype=FP32), poisoned(rows, dtype=FP32)
    norm.launch_forward(x, residual, weight, bias, seed, p, EPS, y, h, mean, rstd)

    keep = norm.dropout_keep_mask(seed, rows * d, p).reshape(rows, d).float()
    h_expected = x.float() * keep / (1 - p) if p > 0 else x.float()
    if residual is not None:
        h_expected = h_expected + residual.float()
    torch.testing.assert_close(h.float(), h_expected, **tolerance(out_dtype))
    torch.testing.assert_close(mean, h_expected.mean(-1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(rstd, torch.rsqrt(h_expected.var(-1, unbiased=False) + EPS), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(y.float(), _composition(x, residual, weight, bias, keep, p), **tolerance(out_dtype))

    # The backward from what the forward saved, against torch's LayerNorm backward at that h.
    dy = torch.randn(rows, d, generator=torch.Generator().manual_seed(1)).to(DEVICE, out_dtype)
    dx, dweight, dbias = poisoned(rows, d, dtype=x_dtype), poisoned(d, dtype=FP32), poisoned(d, dtype=FP32)
    dresidual = poisoned(rows, d, dtype=residual_dtype) if residual_dtype is not None else None
    norm.launch_backward(dy, h, mean, rstd, weight, seed, p, dx, dresidual, dweight, dbias)

    leaves = [h.float().requires_grad_(), weight.clone().requires_grad_(), bias.clone().requires_grad_()]
    F.layer_norm(leaves[0], (d,), leaves[1], leaves[2], EPS).backward(dy.float())
    dh = leaves[0].grad
    torch.testing.assert_close(dx.float(), dh * keep / (1 - p) if p > 0 else dh, **tolerance(x_dtype))
    if dresidual is not None:
        torch.testing.assert_close(dresidual.float(), dh, **tolerance(residual_dtype))
    # dweight sums dy * xhat over rows, xhat from the saved h: as precise as h's dtype
    torch.testing.assert_close(dweight, leaves[1].grad, **(tolerance(out_dtype) if out_dtype != FP32 else
                                                            {"rtol": 1e-4, "atol": 1e-4}))
    torch.testing.assert_close(dbias, leaves[2].grad, rtol=1e-4, atol=1e-4)


@needs_triton
def test_triton_backward_zeroes_exactly_the_dropped_elements():
    rows, d, p = 37, 48, 0.3
    x, residual, weight, bias = _inputs(rows, d, FP32, FP32, DEVICE)
    seed = torch.tensor([77], device=DEVICE)
    y, h, mean, rstd = (torch.empty(rows, d, device=DEVICE), torch.empty(rows, d, device=DEVICE),
                        torch.empty(rows, device=DEVICE), torch.empty(rows, device=DEVICE))
    norm.launch_forward(x, residual, weight, bias, seed, p, EPS, y, h, mean, rstd)
    dx, dresidual = torch.empty_like(x), torch.empty_like(x)
    dweight, dbias = torch.empty_like(weight), torch.empty_like(weight)
    norm.launch_backward(torch.randn_like(x), h, mean, rstd, weight, seed, p, dx, dresidual, dweight, dbias)
    kept = norm.dropout_keep_mask(seed, rows * d, p).reshape(rows, d)
    assert torch.equal(h == residual, ~kept)  # dropped: h is the residual alone
    assert torch.equal(dx == 0, ~kept)


def _binomial_ok(kept: torch.Tensor, p: float, sigmas: float = 5.0) -> bool:
    n = kept.numel()
    return abs(kept.float().mean().item() - (1 - p)) < sigmas * math.sqrt(p * (1 - p) / n)


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_reference_mask_keeps_one_minus_p_and_depends_on_the_seed(p):
    masks = [norm.reference_keep_mask(torch.tensor([seed]), 100_000, p) for seed in (3, 4)]
    assert all(_binomial_ok(mask, p) for mask in masks)
    agree = (masks[0] == masks[1]).float().mean().item()  # independent masks agree at p^2 + (1-p)^2
    assert abs(agree - (p * p + (1 - p) ** 2)) < 0.01
    assert torch.equal(masks[0], norm.reference_keep_mask(torch.tensor([3]), 100_000, p))


@needs_triton
@pytest.mark.parametrize("p", [0.1, 0.5])
def test_triton_mask_keeps_one_minus_p_and_depends_on_the_seed(p):
    masks = [norm.dropout_keep_mask(torch.tensor([seed], device=DEVICE), 32_768, p).cpu() for seed in (3, 4)]
    assert all(_binomial_ok(mask, p) for mask in masks)
    agree = (masks[0] == masks[1]).float().mean().item()
    assert abs(agree - (p * p + (1 - p) ** 2)) < 0.01


# ---------------------------------------------------------------- the public op (reference path, CPU)


@pytest.mark.parametrize(("x_dtype", "residual_dtype", "out_dtype", "p"), [
    (FP32, FP32, None, 0.0), (FP32, FP32, None, 0.2), (FP32, None, None, 0.2), (BF16, FP32, FP32, 0.1),
    (BF16, BF16, None, 0.1)])
def test_op_matches_layer_norm_of_residual_plus_dropout(x_dtype, residual_dtype, out_dtype, p):
    x, residual, weight, bias = _inputs(5, 48, x_dtype, residual_dtype, torch.device("cpu"))
    leaves = [t.clone().requires_grad_() for t in (x, residual, weight, bias) if t is not None]
    theirs = [t.detach().clone().requires_grad_() for t in leaves]
    torch.manual_seed(11)
    y = norm.dropout_add_layer_norm(leaves[0], leaves[1] if residual is not None else None, *leaves[-2:], p, EPS,
                                    out_dtype=out_dtype)
    assert y.dtype == (out_dtype or x_dtype)

    torch.manual_seed(11)  # the same draw: the seed the op took
    keep = norm.reference_keep_mask(norm.draw_seed(torch.device("cpu")), x.numel(), p).reshape(x.shape).float()
    expected = _composition(theirs[0], theirs[1] if residual is not None else None, *theirs[-2:], keep, p)
    torch.testing.assert_close(y.float(), expected, **tolerance(y.dtype))

    dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(2))
    y.backward(dy.to(y.dtype))
    expected.backward(dy.to(y.dtype).float())
    for ours, reference in zip(leaves, theirs):
        assert ours.grad is not None and ours.grad.dtype == ours.dtype
        # a gradient is as precise as its dtype and as h, saved in y's dtype
        tol = tolerance(ours.dtype if ours.dtype != FP32 else y.dtype)
        torch.testing.assert_close(ours.grad.float(), reference.grad.float(), **tol)


def test_op_gradcheck_in_float64():
    x, residual, weight, bias = (t.double().requires_grad_() for t in _inputs(3, 16, FP32, FP32, torch.device("cpu")))
    assert torch.autograd.gradcheck(lambda *a: norm.dropout_add_layer_norm(*a, 0.0, 1e-5), (x, residual, weight, bias))
    seed = torch.tensor([5])  # a fixed seed: the same mask at every evaluation
    op = torch.ops.bertkit.dropout_add_layer_norm_fwd
    assert torch.autograd.gradcheck(lambda x, r, w, b: op(x, r, w, b, seed, 0.3, 1e-5, torch.float64)[0],
                                    (x, residual, weight, bias))
    assert torch.autograd.gradcheck(lambda x, w, b: op(x, None, w, b, seed, 0.3, 1e-5, torch.float64)[0],
                                    (x, weight, bias))


def test_op_registration_passes_opcheck():
    x, residual, weight, bias = _inputs(4, 16, BF16, FP32, torch.device("cpu"))
    seed = torch.tensor([9])
    torch.library.opcheck(torch.ops.bertkit.dropout_add_layer_norm_fwd,
                          (x, residual, weight.clone().requires_grad_(), bias, seed, 0.2, EPS, FP32))
    y, h, mean, rstd = torch.ops.bertkit.dropout_add_layer_norm_fwd(x, residual, weight, bias, seed, 0.2, EPS, FP32)
    torch.library.opcheck(torch.ops.bertkit.dropout_add_layer_norm_bwd,
                          (torch.randn_like(y), h, mean, rstd, weight, seed, 0.2, BF16, FP32))


def test_op_backward_zeroes_exactly_the_dropped_elements():
    p = 0.3
    x = torch.ones(64, 32, requires_grad=True)
    torch.manual_seed(0)
    y = norm.dropout_add_layer_norm(x, None, torch.ones(32), torch.zeros(32), p, EPS)
    dropped = y < 0  # a row of kept 1/(1-p) and dropped 0s: the dropped ones normalize below the mean
    assert _binomial_ok(~dropped, p)
    y.backward(torch.randn_like(y))
    assert torch.equal(x.grad == 0, dropped)


def test_checkpoint_replays_the_mask():
    x, residual, weight, bias = (t.requires_grad_() for t in _inputs(6, 48, FP32, FP32, torch.device("cpu")))

    def block(x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return norm.dropout_add_layer_norm(x, residual, weight, bias, 0.3, EPS)

    grads = []
    for wrapped in (block, lambda *a: checkpoint(block, *a, use_reentrant=False)):
        torch.manual_seed(21)
        wrapped(x, residual).square().sum().backward()
        grads.append([t.grad.clone() for t in (x, residual, weight, bias)])
        for t in (x, residual, weight, bias):
            t.grad = None
    for plain, checkpointed in zip(*grads):
        assert torch.equal(plain, checkpointed)


def test_zero_dropout_takes_no_seed():
    x, residual, weight, bias = _inputs(3, 16, FP32, FP32, torch.device("cpu"))
    torch.manual_seed(0)
    norm.dropout_add_layer_norm(x, residual, weight, bias, 0.0, EPS)
    after = torch.rand(1)
    torch.manual_seed(0)
    assert torch.equal(after, torch.rand(1))  # the default generator was not advanced


@pytest.mark.parametrize("p", [-0.1, 1.0])
def test_dropout_probability_out_of_range_is_refused(p):
    x, residual, weight, bias = _inputs(3, 16, FP32, FP32, torch.device("cpu"))
    with pytest.raises(ValueError, match="dropout probability"):
        norm.dropout_add_layer_norm(x, residual, weight, bias, p, EPS)


@needs_triton
def test_cuda_implementation_runs_the_kernels_on_any_leading_shape():
    """The op's "cuda" kernel (flatten, allocate, launch, reshape), run on the interpreter's CPU tensors."""
    x, residual, weight, bias = _inputs(2 * 7, 48, BF16, FP32, DEVICE)
    x, residual = x.reshape(2, 7, 48), residual.reshape(7, 2, 48).transpose(0, 1)  # residual not contiguous
    seed, p = torch.tensor([31], device=DEVICE), 0.2
    y, h, mean, rstd = norm._forward_cuda(x, residual, weight, bias, seed, p, EPS, FP32)
    assert y.shape == h.shape == x.shape and mean.shape == rstd.shape == (2, 7) and y.dtype == h.dtype == FP32
    keep = norm.dropout_keep_mask(seed, x.numel(), p).reshape(x.shape).float()
    torch.testing.assert_close(y, _composition(x, residual, weight, bias, keep, p), **tolerance(BF16))

    dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    dx, dresidual, dweight, dbias = norm._backward_cuda(dy, h, mean, rstd, weight, seed, p, BF16, FP32)
    assert dx.dtype == BF16 and dresidual.dtype == FP32 and dx.shape == dresidual.shape == x.shape
    leaves = [h.detach().requires_grad_(), weight.clone().requires_grad_(), bias.clone().requires_grad_()]
    F.layer_norm(leaves[0], (48,), leaves[1], leaves[2], EPS).backward(dy)
    torch.testing.assert_close(dresidual, leaves[0].grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(dx.float(), leaves[0].grad * keep / (1 - p), **tolerance(BF16))
    torch.testing.assert_close(dweight, leaves[1].grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(dbias, leaves[2].grad, rtol=1e-4, atol=1e-4)
    _, no_residual, _, _ = norm._backward_cuda(dy, h, mean, rstd, weight, seed, p, BF16, None)
    assert no_residual.numel() == 0
