"""masked_lm_loss: the Triton kernels (interpreted on the CPU) and the public op (the reference path on the CPU)
against F.cross_entropy on fp32 logits, weighted; zero-weight rows, argmax ties, large logits."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from bertkit.kernels import cross_entropy as ce

from .conftest import DEVICE, needs_triton, poisoned, tolerance

FP32, BF16 = torch.float32, torch.bfloat16


def _inputs(rows: int, v: int, dtype: torch.dtype, device: torch.device, scale: float = 3.0
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Logits, targets and weights; row 2 is a padding entry (weight 0, target 0, logits garbage)."""
    generator = torch.Generator().manual_seed(0)
    logits = scale * torch.randn(rows, v, generator=generator)
    targets = torch.randint(0, v, (rows,), generator=generator)
    targets[1] = logits[1].argmax()  # one row predicted right
    weights = torch.ones(rows)
    weights[2], targets[2] = 0.0, 0
    logits[2, :3] = torch.tensor([float("nan"), float("inf"), -float("inf")])
    return logits.to(device, dtype), targets.to(device), weights.to(device)


def _expected(logits: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, correct) per row: torch's cross entropy on fp32 logits, weighted; padding rows 0."""
    live = weights != 0
    loss = torch.zeros_like(weights)
    loss[live] = weights[live] * F.cross_entropy(logits[live].float(), targets[live], reduction="none")
    correct = torch.where(live, weights * (logits.argmax(-1) == targets).float(), 0.0)
    return loss, correct


def _expected_grad(logits: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor, dloss: torch.Tensor
                   ) -> torch.Tensor:
    live = weights != 0
    leaf = logits[live].float().requires_grad_()
    (dloss[live] * weights[live] * F.cross_entropy(leaf, targets[live], reduction="none")).sum().backward()
    grad = torch.zeros(logits.shape, dtype=FP32, device=logits.device)
    grad[live] = leaf.grad
    return grad


