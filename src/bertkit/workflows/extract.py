"""Feature extraction: contextual token vectors of chosen layers (JSONL), or pooled sentence vectors (.npy).

The JSONL output is the format of Google's `extract_features.py`, one line per input line:

    {"linex_index": 0, "features": [{"token": "[CLS]", "layers": [{"index": -1, "values": [...]}, ...]}, ...]}

with every token of `[CLS] A [SEP] (B [SEP])`, values rounded to 6 decimals as the original does.
Layer indices count the encoder layers only, as the original's `all_encoder_layers`: -1 is the last
layer, -L (or 0) the first; the embedding output is not a layer. Input is one text per line, or a
pair written `text_a ||| text_b`; or a table (Parquet, a `datasets` directory), one row per input from
its text column (and pair column). An `.npy` output holds one vector per line instead: the requested
layers pooled (at [CLS], or mean / max / sum over sqrt(length) of the line's real tokens) and
concatenated in the order given. A sentence-transformers directory's max_seq_length, lowercasing and
prompt always apply, and "auto" pooling (the default) takes its pooling and normalisation
(inference/pooling.py), so the vectors equal sentence-transformers' `encode`.

Design decision: the encoder runs length-sorted, padding-free batches (inference/batching.py) and the
output is written as it is produced, so memory holds one batch of hidden states, not the corpus
(.npy is filled through a memory map of its final size). An existing non-empty output is refused before any
work unless `--overwrite`.

Reference: google-research/bert `extract_features.py` (input format, layer indexing, output format);
Devlin et al. (2018), section 5.3 (feature-based use, concatenating the last four layers).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import cast

import numpy as np
import torch

from bertkit.config import BertConfig, check_model_directory
from bertkit.data.text_inputs import read_lines
from bertkit.errors import BertkitError
from bertkit.inference.batching import check_finite, sorted_batches
from bertkit.inference.pooling import sentence_vectors
from bertkit.inference.positions import UntrainedPositions, directory_trained_positions
from bertkit.inference.smoothquant import int8_smoothing
from bertkit.interop.sentence_transformers import choose_pooling, read_sentence_transformers
from bertkit.io.atomic import check_writable, failed_write_advice
from bertkit.model import BertModel, for_inference
from bertkit.runtime.allocator import keep_freed_memory
from bertkit.runtime.device import apply_threads, check_inference_precision
from bertkit.settings import ExtractSettings
from bertkit.tokenizer import WordPieceTokenizer, check_model_vocabulary

log = logging.getLogger(__name__)

DEFAULT_MAX_SEQ_LENGTH = 128  # extract_features.py's default


def parse_layers(spec: str, num_layers: int) -> list[int]:
    """'-1,-2,-3,-4' -> [-1, -2, -3, -4], each checked against the model's L layers."""
    try:
        layers = [int(part) for part in spec.split(",") if part.strip()]
    except ValueError:
        raise BertkitError(f"--layers {spec!r}: expected comma-separated integers such as -1,-2,-3,-4") from None
    bad = [i for i in layers if not -num_layers <= i < num_layers]
    if not layers or bad:
        raise BertkitError(f"--layers {spec!r}: the model has {num_layers} layers, so indices must be in "
                           f"[-{num_layers}, {num_layers - 1}] (-1 is the last layer)")
    return layers


