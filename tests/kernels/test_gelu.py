"""bias_gelu: the Triton kernels (interpreted on the CPU) against the reference; the public op (the reference path
on the CPU) against F.gelu(x + bias), with gradients, gradcheck and opcheck."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from bertkit.kernels import gelu

from .conftest import DEVICE, needs_triton, poisoned, tolerance

FP32, BF16 = torch.float32, torch.bfloat16


def _inputs(rows: int, f: int, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    x = (2 * torch.randn(rows, f, generator=generator)).to(device, dtype)
    return x, torch.randn(f, generator=generator).to(device)


# F 48 (one block, partly masked), 1100 (two blocks of 1024, the second mostly masked); 37 rows, no multiple of
# the backward's rows per program.
@needs_triton
@pytest.mark.parametrize("dtype", [FP32, BF16])
@pytest.mark.parametrize(("rows", "f"), [(37, 48), (5, 1100)])
def test_triton_kernels_match_the_reference(rows, f, dtype):
    x, bias = _inputs(rows, f, dtype, DEVICE)
    y = poisoned(rows, f, dtype=dtype)
    gelu.launch_forward(x, bias, y)
    expected = F.gelu(x.float() + bias)
    torch.testing.assert_close(y.float(), expected, **tolerance(dtype))

    dy = torch.randn(rows, f, generator=torch.Generator().manual_seed(1)).to(DEVICE, dtype)
    dx, dbias = poisoned(rows, f, dtype=dtype), poisoned(f, dtype=FP32)
    gelu.launch_backward(dy, x, bias, dx, dbias)
    z = (x.float() + bias).requires_grad_()
    F.gelu(z).backward(dy.float())
    torch.testing.assert_close(dx.float(), z.grad, **tolerance(dtype))
    torch.testing.assert_close(dbias, z.grad.sum(0), rtol=1e-4, atol=1e-4)  # fp32 sums before dx is rounded


@pytest.mark.parametrize("dtype", [FP32, BF16])
def test_op_matches_gelu_of_x_plus_bias(dtype):
    x, bias = _inputs(2 * 5, 48, dtype, torch.device("cpu"))
    x = x.reshape(2, 5, 48)  # any leading shape
    ours = [x.clone().requires_grad_(), bias.clone().requires_grad_()]
    theirs = [x.float().requires_grad_(), bias.clone().requires_grad_()]
    y = gelu.bias_gelu(*ours)
    expected = F.gelu(theirs[0] + theirs[1])
    assert y.dtype == dtype and y.shape == x.shape
    torch.testing.assert_close(y.float(), expected, **tolerance(dtype))
    dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(2)).to(dtype)
    y.backward(dy)
    expected.backward(dy.float())
    assert ours[0].grad.dtype == dtype and ours[1].grad.dtype == FP32
    torch.testing.assert_close(ours[0].grad.float(), theirs[0].grad, **tolerance(dtype))
    torch.testing.assert_close(ours[1].grad, theirs[1].grad, rtol=1e-4, atol=1e-4)


def test_op_gradcheck_in_float64_and_opcheck():
    x, bias = (t.double().requires_grad_() for t in _inputs(3, 16, FP32, torch.device("cpu")))
    assert torch.autograd.gradcheck(gelu.bias_gelu, (x, bias))
    x, bias = _inputs(4, 16, BF16, torch.device("cpu"))
    torch.library.opcheck(torch.ops.bertkit.bias_gelu_fwd, (x.requires_grad_(), bias))
    torch.library.opcheck(torch.ops.bertkit.bias_gelu_bwd, (torch.randn_like(x), x.detach(), bias))


def test_op_saves_x_and_the_bias_only():
    x, bias = _inputs(3, 16, FP32, torch.device("cpu"))
    saved: list[torch.Tensor] = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        saved.append(tensor)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        gelu.bias_gelu(x.requires_grad_(), bias.requires_grad_())
    assert len(saved) == 2
    assert torch.equal(saved[0], x) and torch.equal(saved[1], bias)  # x, not x + bias


@needs_triton
def test_cuda_implementation_runs_the_kernels_on_any_leading_shape():
    """The op's "cuda" kernel (flatten, allocate, launch, reshape), run on the interpreter's CPU tensors."""
    x, bias = _inputs(6, 48, BF16, DEVICE)
    x = x.reshape(2, 3, 48).transpose(0, 1)  # (3, 2, 48), not contiguous
    y = gelu._forward_cuda(x, bias)
    assert y.shape == x.shape and y.dtype == BF16
    torch.testing.assert_close(y.float(), F.gelu(x.float() + bias), **tolerance(BF16))
    dy = torch.randn(x.shape, generator=torch.Generator().manual_seed(1)).to(DEVICE, BF16)
    dx, dbias = gelu._backward_cuda(dy, x, bias)
    expected_dx, expected_dbias = gelu.reference_backward(dy, x, bias)
    assert dx.shape == x.shape and dbias.dtype == FP32
    torch.testing.assert_close(dx.float(), expected_dx.float(), **tolerance(BF16))
    torch.testing.assert_close(dbias, expected_dbias, rtol=1e-4, atol=1e-4)
