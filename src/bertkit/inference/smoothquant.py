"""SmoothQuant for `--precision int8` (Xiao et al. 2023, "SmoothQuant: Accurate and Efficient Post-Training
Quantization for Large Language Models"): per input channel j of each encoder dense layer, a scale
s_j = max|X_j|^alpha / max|W_j|^(1 - alpha) measured on a sample of the user's own inputs (`--calibration FILE`),
so the layer computes (X / s) (W s)^T: the weight takes the activations' outlier channels, which one int8 scale
per row can then resolve. The weights are packed with s inside (`Int8Linear(smooth=...)`); the division of X
is one multiply before each int8 matrix product.

Beside each layer's scales, calibration names its OUTLIER_CHANNELS outlier channels: the input channels
whose values stay largest after the scaling. They are multiplied in fp32 beside the int8 product
(LLM.int8()'s decomposition, Dettmers et al. 2022; `bertkit.kernels.int8`), so they no longer set each
token's int8 scale for all the other channels.

The scales are kept beside the model as `int8_smoothing.safetensors` (with the calibration file's name and
sha256, the number of inputs, alpha and a fingerprint of the weights they were measured on): a later
`--precision int8` on that directory uses them without `--calibration`, and says so; scales measured on other
weights (the directory fine-tuned again) are ignored with a warning. A directory that cannot be written keeps
them for this process only.

Design decisions: alpha 0.5, the paper's default for BERT-sized models; 4 outlier channels per layer (on three
MiniLM classifiers, 1 channel cut the mean change of a probability by 16-45%, 2 and 4 by 30-50%; measured in
docs/performance.md); the statistics are the maximum over
the sample's real tokens (the padding-free encoder never sees padding); at most MAX_TEXTS texts are read
(the first ones), which takes seconds.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from bertkit.errors import BertkitError
from bertkit.inference.batching import run_sorted
from bertkit.io.atomic import write_file_atomic
from bertkit.io.textlines import DECOMPRESSION_ERRORS, open_decompressed
from bertkit.kernels import int8
from bertkit.model import BertModel
from bertkit.model.accelerate import DENSE_LAYERS, OUTLIERS
from bertkit.model.bert import BertLayer

log = logging.getLogger(__name__)

SMOOTHING_FILE = "int8_smoothing.safetensors"
ALPHA = 0.5
OUTLIER_CHANNELS = 4
MAX_TEXTS = 512
MIN_SCALE, MAX_SCALE = 1e-5, 1e5
"""The range a kept scale may have: calibration clamps at MIN_SCALE, and max|X|^0.5 / max|W|^0.5 of a BERT layer
stays in the hundreds; outside it the file was altered (1e38 scales took int8 50x further from fp32)."""
MAX_CALIBRATION_LINE_BYTES = 1 << 20
"""Longest calibration line read: an input is cut at the model's length (at most 512 tokens), so a megabyte is
far more than any input needs; it bounds the memory a file without line breaks can take."""
MAX_CALIBRATION_BYTES = 64 << 20
"""Most bytes of a calibration file read in all (decompressed), whatever its lines: it bounds the time an endless
stream of blank lines can take."""

Smoothing = dict[str, torch.Tensor]
"""Per dense layer ("layers.3.ffn_in"), the scale of each of its input channels; and ("layers.3.ffn_in.outliers")
the indices of its outlier channels."""


def read_calibration(path: Path) -> list[tuple[str, str | None]]:
    """The calibration sample's inputs (`calibration_sample` without its digest)."""
    return calibration_sample(path)[0]