def extract_features(settings: ExtractSettings) -> int:
    """Write the features of every line of `settings.input` to `settings.output`; returns the number of lines.

    The output's extension picks the format: .jsonl per-token values, .npy one pooled vector per line
    (`pooling` None means "auto": a sentence-transformers directory's own pooling, else [CLS]).
    `layers` None means -1,-2,-3,-4 for .jsonl and -1 for .npy; `max_seq_length` None the directory's
    sentence-transformers length, else 128, at most the model's max_position_embeddings (a larger value
    given is refused, as fine-tuning and pre-training refuse it); `tokenizer` None the model directory's
    vocabulary.
    `precision` is an inference precision (`bertkit.model.for_inference`): fp32, bf16 (values within bf16
    rounding), int8 (encoder layers quantized) or auto (the faster of fp32 and bf16 as measured here)."""
    apply_threads(settings.threads)
    model_dir, output_path, precision = check_model_directory(settings.model), Path(settings.output), settings.precision
    keep_freed_memory()  # the process reuses large activations from here on (bertkit.runtime.allocator)
    config = BertConfig.from_json_file(model_dir / "config.json")
    vocabulary = WordPieceTokenizer.from_pretrained(settings.tokenizer or model_dir)
    check_model_vocabulary(vocabulary, config.vocab_size, model_dir, settings.tokenizer)
    pooled = _pooled_output(output_path, settings.pooling, settings.normalize)
    _check_output(output_path, settings.overwrite)
    sentence = read_sentence_transformers(model_dir)
    max_seq_length = _max_seq_length(settings.max_seq_length, sentence.max_seq_length if sentence else None,
                                     config.max_position_embeddings, model_dir)
    modes, normalize = (choose_pooling(settings.pooling or "auto", settings.normalize, sentence, "--pooling")
                        if pooled else ((), False))
    check_inference_precision(precision)
    inputs = read_lines(settings.input, text_column=settings.text_column, text_pair_column=settings.text_pair_column)
    if sentence is not None:
        inputs = [(sentence.prepare(a), None if b is None else sentence.prepare(b, prompt=False)) for a, b in inputs]
    bert = BertModel.from_pretrained(model_dir)
    encoder = cast(BertModel, for_inference(bert, precision,  # the same class; int8 with the kept or calibrated scales
                                            smoothing=lambda: int8_smoothing(bert, model_dir, settings.calibration,
                                                                             vocabulary, max_seq_length)))
    depth = encoder.config.num_hidden_layers  # the default: the last four layers, or all of a shallower model
    default = "-1" if pooled else ",".join(f"-{i}" for i in range(1, min(4, depth) + 1))
    indices = parse_layers(settings.layers or default, depth)
    if pooled:
        log.info("vectors: %s pooling of layer(s) %s%s, max_seq_length %d%s", "+".join(modes),
                 ",".join(map(str, indices)), ", normalized" * normalize, max_seq_length,
                 " (sentence-transformers directory)" * bool(sentence))
    encodings = _encode(vocabulary, inputs, max_seq_length)
    UntrainedPositions(directory_trained_positions(model_dir), str(model_dir)).check([len(e) for e in encodings])
    output_path.parent.mkdir(parents=True, exist_ok=True)
    batches = _hidden_states(encoder, encodings, indices, settings.batch_size, vocabulary.pad_token_id,
                             str(model_dir))
    partial = output_path.with_name(output_path.name + ".partial")  # the output appears whole, or not at all
    try:
        if pooled:
            width = len(indices) * len(modes) * encoder.config.hidden_size
            _write_npy(partial, len(encodings), width, modes, normalize, batches)
        else:
            _write_jsonl(partial, encodings, indices, batches)
        os.replace(partial, output_path)
    except OSError as exc:  # a disk that filled while writing
        raise BertkitError(f"--output {output_path}: cannot write it ({exc.strerror}); "
                           f"{failed_write_advice(exc, output_path.parent)}") from None
    finally:
        partial.unlink(missing_ok=True)
    return len(encodings)


def _max_seq_length(given: int | None, directory_length: int | None, positions: int, model_dir: Path) -> int:
    """--max-seq-length, refused past the model's `positions` (before any work); unset: the
    sentence-transformers directory's length, else DEFAULT_MAX_SEQ_LENGTH, cut to what the model holds."""
    if given is not None and given > positions:
        raise BertkitError(f"--max-seq-length {given} exceeds the model's max_position_embeddings ({positions}, "
                           f"{model_dir / 'config.json'}); give at most {positions}")
    return min(given or directory_length or DEFAULT_MAX_SEQ_LENGTH, positions)


def _check_output(path: Path, overwrite: bool) -> None:
    """Refuse a directory as --output, and an existing non-empty file unless `overwrite`."""
    if path.is_dir():
        raise BertkitError(f"--output {path} is a directory; give a file name (*.jsonl or *.npy)")
    if path.exists() and path.stat().st_size and not overwrite:
        raise BertkitError(f"--output {path} exists; pass --overwrite to replace it, or choose another name")
    check_writable(path, "--output", directory=False)


