"""`bertkit.kernels.int8` and `Int8Linear` on oneDNN's int8 kernel (issue 30, item 4): it computes exactly the
product of the quantized rows and weights it says it does, with per-row activation scales, the epilogues
(GELU, ReLU, residual) and the bit width this CPU sums without overflow; `--precision int8` builds no
torch.ao module (deprecated)."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

from bertkit.config import preset
from bertkit.errors import BertkitError
from bertkit.kernels import int8
from bertkit.kernels.int8 import activation_bits, quantize_rows
from bertkit.kernels.int8 import works as int8_works
from bertkit.model import BertModel, for_inference
from bertkit.model.accelerate import Int8Linear
from bertkit.runtime import device as runtime

pytestmark = pytest.mark.skipif(not int8_works(), reason="no oneDNN int8 kernels in this build")


def _layer(fan_in: int = 48, fan_out: int = 24, seed: int = 0) -> torch.nn.Linear:
    torch.manual_seed(seed)
    return torch.nn.Linear(fan_in, fan_out)


def _dequantized_product(layer: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """What Int8Linear should compute, in float64: the quantized rows times the quantized weights."""
    zero_point = 2 ** (activation_bits() - 1)
    q, scale = quantize_rows(x.reshape(-1, layer.in_features), zero_point)
    rows = (q.double() - zero_point) * scale.double()
    weight_scale = layer.weight.detach().abs().amax(1) / 127
    weight = torch.round(layer.weight.detach() / weight_scale[:, None]).clamp(-127, 127).double()
    weight = weight * weight_scale[:, None]
    return (rows @ weight.T + layer.bias.detach().double()).view(*x.shape[:-1], layer.out_features)


def test_rows_are_quantized_with_their_own_scale():
    x = torch.tensor([[0.5, -1.0, 0.25, 0.0], [100.0, -3.0, 7.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    for zero_point in (64, 128):
        q, scale = quantize_rows(x, zero_point)
        assert q.dtype == torch.uint8 and int(q.min()) >= 1 and int(q.max()) <= 2 * zero_point - 1
        assert torch.allclose(scale[:2, 0], x[:2].abs().amax(1) / (zero_point - 1))
        restored = (q.float() - zero_point) * scale
        assert ((restored - x).abs() <= scale / 2 + 1e-6).all()  # rounded, each row on its own grid
        assert (q[2] == zero_point).all() and (restored[2] == 0).all()  # zeros stay exact zeros


@pytest.mark.parametrize("post_op", [("none", ""), ("gelu", "none"), ("gelu", "tanh"), ("relu", "")])
def test_the_kernel_computes_the_quantized_product_and_its_epilogue(post_op):
    layer = _layer()
    x = torch.randn(3, 7, 48) * torch.linspace(0.1, 30, 7)[None, :, None]  # rows of very different ranges
    with torch.inference_mode():
        got = Int8Linear(layer, post_op)(x)
    expected = _dequantized_product(layer, x)
    name, algorithm = post_op
    if name == "gelu":
        expected = F.gelu(expected, approximate=algorithm)
    elif name == "relu":
        expected = F.relu(expected)
    assert got.shape == (3, 7, 24) and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), expected, atol=1e-4 * float(expected.abs().max()), rtol=1e-5)


def test_the_residual_is_added():
    layer = _layer()
    x, residual = torch.randn(10, 48), torch.randn(10, 24)
    with torch.inference_mode():
        got = Int8Linear(layer)(x, residual)
    expected = _dequantized_product(layer, x) + residual.double()
    torch.testing.assert_close(got.double(), expected, atol=1e-4 * float(expected.abs().max()), rtol=1e-5)


def test_per_row_scales_keep_small_rows_precise():
    """A row 1,000x larger than the others does not coarsen them (a per-tensor scale would zero them)."""
    layer = _layer()
    x = torch.randn(8, 48)
    x[0] *= 1000
    with torch.inference_mode():
        got, exact = Int8Linear(layer)(x), layer(x)
    small = (got[1:] - exact[1:]).abs().max() / exact[1:].abs().max()
    assert small < 0.05


@pytest.mark.parametrize("smoothed", [False, True])
def test_inputs_with_a_floor_are_quantized_unsigned_and_the_shift_cancels(smoothed):
    """The second feed-forward reads GELU's outputs (never below -0.17): shifted to >= 0 and quantized from 0,
    a row gets twice the levels a range mirrored around zero gives it, so the product is closer to the
    exact one; the shift's product is taken out of the bias, so nothing else changes."""
    layer = _layer(fan_in=256, fan_out=64)
    torch.manual_seed(1)
    x = F.gelu(torch.randn(40, 256) * 3)
    smooth = torch.rand(256) + 0.5 if smoothed else None
    with torch.inference_mode():
        exact = layer(x)
        mirrored = Int8Linear(layer, smooth=smooth)(x)
        unsigned = Int8Linear(layer, smooth=smooth, floor=-0.1701)
        got = unsigned(x)
    assert unsigned.shift is not None and bool(((x * unsigned.inverse_smooth if smoothed else x)
                                                + unsigned.shift >= 0).all())
    error, mirrored_error = (got - exact).pow(2).mean(), (mirrored - exact).pow(2).mean()
    assert error < (0.75 if smoothed else 0.5) * mirrored_error  # unsmoothed about a quarter: half the step, squared
    torch.testing.assert_close(got, exact, atol=0.02 * float(exact.abs().max()), rtol=0.0)


