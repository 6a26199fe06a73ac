"""The fused Triton kernels of bertkit.kernels on the GPU at BERT-Base's sizes: each op's Triton path against its
PyTorch reference, forward and backward; dropout statistics and the mask replayed by the backward and by
torch.utils.checkpoint; and the time of each (triton.testing, median) beside the eager torch composition it
replaces, launched one by one and replayed from a CUDA graph, printed so the GPU check's log shows what each
kernel buys (at these sizes a launch costs more than the GPU's work, so the graphed times are the kernels').
About 15 seconds on an H200, most of it Triton compiling the kernels once.

Sizes: 4096 rows of D=768 (32 sequences of 128 tokens), F=3072, 2560 masked positions x a 30522 vocabulary.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from bertkit.kernels import cross_entropy, gelu, norm, triton_support

from .conftest import cuda_only

pytestmark = [pytest.mark.cuda, cuda_only]

ROWS, D, FFN, MASKED, VOCAB = 4096, 768, 3072, 2560, 30522
EPS = 1e-12
BF16, FP32 = torch.bfloat16, torch.float32


@pytest.fixture(autouse=True)
def _triton_runs():
    """On a GPU the ops must take the Triton path, not fall back to the reference."""
    assert triton_support.available(torch.device("cuda")), triton_support.reason_unavailable(torch.device("cuda"))


def _relative_error(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    ours, theirs = ours.detach().float(), theirs.detach().float()
    return float((ours - theirs).norm() / theirs.norm().clamp(min=1e-12))


def _close(ours: torch.Tensor, theirs: torch.Tensor, relative: float = 1e-2) -> None:
    """Finite, and near in relative norm (bf16 rounding is 2**-8 an element)."""
    assert torch.isfinite(ours).all()
    error = _relative_error(ours, theirs)
    assert error < relative, f"relative error {error:.2e}"


def _bench(name: str, ours: Callable[[], object], eager: Callable[[], object]) -> None:
    """Median times, launched one by one (the Python and launch overhead of eager mode included) and replayed
    from a CUDA graph (the GPU's time alone: how a compiled, graphed training step runs them)."""
    from triton.testing import do_bench, do_bench_cudagraph

    launched = [do_bench(fn, warmup=5, rep=30, return_mode="median") * 1e3 for fn in (ours, eager)]
    graphed = [do_bench_cudagraph(fn, rep=30, return_mode="median") * 1e3 for fn in (ours, eager)]
    print(f"{name:40s} launched: triton {launched[0]:7.1f} us, eager {launched[1]:7.1f} us "
          f"(x{launched[1] / launched[0]:.2f}) | CUDA graph: triton {graphed[0]:7.1f} us, eager {graphed[1]:7.1f} us "
          f"(x{graphed[1] / graphed[0]:.2f})")


def _leaves(*tensors: torch.Tensor) -> list[torch.Tensor]:
    return [t.detach().clone().requires_grad_() for t in tensors]


# ---------------------------------------------------------------- dropout + residual + LayerNorm


def _ln_inputs(x_dtype: torch.dtype = BF16, residual_dtype: torch.dtype = BF16) -> list[torch.Tensor]:
    generator = torch.Generator(device="cuda").manual_seed(0)
    return [torch.randn(ROWS, D, device="cuda", generator=generator).to(x_dtype),
            torch.randn(ROWS, D, device="cuda", generator=generator).to(residual_dtype),
            1 + 0.1 * torch.randn(D, device="cuda", generator=generator),
            0.1 * torch.randn(D, device="cuda", generator=generator)]


@pytest.mark.parametrize(("x_dtype", "residual_dtype", "out_dtype", "p"), [
    (BF16, BF16, BF16, 0.0), (BF16, BF16, BF16, 0.1), (BF16, FP32, FP32, 0.1)])
def test_layer_norm_matches_torch_with_the_same_mask(x_dtype, residual_dtype, out_dtype, p):
    ours = _leaves(*_ln_inputs(x_dtype, residual_dtype))
    theirs = _leaves(*ours)
    torch.manual_seed(5)
    y = norm.dropout_add_layer_norm(*ours, p, EPS, out_dtype=out_dtype)
    torch.manual_seed(5)  # the seed the op drew, drawn again: the Triton kernels' mask
    keep = norm.dropout_keep_mask(norm.draw_seed(torch.device("cuda")), ROWS * D, p).view(ROWS, D).float()
    h = theirs[0].float() * keep / (1 - p) + theirs[1].float()
    expected = F.layer_norm(h, (D,), theirs[2], theirs[3], EPS)
    assert y.dtype == out_dtype
    _close(y, expected)
    dy = torch.randn_like(expected).to(out_dtype)
    y.backward(dy)
    expected.backward(dy.float())
    for mine, reference in zip(ours, theirs):
        assert mine.grad.dtype == mine.dtype
        _close(mine.grad, reference.grad)


def test_layer_norm_dropout_statistics_and_replay():
    p = 0.1
    x = torch.ones(ROWS, D, device="cuda", dtype=BF16, requires_grad=True)
    weight, bias = torch.ones(D, device="cuda"), torch.zeros(D, device="cuda")
    torch.manual_seed(0)
    y = norm.dropout_add_layer_norm(x, None, weight, bias, p, EPS)
    dropped = y < 0  # kept 1/(1-p) and dropped 0s in a row: the dropped ones normalize below the mean
    kept = 1 - dropped.float().mean().item()
    assert abs(kept - (1 - p)) < 5 * math.sqrt(p * (1 - p) / y.numel()), kept
    y.backward(torch.randn_like(y))
    assert torch.equal(x.grad == 0, dropped)  # the backward regenerated the forward's mask

    x, residual, weight, bias = _leaves(*_ln_inputs())

    def block(x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return norm.dropout_add_layer_norm(x, residual, weight, bias, p, EPS)

    grads = []
    for wrapped in (block, lambda *a: checkpoint(block, *a, use_reentrant=False)):
        torch.manual_seed(1)
        wrapped(x, residual).float().square().sum().backward()
        grads.append([t.grad.clone() for t in (x, residual, weight, bias)])
        x.grad = residual.grad = weight.grad = bias.grad = None
    for plain, checkpointed in zip(*grads):
        assert torch.equal(plain, checkpointed)


def test_layer_norm_time():
    x, residual, weight, bias = _leaves(*_ln_inputs())
    dy = torch.randn(ROWS, D, device="cuda", dtype=BF16)

    def eager() -> torch.Tensor:  # what the model runs under autocast: LayerNorm in fp32
        with torch.autocast("cuda", dtype=BF16):
            return F.layer_norm(residual + F.dropout(x, 0.1), (D,), weight, bias, EPS)

    def ours() -> torch.Tensor:
        return norm.dropout_add_layer_norm(x, residual, weight, bias, 0.1, EPS)

    _bench("dropout+add+LayerNorm forward", ours, eager)
    _bench("dropout+add+LayerNorm forward+backward", lambda: ours().backward(dy),
           lambda: eager().backward(dy.float()))


# ---------------------------------------------------------------- bias + GELU


def _gelu_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator(device="cuda").manual_seed(0)
    return (torch.randn(ROWS, FFN, device="cuda", generator=generator).to(BF16),
            torch.randn(FFN, device="cuda", generator=generator))


def test_bias_gelu_matches_torch():
    ours = _leaves(*_gelu_inputs())
    theirs = _leaves(ours[0].float(), ours[1])
    y = gelu.bias_gelu(*ours)
    expected = F.gelu(theirs[0] + theirs[1])
    assert y.dtype == BF16
    _close(y, expected)
    dy = torch.randn_like(y)
    y.backward(dy)
    expected.backward(dy.float())
    _close(ours[0].grad, theirs[0].grad)
    _close(ours[1].grad, theirs[1].grad, relative=1e-4)  # fp32 sums of unrounded products


def test_bias_gelu_time():
    x, bias = _leaves(*_gelu_inputs())
    dy = torch.randn(ROWS, FFN, device="cuda", dtype=BF16)

    def eager() -> torch.Tensor:
        return F.gelu(x + bias.to(BF16))

    _bench("bias+GELU forward", lambda: gelu.bias_gelu(x, bias), eager)
    _bench("bias+GELU forward+backward", lambda: gelu.bias_gelu(x, bias).backward(dy), lambda: eager().backward(dy))


# ---------------------------------------------------------------- masked-LM loss


def _loss_inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator(device="cuda").manual_seed(0)
    logits = (3 * torch.randn(MASKED, VOCAB, device="cuda", generator=generator)).to(BF16)
    targets = torch.randint(0, VOCAB, (MASKED,), device="cuda", generator=generator)
    targets[:100] = logits[:100].argmax(-1)  # some predicted right
    weights = torch.ones(MASKED, device="cuda")
    weights[-MASKED // 10:] = 0.0  # padding entries of the static-size index
    targets[-MASKED // 10:] = 0
    return logits, targets, weights


def _eager_loss(logits: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """The composition the op replaces: an fp32 copy of the logits through F.cross_entropy."""
    loss = (weights * F.cross_entropy(logits.float(), targets, reduction="none")).sum()
    return loss, (weights * (logits.argmax(-1) == targets).float()).sum()


def test_masked_lm_loss_matches_torch():
    logits, targets, weights = _loss_inputs()
    ours, theirs = _leaves(logits, logits)
    loss, correct = cross_entropy.masked_lm_loss(ours, targets, weights)
    expected_loss, expected_correct = _eager_loss(theirs, targets, weights)
    torch.testing.assert_close(loss, expected_loss, rtol=1e-4, atol=1e-3)
    assert correct.item() == expected_correct.item() >= 100
    loss.backward()
    expected_loss.backward()
    assert ours.grad.dtype == BF16 and not ours.grad[-MASKED // 10:].any()
    _close(ours.grad, theirs.grad)


def test_masked_lm_loss_time():
    logits, targets, weights = _loss_inputs()
    (leaf,) = _leaves(logits)

    def ours() -> tuple[torch.Tensor, torch.Tensor]:
        return cross_entropy.masked_lm_loss(leaf, targets, weights)

    def eager() -> tuple[torch.Tensor, torch.Tensor]:
        return _eager_loss(leaf, targets, weights)

    _bench("masked-LM loss forward", ours, eager)
    _bench("masked-LM loss forward+backward", lambda: ours()[0].backward(), lambda: eager()[0].backward())
