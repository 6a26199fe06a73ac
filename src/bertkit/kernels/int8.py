"""int8 dense layers on oneDNN's int8 matrix multiply: the kernel, torch only (so the probe in
`bertkit.runtime.probe` and `bertkit.runtime.device`'s checks can use it; `bertkit.model.accelerate.Int8Linear` is the
module `--precision int8` swaps into the encoder).

The kernel is `torch.ops.onednn.qlinear_pointwise`, the one torch.compile's x86 int8 path emits, part of
PyTorch itself; torch.ao's eager quantization and the quantized tensor dtypes are deprecated, so neither is
used. How it quantizes:

- weights (`pack`): int8, symmetric, one scale per output channel, packed once into oneDNN's layout;
- activations (`quantize_rows`, at each call): one scale per row (token), symmetric around a zero point
  shared by all rows, so the kernel's one zero point serves every row and each row's scale multiplies its
  output afterwards. A scale per tensor lets BERT's outlier channels in one token coarsen every token: on
  a fine-tuned MiniLM classifier it kept 92.7% of fp32's labels, per row 96.9% (docs/performance.md);
- activations with a known floor (`linear(..., shift=...)`: the second feed-forward reads GELU's outputs,
  never below -0.17): shifted to be >= 0 and quantized unsigned from 0, one scale per row, so a row's
  levels cover its values instead of a range mirrored around zero that GELU's outputs barely reach below
  (the shift times W is taken out of the bias once, at packing). On three MiniLM classifiers with SmoothQuant
  it cut the mean change of a probability on the calibration sample by 10-33% (docs/performance.md);
- outlier channels (`pack(..., outliers=...)`, chosen by calibration: the few input channels with the largest
  values after SmoothQuant's scaling): kept out of the int8 product and multiplied in fp32 (their inputs times
  their weight columns, added to the int8 product), as LLM.int8()'s decomposition (Dettmers et al. 2022). One
  such channel sets its row's scale for every other channel; without the 4 largest, the rest are quantized
  finer. On three MiniLM classifiers with SmoothQuant it cut the mean change of a probability by 32-50%
  (docs/performance.md), at the cost of a (rows x 4) by (4 x out) fp32 product per layer;
- 7 or 8 bits (`activation_bits`, measured once): without VNNI the kernel adds u8 x s8 products in pairs
  into int16, which 8-bit activations overflow;
- output (`linear`): the row scales and the bias applied in fp32, then GELU or ReLU, or a residual added;
  returned in the input's dtype.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

MISSING = ("--precision int8 needs oneDNN's int8 kernels, which this PyTorch build or CPU lacks; "
           "use --precision fp32 or bf16")


@dataclass(frozen=True)
class PackedWeight:
    """A dense layer's weight in int8, packed for the kernel, with its per-channel scales and bias."""

    weight: torch.Tensor
    scale: torch.Tensor
    zero_point: torch.Tensor
    bias: torch.Tensor | None
    in_features: int
    out_features: int
    outliers: torch.Tensor | None = None
    """The input channels kept out of the int8 product (indices), or None."""
    outlier_weight: torch.Tensor | None = None
    """Their weight columns, fp32, (len(outliers), out): multiplied with their inputs in fp32."""


def pack(weight: torch.Tensor, bias: torch.Tensor | None, shift: torch.Tensor | None = None,
         outliers: torch.Tensor | None = None) -> PackedWeight:
    """(out, in) float weight -> int8, one symmetric scale per output channel, packed once. `shift`: for inputs
    that `linear` will shift by it, (x + shift) W^T + b - shift W^T = x W^T + b, so shift W^T (from the int8
    weight, as the kernel sees it: the two cancel exactly) is taken out of the bias. `outliers`: input channels
    whose columns stay fp32 beside the int8 weight (zero in it, so they neither set a row's scale nor count
    twice)."""
    weight = weight.detach().float()
    outlier_weight = None
    if outliers is not None:
        outliers = outliers.to(device="cpu", dtype=torch.int64)  # what index_select and index_fill take
        outlier_weight = weight[:, outliers].T.contiguous()
        weight = weight.index_fill(1, outliers, 0.0)
    quantized, scale = _quantize_weight(weight)
    bias = None if bias is None else bias.detach().float()
    if shift is not None:
        taken_out = (quantized.float() * scale[:, None]) @ shift.float()
        bias = -taken_out if bias is None else bias - taken_out
    return PackedWeight(torch.ops.onednn.qlinear_prepack(quantized, None), scale,
                        torch.zeros(weight.shape[0], dtype=torch.int64), bias, weight.shape[1], weight.shape[0],
                        outliers, outlier_weight)


def valid_channels(channels: torch.Tensor, width: int) -> bool:
    """Whether `channels` can be a layer's outlier channels: distinct integer indices below `width`."""
    return (channels.dim() == 1 and 0 < channels.numel() <= width and not channels.is_floating_point()
            and channels.dtype != torch.bool and int(channels.min()) >= 0 and int(channels.max()) < width
            and channels.unique().numel() == channels.numel())


def _quantize_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    weight = weight.detach().float()
    scale = (weight.abs().amax(dim=1) / 127).clamp(min=torch.finfo(torch.float32).tiny)
    return torch.round(weight / scale[:, None]).clamp(-127, 127).to(torch.int8), scale