def _pooled_output(path: Path, pooling: str | None, normalize: bool | None) -> bool:
    """True for .npy (pooled vectors), False for .jsonl (per-token values); other names are refused."""
    suffix = path.suffix.lower()
    if suffix == ".npy":
        return True
    if suffix != ".jsonl":
        raise BertkitError(f"--output {path}: name it *.jsonl (per-token layer values) or *.npy (one pooled "
                           "vector per line); the extension picks the format")
    if pooling is not None or normalize is not None:
        flag = "--pooling" if pooling is not None else "--normalize/--no-normalize"
        raise BertkitError(f"--output {path}: {flag} makes one vector per line, written as NumPy; name the "
                           f"output *.npy, or drop {flag} for per-token JSONL")
    return False


def _encode(tokenizer: WordPieceTokenizer, inputs: list[tuple[str, str | None]], max_seq_length: int) -> list:
    encodings: list = [None] * len(inputs)
    for has_pair in (False, True):  # the tokenizer encodes singles and pairs in separate calls
        rows = [i for i, (_, b) in enumerate(inputs) if (b is not None) == has_pair]
        if rows:
            pairs = [inputs[i][1] or "" for i in rows] if has_pair else None  # rows with a pair: never None
            cut = tokenizer.encode_batch([inputs[i][0] for i in rows], pairs, max_length=max_seq_length)
            truncated = sum(e.truncated for e in cut)
            if truncated:
                log.warning("%d of %d lines are longer than --max-seq-length %d tokens and were truncated "
                            "(pairs longest-first)", truncated, len(inputs), max_seq_length)
            for i, encoding in zip(rows, cut):
                encodings[i] = encoding
    return encodings


def _hidden_states(encoder: BertModel, encodings: Sequence, indices: list[int], batch_size: int,
                   pad_token_id: int, model_id: str) -> Iterator[tuple[list[int], list[torch.Tensor], torch.Tensor]]:
    """Per length-sorted batch: its line numbers, the requested layers (B, T, H) each, and the mask; NaN or inf in
    them raises ModelFault (never written as features)."""
    features = [{"input_ids": e.input_ids, "token_type_ids": e.token_type_ids, "attention_mask": e.attention_mask}
                for e in encodings]
    for rows, batch in sorted_batches(features, batch_size, pad_token_id):
        with torch.inference_mode():
            hidden = encoder(**batch, output_hidden_states=True).hidden_states[1:]  # L x (B, T, H), no embeddings
        yield rows, check_finite([hidden[i] for i in indices], model_id), batch["attention_mask"]


def _write_jsonl(path: Path, encodings: Sequence, indices: list[int], batches: Iterator) -> None:
    """Lines in input order: batches come length-sorted, so finished lines wait until their turn."""
    waiting: dict[int, str] = {}
    next_line = 0
    with path.open("w", encoding="utf-8") as out:
        for rows, layers, _ in batches:
            for b, row in enumerate(rows):
                waiting[row] = _feature_line(row, encodings[row], [layer[b] for layer in layers], indices)
            while next_line in waiting:
                out.write(waiting.pop(next_line) + "\n")
                next_line += 1


def _feature_line(row: int, encoding, layers: list[torch.Tensor], indices: list[int]) -> str:
    values = [np.round(layer[:len(encoding)].float().numpy().astype(np.float64), 6) for layer in layers]  # (T, H)
    tokens = [{"token": token,
               "layers": [{"index": index, "values": v[t].tolist()} for index, v in zip(indices, values)]}
              for t, token in enumerate(encoding.tokens)]
    return json.dumps({"linex_index": row, "features": tokens})


def _write_npy(path: Path, rows: int, width: int, modes: tuple[str, ...], normalize: bool,
               batches: Iterator) -> None:
    vectors = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(rows, width))
    for lines, layers, mask in batches:
        vectors[lines] = sentence_vectors(layers, mask, modes, normalize).numpy()  # (B, width)
    vectors.flush()
    del vectors