@pytest.mark.parametrize("floor", [None, -0.1701])
def test_outlier_channels_are_multiplied_in_fp32_and_free_the_other_channels_scale(floor):
    """Two input channels 100x larger than the rest set every row's int8 scale; kept out of the int8 product
    and multiplied in fp32 (LLM.int8()'s decomposition), they are exact and the rest are quantized finer."""
    layer = _layer(fan_in=128, fan_out=32)
    torch.manual_seed(2)
    x = F.gelu(torch.randn(30, 128)) if floor is not None else torch.randn(30, 128)
    x[:, [5, 77]] = x[:, [5, 77]].abs() * 100.0  # above the floor, as GELU's outputs are
    outliers = torch.tensor([5, 77])
    with torch.inference_mode():
        exact = layer(x)
        errors = {kept: (Int8Linear(layer, floor=floor, outliers=outliers if kept else None)(x) - exact).abs().max()
                  for kept in (False, True)}
        only_outliers = torch.zeros_like(x)
        only_outliers[:, [5, 77]] = x[:, [5, 77]]
        given = only_outliers.clone()
        got = Int8Linear(layer, floor=floor, outliers=outliers)(given)
        reference = layer(only_outliers)
    assert errors[True] < errors[False] / 10, errors
    torch.testing.assert_close(got, reference, atol=1e-4, rtol=1e-5)  # the outliers' share is fp32's
    assert torch.equal(given, only_outliers)  # the caller's input is not changed by zeroing the channels


def test_invalid_outlier_channels_are_refused():
    for channels in (torch.tensor([3, 48]), torch.tensor([-1]), torch.tensor([], dtype=torch.long),
                     torch.tensor([3, 3]), torch.tensor([True, False]), torch.tensor([1.0])):
        with pytest.raises(ValueError, match="invalid or damaged"):
            Int8Linear(_layer(fan_in=48), outliers=channels)
    with torch.inference_mode():  # int32 indices are as good as int64 ones
        x = torch.randn(3, 48)
        torch.testing.assert_close(Int8Linear(_layer(fan_in=48), outliers=torch.tensor([2, 7], dtype=torch.int32))(x),
                                   Int8Linear(_layer(fan_in=48), outliers=torch.tensor([2, 7]))(x))


def test_the_encoders_second_feed_forward_reads_unsigned_inputs():
    model = BertModel(preset("bert-tiny", vocab_size=99)).eval()
    int8_model = for_inference(model, "int8")
    for layer in int8_model.layers:
        assert layer.ffn_out.shift is not None and "unsigned inputs" in repr(layer.ffn_out)
        assert all(getattr(layer, name).shift is None for name in ("qkv", "attn_out", "ffn_in"))


def _worst_case_is_exact(bits: int, rows: int, depth: int, columns: int) -> bool:
    """The largest activation times the largest weight, summed over `depth` inputs: exact at `bits`?"""
    weight = torch.ops.onednn.qlinear_prepack(torch.full((columns, depth), 127, dtype=torch.int8), None)
    top = 2 ** bits - 1
    y = torch.ops.onednn.qlinear_pointwise(torch.full((rows, depth), top, dtype=torch.uint8), 1.0, 0, weight,
                                           torch.ones(columns), torch.zeros(columns, dtype=torch.int64), None, 1.0,
                                           0, torch.float32, "none", [], "")
    return bool((y == top * 127 * depth).all())


def test_the_bit_width_is_what_the_kernel_sums_exactly_at_model_shapes():
    """activation_bits() (measured on a tiny case) holds at bert-base's shapes: 8 only where 8-bit
    activations sum exactly there, and its own width always does."""
    bits = activation_bits()
    assert bits in (7, 8)
    for depth, columns in ((768, 2304), (3072, 768)):
        assert _worst_case_is_exact(bits, 64, depth, columns)
        assert _worst_case_is_exact(8, 64, depth, columns) == (bits == 8)


def test_int8_inference_builds_no_deprecated_module_and_warns_nothing():
    torch.manual_seed(0)
    model = BertModel(preset("bert-debug")).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch.ao and quantized tensor dtypes warn that they are deprecated
        quantized = for_inference(model, "int8")
        with torch.inference_mode():
            quantized(torch.randint(5, 90, (2, 9)))
    assert not any(type(m).__module__.startswith("torch.ao") for m in quantized.modules())
    assert sum(isinstance(m, Int8Linear) for m in quantized.modules()) == 4 * model.config.num_hidden_layers
    assert [type(layer.act).__name__ for layer in quantized.layers] == ["Identity"] * 2  # GELU in ffn_in


def test_the_probe_leaves_the_global_rng_alone():
    int8_works.cache_clear()
    state = torch.get_rng_state()
    try:
        assert int8_works()
    finally:
        assert torch.equal(torch.get_rng_state(), state)


def test_a_build_without_int8_kernels_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(int8, "works", lambda: False)
    with pytest.raises(BertkitError, match="needs oneDNN's int8 kernels.*use --precision fp32 or bf16"):
        runtime.inference_precision("int8", BertModel(preset("bert-debug")), torch.device("cpu"))