def linear(x: torch.Tensor, packed: PackedWeight, post_op: tuple[str, str] = ("none", ""),
           residual: torch.Tensor | None = None, inverse_smooth: torch.Tensor | None = None,
           shift: torch.Tensor | None = None) -> torch.Tensor:
    """post_op(x W^T + b) [+ residual] in int8, x quantized here by rows; fp32 out, x's leading shape.
    `inverse_smooth`: SmoothQuant's 1 / s per input channel, x scaled by it first (the weight was packed
    times s, so the product is unchanged and x's outlier channels are tamed). `shift`: per input channel, what
    makes every (scaled) x >= 0 (`pack` packed the weight for it), so x is quantized unsigned. The packed
    weight's outlier channels are taken out of x before quantizing and multiplied in fp32."""
    rows = x.float().reshape(-1, packed.in_features)
    own = inverse_smooth is not None or x.dtype != torch.float32  # rows is then a new tensor, ours to change
    rows = rows if inverse_smooth is None else rows * inverse_smooth
    kept = None if packed.outliers is None else rows.index_select(1, packed.outliers)
    if shift is None:
        zero_point = 2 ** (activation_bits() - 1)
        q, scale = quantize_rows(_without(rows, packed.outliers, own), zero_point)
    else:
        zero_point = 0
        q, scale = quantize_rows_unsigned(_without(rows + shift, packed.outliers, True), 2 ** activation_bits() - 1)
    y = torch.ops.onednn.qlinear_pointwise(q, 1.0, zero_point, packed.weight, packed.scale, packed.zero_point,
                                           None, 1.0, 0, torch.float32, "none", [], "")
    y = y.mul_(scale) if packed.bias is None else torch.addcmul(packed.bias, y, scale)
    if kept is not None and packed.outlier_weight is not None:
        y.addmm_(kept, packed.outlier_weight)  # the outlier channels' share, in fp32
    name, algorithm = post_op
    if name == "gelu":
        y = torch.ops.aten.gelu_(y, approximate=algorithm)
    elif name == "relu":
        y = y.relu_()
    y = y.view(*x.shape[:-1], packed.out_features)
    y = y if residual is None else y.add_(residual)
    return y if x.dtype == torch.float32 else y.to(x.dtype)  # a bf16 module's next layer expects bf16


def _without(rows: torch.Tensor, channels: torch.Tensor | None, own: bool) -> torch.Tensor:
    """`rows` with `channels` zeroed (in place where `own`), so they set no row's scale."""
    if channels is None:
        return rows
    return rows.index_fill_(1, channels, 0.0) if own else rows.index_fill(1, channels, 0.0)


def quantize_rows_unsigned(x: torch.Tensor, levels: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, K) fp32 rows, all >= 0, as unsigned integers 0 .. levels, one scale per row: x ~ scale * q; rounded
    half up as `quantize_rows`."""
    scale = x.amax(dim=-1, keepdim=True).div_(levels).clamp_(min=torch.finfo(torch.float32).tiny)
    return torch.addcmul(torch.full((x.shape[-1],), 0.5), x, scale.reciprocal()).to(torch.uint8), scale


def quantize_rows(x: torch.Tensor, zero_point: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, K) fp32 rows as unsigned integers zero_point +- (zero_point - 1), one scale per row: x ~ scale *
    (q - zero_point). Plain tensor ops, chosen by measurement on (4096, 768): amax and amin apart (0.7 ms;
    aminmax along a dim 5.2 ms), then q = x / scale + zero_point + 0.5 in one addcmul with a per-column
    offset (1.1 ms; with a 0-d one 7 ms), truncated: rounded half up. No clamp: |x / scale| <= zero_point
    - 1 by construction, so q stays within 1 .. 2 * zero_point - 1."""
    high, low = x.amax(dim=-1, keepdim=True), x.amin(dim=-1, keepdim=True)
    scale = torch.maximum(high, low.neg()).div_(zero_point - 1).clamp_(min=torch.finfo(torch.float32).tiny)
    offset = torch.full((x.shape[-1],), zero_point + 0.5)
    return torch.addcmul(offset, x, scale.reciprocal()).to(torch.uint8), scale


@functools.cache
def activation_bits() -> int:
    """8 where the kernel sums u8 x s8 products exactly at full range, else 7: without VNNI (or AMX) it adds
    them in pairs into int16, which 255 * 127 * 2 overflows. Measured once, on the worst case."""
    weight = torch.ops.onednn.qlinear_prepack(torch.full((8, 64), 127, dtype=torch.int8), None)
    ones, zeros = torch.ones(8), torch.zeros(8, dtype=torch.int64)
    y = torch.ops.onednn.qlinear_pointwise(torch.full((4, 64), 255, dtype=torch.uint8), 1.0, 0, weight, ones, zeros,
                                           None, 1.0, 0, torch.float32, "none", [], "")
    return 8 if bool((y == 255 * 127 * 64).all()) else 7


@functools.cache
def works() -> bool:
    """Whether this PyTorch build runs the kernel and gets the dequantized product's numbers: probed once
    on a tiny layer, without drawing from the global RNG."""
    try:
        with torch.autocast("cpu", enabled=False), torch.no_grad():
            generator = torch.Generator().manual_seed(0)
            weight, x = torch.randn(8, 16, generator=generator), torch.randn(3, 16, generator=generator)
            expected = x @ weight.T
            got = linear(x, pack(weight, None))
            return torch.allclose(got, expected, atol=0.1 * float(expected.abs().max()))
    except (AttributeError, RuntimeError, NotImplementedError):
        return False