def calibration_sample(path: Path) -> tuple[list[tuple[str, str | None]], str]:
    """The calibration sample: one input per line (a pair as two texts separated by a tab; plain, .gz or .zst),
    blank lines skipped, at most MAX_TEXTS inputs. Bounded before decoding: a line of more than
    MAX_CALIBRATION_LINE_BYTES (no line break: /dev/zero, a binary or single-line file) is refused, and reading
    stops after MAX_CALIBRATION_BYTES (an endless stream of blank lines); a line with NUL bytes is an error.
    Returns the inputs and the sha256 of the bytes read (what the kept scales record: a stream is never read to
    its end to hash it)."""
    inputs: list[tuple[str, str | None]] = []
    read, digest = 0, hashlib.sha256()
    try:  # the first MAX_TEXTS inputs only: a whole corpus is never read
        with open_decompressed(Path(path)) as raw:
            for number in itertools.count(1):
                line = raw.readline(MAX_CALIBRATION_LINE_BYTES + 1)
                if not line:
                    break
                read += len(line)
                digest.update(line)
                if len(line) > MAX_CALIBRATION_LINE_BYTES:
                    raise BertkitError(f"--calibration {path}: line {number} runs past {MAX_CALIBRATION_LINE_BYTES:,} "
                                       "bytes without a line break (a binary file, a stream or one long line); give "
                                       "a text file with one input per line")
                text = line.decode("utf-8")
                if "\x00" in text:
                    raise BertkitError(f"--calibration {path}: line {number} holds NUL bytes, as a binary file does; "
                                       "give a text file with one input per line")
                if text.strip():
                    a, _, b = text.rstrip("\r\n").partition("\t")
                    inputs.append((a, b or None))
                if len(inputs) == MAX_TEXTS or read >= MAX_CALIBRATION_BYTES:
                    break
    except (OSError, UnicodeDecodeError, *DECOMPRESSION_ERRORS) as exc:
        raise BertkitError(f"--calibration {path}: cannot read it as UTF-8 text ({exc}); give a text file with one "
                           "input per line (a pair as two texts separated by a tab)") from None
    if not inputs:
        raise BertkitError(f"--calibration {path}: no text in it (read {read:,} bytes); give a sample of the inputs "
                           "the model will see, one per line")
    return inputs, digest.hexdigest()