# V 5000: two blocks of 4096, the second partly masked; V 37: one block, partly masked.
@needs_triton
@pytest.mark.parametrize("dtype", [FP32, BF16])
@pytest.mark.parametrize(("rows", "v"), [(7, 5000), (13, 37)])
def test_triton_kernels_match_weighted_cross_entropy(rows, v, dtype):
    logits, targets, weights = _inputs(rows, v, dtype, DEVICE)
    loss, correct, lse = (poisoned(rows, dtype=FP32) for _ in range(3))
    ce.launch_forward(logits, targets, weights, loss, correct, lse)
    expected_loss, expected_correct = _expected(logits, targets, weights)
    torch.testing.assert_close(loss, expected_loss, rtol=1e-5, atol=1e-5)
    assert torch.equal(correct, expected_correct) and correct[1] == 1
    live = weights != 0
    torch.testing.assert_close(lse[live], torch.logsumexp(logits[live].float(), -1), rtol=1e-5, atol=1e-5)

    dloss = torch.rand(rows, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    dlogits = poisoned(rows, v, dtype=dtype)
    ce.launch_backward(dloss, logits, targets, weights, lse, dlogits)
    assert dlogits.dtype == dtype and torch.equal(dlogits[2], torch.zeros_like(dlogits[2]))
    torch.testing.assert_close(dlogits.float(), _expected_grad(logits, targets, weights, dloss), **tolerance(dtype))


def _ties(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Row 0: equal maxima at 10 and 20 (one block); row 1: at 100 and 4500 (two blocks of 4096); row 2: the
    same, the target the later one."""
    logits = torch.zeros(3, 5000)
    logits[0, [10, 20]] = 5.0
    logits[1:, [100, 4500]] = 5.0
    return logits.to(device, BF16), torch.tensor([10, 100, 4500], device=device)


@needs_triton
def test_triton_argmax_ties_pick_the_first_index():
    logits, targets = _ties(DEVICE)
    weights = torch.ones(3, device=DEVICE)
    loss, correct, lse = (poisoned(3, dtype=FP32) for _ in range(3))
    ce.launch_forward(logits, targets, weights, loss, correct, lse)
    assert correct.tolist() == [1.0, 1.0, 0.0]


def test_reference_argmax_ties_pick_the_first_index():
    logits, targets = _ties(torch.device("cpu"))
    _, correct = ce.masked_lm_loss(logits, targets, torch.ones(3))
    assert correct.item() == 2.0


@needs_triton
def test_triton_large_bf16_logits_stay_finite():
    logits, targets, weights = _inputs(5, 300, BF16, DEVICE)
    logits = torch.where(logits.float() > 0, 1e4, -1e4).to(BF16)
    logits[2] = 0.0
    loss, correct, lse = (poisoned(5, dtype=FP32) for _ in range(3))
    ce.launch_forward(logits, targets, weights, loss, correct, lse)
    assert torch.isfinite(loss).all() and torch.isfinite(lse).all()
    torch.testing.assert_close(loss, _expected(logits, targets, weights)[0], rtol=1e-5, atol=1e-2)
    dlogits = poisoned(5, 300, dtype=BF16)
    ce.launch_backward(torch.ones(5, device=DEVICE), logits, targets, weights, lse, dlogits)
    assert torch.isfinite(dlogits).all()
    torch.testing.assert_close(dlogits.float(), _expected_grad(logits, targets, weights, torch.ones(5, device=DEVICE)),
                               **tolerance(BF16))


# ---------------------------------------------------------------- the public op (reference path, CPU)


@pytest.mark.parametrize("dtype", [FP32, BF16])
def test_op_matches_weighted_cross_entropy(dtype):
    logits, targets, weights = _inputs(9, 50, dtype, torch.device("cpu"))
    weights[4] = 0.5
    leaf = logits.clone().requires_grad_()
    loss, correct = ce.masked_lm_loss(leaf, targets, weights)
    expected_loss, expected_correct = _expected(logits, targets, weights)
    assert loss.dtype == FP32 and loss.dim() == 0 and correct.dtype == FP32 and not correct.requires_grad
    torch.testing.assert_close(loss, expected_loss.sum(), rtol=1e-5, atol=1e-5)
    assert correct.item() == expected_correct.sum().item() >= 1
    (2.0 * loss).backward()
    assert leaf.grad.dtype == dtype and torch.equal(leaf.grad[2], torch.zeros_like(leaf.grad[2]))
    torch.testing.assert_close(leaf.grad.float(), _expected_grad(logits, targets, weights, torch.full((9,), 2.0)),
                               **tolerance(dtype))


def test_op_large_bf16_logits_stay_finite():
    logits, targets, weights = _inputs(5, 300, BF16, torch.device("cpu"))
    leaf = torch.where(logits.float() > 0, 1e4, -1e4).to(BF16).requires_grad_()
    loss, _ = ce.masked_lm_loss(leaf, targets, weights)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(leaf.grad).all()


def test_op_gradcheck_in_float64_and_opcheck():
    logits, targets, weights = _inputs(4, 11, torch.float64, torch.device("cpu"))
    logits[2] = 0.0  # gradcheck perturbs every input, NaN included
    weights = weights.double()
    assert torch.autograd.gradcheck(lambda x: ce.masked_lm_loss(x, targets, weights)[0],
                                    (logits.requires_grad_(),))
    logits, targets, weights = _inputs(4, 11, BF16, torch.device("cpu"))
    torch.library.opcheck(torch.ops.bertkit.masked_lm_loss_fwd, (logits.requires_grad_(), targets, weights))
    _, _, lse = torch.ops.bertkit.masked_lm_loss_fwd(logits, targets, weights)
    torch.library.opcheck(torch.ops.bertkit.masked_lm_loss_bwd,
                          (torch.rand(4), logits.detach(), targets, weights, lse))


def test_shapes_are_checked():
    with pytest.raises(ValueError, match="expected logits"):
        ce.masked_lm_loss(torch.zeros(4, 10), torch.zeros(3, dtype=torch.int64), torch.ones(4))


@needs_triton
def test_cuda_implementation_runs_the_kernels():
    """The op's "cuda" kernel (allocate, launch), run on the interpreter's CPU tensors; the logits a
    non-contiguous view."""
    logits, targets, weights = _inputs(7, 300, BF16, DEVICE)
    wide = torch.zeros(7, 310, dtype=BF16, device=DEVICE)
    wide[:, :300] = logits
    loss, correct, lse = ce._forward_cuda(wide[:, :300], targets, weights)
    expected = ce.reference_forward(logits, targets, weights)
    for ours, theirs in zip((loss, correct, lse), expected):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    dloss = torch.rand(7, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    dlogits = ce._backward_cuda(dloss, wide[:, :300], targets, weights, lse)
    torch.testing.assert_close(dlogits.float(), ce.reference_backward(dloss, logits, targets, weights, lse).float(),
                               **tolerance(BF16))
    scalar = torch.tensor(2.0, device=DEVICE).expand(7)  # what loss.sum()'s backward hands over: a stride-0 view
    torch.testing.assert_close(ce._backward_cuda(scalar, logits, targets, weights, lse).float(),
                               ce.reference_backward(scalar, logits, targets, weights, lse).float(), **tolerance(BF16))