def calibrate(model: nn.Module, features: Sequence[dict[str, Any]], pad_token_id: int, alpha: float = ALPHA,
              batch_size: int = 32) -> Smoothing:
    """The smoothing scales and outlier channels of every encoder dense layer of `model` (an fp32 model, not
    yet accelerated) from the activations `features` produce in it."""
    encoder = next(m for m in model.modules() if isinstance(m, BertModel))
    layers = [m for m in encoder.modules() if isinstance(m, BertLayer)]
    maxima: dict[str, torch.Tensor] = {}

    def record(name: str) -> Callable[..., None]:
        def hook(module: nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
            x = inputs[0].detach().float().reshape(-1, inputs[0].shape[-1]).abs().amax(dim=0)
            maxima[name] = x if name not in maxima else torch.maximum(maxima[name], x)
        return hook

    handles = [getattr(layer, dense).register_forward_pre_hook(record(f"layers.{i}.{dense}"))
               for i, layer in enumerate(layers) for dense in DENSE_LAYERS]
    def step(batch: dict[str, torch.Tensor]) -> list[None]:
        encoder(**batch)  # the hooks keep what they see
        return [None] * len(batch["input_ids"])

    try:
        encoder.eval()
        run_sorted(features, step, batch_size, pad_token_id)
    finally:
        for handle in handles:
            handle.remove()
    scales = {}
    for i, layer in enumerate(layers):
        for dense in DENSE_LAYERS:
            name = f"layers.{i}.{dense}"
            weight_max = getattr(layer, dense).weight.detach().float().abs().amax(dim=0)  # per input channel
            scale = maxima[name].clamp(min=1e-5).pow(alpha) / weight_max.clamp(min=1e-5).pow(1 - alpha)
            scales[name] = scale.clamp(MIN_SCALE, MAX_SCALE)  # the range a kept file is checked against
            largest = (maxima[name] / scales[name]).topk(min(OUTLIER_CHANNELS, len(scale))).indices
            scales[name + OUTLIERS] = largest.sort().values  # what the scaled inputs still hold largest
    return scales


def int8_smoothing(model: nn.Module, directory: Path, calibration: Path | None, tokenizer: Any,
                   max_length: int = 512) -> Smoothing | None:
    """The scales `--precision int8` uses for the model in `directory`: measured on `calibration` (tokenized by
    `tokenizer`, a WordPieceTokenizer; kept beside the model), else those kept from an earlier calibration,
    else None (plain dynamic int8)."""
    weights = weights_fingerprint(model)
    if calibration is None:
        kept = _read(directory)
        if kept is None:
            return None
        scales, about = kept
        if about.get("weights") != weights:  # the weights changed since (or another model): the scales are stale
            log.warning("int8: %s was measured on other weights than this model's; running plain int8 - calibrate "
                        "again with --calibration FILE", directory / SMOOTHING_FILE)
            return None
        damaged = _misfit(model, scales)
        if damaged:  # the right weights' fingerprint, but tensors no calibration writes: the file was altered
            log.warning("int8: %s is damaged (%s); running plain int8 - calibrate again with --calibration FILE",
                        directory / SMOOTHING_FILE, damaged)
            return None
        log.info("int8: SmoothQuant scales from %s (calibrated on %s, %s inputs)", directory / SMOOTHING_FILE,
                 about.get("calibration"), about.get("inputs"))
        if not any(name.endswith(OUTLIERS) for name in scales):
            log.info("int8: %s names no outlier channels (it was made by an earlier bertkit); --calibration FILE "
                     "again keeps them in fp32, closer to fp32", directory / SMOOTHING_FILE)
        return scales
    inputs, sha256 = calibration_sample(calibration)
    positions = next(m for m in model.modules() if isinstance(m, BertModel)).config.max_position_embeddings
    scales = calibrate(model, _features(tokenizer, inputs, min(max_length, positions)), tokenizer.pad_token_id)
    about = {"calibration": Path(calibration).name, "sha256": sha256, "inputs": str(len(inputs)),
             "alpha": str(ALPHA), "outlier_channels": str(OUTLIER_CHANNELS), "weights": weights}
    earlier = _kept_about(directory)
    if earlier is not None and earlier.get("weights") == weights:
        earlier_inputs = _count(earlier.get("inputs"))
        if earlier_inputs > len(inputs):  # a smaller sample sees fewer outliers: it does not replace a larger one
            log.warning("int8: using the scales of the %d inputs of %s in this process only; %s keeps those of %d "
                        "inputs of %s (a larger sample measures the outlier channels better); to replace them with a "
                        "smaller sample, delete that file first", len(inputs), calibration,
                        directory / SMOOTHING_FILE, earlier_inputs, earlier.get("calibration"))
            return scales
        log.info("int8: replacing the scales kept from %d inputs of %s", earlier_inputs, earlier.get("calibration"))
    try:
        write_file_atomic(directory / SMOOTHING_FILE, lambda path: save_file(scales, str(path), metadata=about))
        log.info("int8: SmoothQuant scales from %d inputs of %s, kept in %s", len(inputs), calibration,
                 directory / SMOOTHING_FILE)
    except OSError as exc:
        log.warning("int8: could not keep the SmoothQuant scales beside the model (%s); they serve this process "
                    "only", exc)
    return scales


def weights_fingerprint(model: nn.Module) -> str:
    """A hash of the encoder dense layers' weights, so kept scales are used only with the weights they were
    measured on (a directory fine-tuned again, or another model's file copied in, is recalibrated)."""
    digest = hashlib.sha256()
    encoder = next(m for m in model.modules() if isinstance(m, BertModel))
    for i, layer in enumerate(m for m in encoder.modules() if isinstance(m, BertLayer)):
        for dense in DENSE_LAYERS:
            weight = getattr(layer, dense).weight.detach().float()
            digest.update(f"layers.{i}.{dense}:{tuple(weight.shape)}".encode())
            digest.update(weight.abs().amax(dim=0).numpy().tobytes())  # per input channel: cheap, and changes with W
    for name, norm in encoder.named_modules():  # what shapes the activations too: every LayerNorm, whole
        if isinstance(norm, nn.LayerNorm):
            digest.update(name.encode() + norm.weight.detach().float().numpy().tobytes()
                          + norm.bias.detach().float().numpy().tobytes())
    return digest.hexdigest()


def _misfit(model: nn.Module, smoothing: Smoothing) -> str | None:
    """What in kept `smoothing` does not fit `model`'s dense layers (a scale of another width, outlier channels
    out of range, repeated or not integers), or None."""
    encoder = next(m for m in model.modules() if isinstance(m, BertModel))
    layers = [m for m in encoder.modules() if isinstance(m, BertLayer)]
    widths = {f"layers.{i}.{dense}": getattr(layer, dense).in_features
              for i, layer in enumerate(layers) for dense in DENSE_LAYERS}
    missing = sorted(set(widths) - set(smoothing))
    if missing:
        return f"no scales for {missing[0]}" + (f" and {len(missing) - 1} more layers" if len(missing) > 1 else "")
    for name, tensor in smoothing.items():
        layer = name.removesuffix(OUTLIERS)
        if layer not in widths:
            return f"{name}: no such layer in this model"
        if name == layer and tuple(tensor.shape) != (widths[layer],):
            return f"{name}: {tuple(tensor.shape)} scales for {widths[layer]} inputs"
        if name == layer and not _valid_scales(tensor):
            return f"{name}: {_scale_fault(tensor)}"
        if name != layer and not int8.valid_channels(tensor, widths[layer]):
            return f"{name}: channels {tensor.tolist()} for {widths[layer]} inputs"
    return None


def _valid_scales(scales: torch.Tensor) -> bool:
    """Whether `scales` can be SmoothQuant's: floating point, every one finite and positive (calibration writes
    max|X|^a / max|W|^(1-a), clamped above zero). NaN, inf, 0 or a negative scale turns every output into NaN or
    a reflection, and integers are not what calibration writes: the file was altered."""
    return (scales.is_floating_point() and bool(torch.isfinite(scales).all())
            and bool(((scales >= MIN_SCALE) & (scales <= MAX_SCALE)).all()))


def _scale_fault(scales: torch.Tensor) -> str:
    """What is wrong with scales that `_valid_scales` refuses, in words."""
    if not scales.is_floating_point():
        return f"scales of dtype {scales.dtype}, not floating point"
    if not bool(torch.isfinite(scales).all()):
        return f"{int((~torch.isfinite(scales)).sum())} scales are not finite (NaN or inf)"
    return (f"{int(((scales < MIN_SCALE) | (scales > MAX_SCALE)).sum())} scales outside [{MIN_SCALE:g}, {MAX_SCALE:g}] "
            "(zero, negative or extreme)")


def _features(tokenizer: Any, inputs: list[tuple[str, str | None]], max_length: int) -> list[dict[str, Any]]:
    """[CLS] a [SEP] (b [SEP]) of each input, cut to `max_length` as inference cuts it."""
    singles = [a for a, b in inputs if b is None]
    pairs = [(a, b) for a, b in inputs if b is not None]
    encodings = tokenizer.encode_batch(singles, max_length=max_length) if singles else []
    if pairs:
        encodings += tokenizer.encode_batch([a for a, _ in pairs], [b for _, b in pairs], max_length=max_length)
    return [{"input_ids": e.input_ids, "token_type_ids": e.token_type_ids, "attention_mask": e.attention_mask}
            for e in encodings]


def _kept_about(directory: Path) -> dict[str, str] | None:
    """The metadata of the scales kept in `directory` (None: none, or unreadable: replaced without a word)."""
    try:
        with safe_open(str(directory / SMOOTHING_FILE), "pt") as handle:
            return dict(handle.metadata() or {})
    except (OSError, ValueError, SafetensorError):
        return None


def _count(value: str | None) -> int:
    """A kept file's number of inputs (0 where it is missing or not a number: an altered file is replaced)."""
    return int(value) if value is not None and value.isdecimal() else 0


def _read(directory: Path) -> tuple[Smoothing, dict[str, str]] | None:
    path = directory / SMOOTHING_FILE
    if not path.is_file():
        return None
    try:
        with safe_open(str(path), "pt") as handle:
            about = dict(handle.metadata() or {})
        return load_file(str(path)), about
    except (OSError, ValueError, SafetensorError) as exc:  # damaged: say which, run without it, never fail the model
        log.warning("int8: %s is unreadable (%s); running plain int8 - calibrate again with --calibration FILE",
                    path, exc)
        return None
