"""Domain adaptation of an existing BERT directory: its vocabulary extended with a domain's pieces, and the
pooler a masked-LM-only continuation keeps.

`extend_model(settings)` (the `bertkit tokenizer extend` command, `TokenizerExtendSettings`) chooses the pieces
(`bertkit.tokenizer.extend`), appends them to the vocabulary, and writes a copy of the directory whose
word-embedding matrix, MLM decoder (tied to it) and MLM bias have one more row per new piece.
`carry_pooler(source, target)` adds the released pooler to a masked-LM-only continuation's weights (the
sentence-transformers files are carried by `bertkit.interop.sentence_transformers.copy_module_files`).

Design decision: the checkpoint is edited as the Hugging Face tensors it holds (read with the same checks as
every load, `read_state_dict`), not rebuilt through a bertkit model, so every tensor and file it has is kept
as it was except the rows added: old ids keep their rows, so old-vocabulary text gives the same outputs
(tested against transformers). A new row is the mean of the embeddings of the pieces the old vocabulary
splits the new piece into (its MLM bias the mean of theirs), the usual rule (Hewitt 2021; exBERT): the new
word starts where the model already places it, and its MLM probability starts near its pieces' rather than
dominating the softmax. `init="random"` draws rows as the paper initialises embeddings (normal, std
initializer_range; bias 0) for comparison. Files that hold the old vocabulary's weights in another format
(pytorch_model.bin, TF/Flax/ONNX/OpenVINO exports) are left out and named; tokenizer.json gets the new
pieces; everything else (README, tokenizer_config.json, 1_Pooling/ ...) is copied.

References: Hewitt 2021, "Initializing New Word Embeddings for Pretrained Language Models"; Tai et al. 2020,
"exBERT"; Gururangan et al. 2020, "Don't Stop Pretraining"; sentence-transformers' modules.json layout.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from bertkit.errors import BertkitError
from bertkit.io.atomic import check_writable, write_file_atomic, write_text_atomic
from bertkit.io.jsonfile import read_json, read_json_object
from bertkit.model.pretrained import read_state_dict
from bertkit.settings import TokenizerExtendSettings
from bertkit.tokenizer import TOKENIZER_JSON, VOCAB_FILE, WordPieceTokenizer
from bertkit.tokenizer.extend import Extension, choose_new_pieces, measure, wordpiece
from bertkit.tokenizer.vocab import vocab_text

logger = logging.getLogger(__name__)

REPORT_FILE = "vocabulary_extension.json"
EMBEDDING_KEYS = ("embeddings.word_embeddings.weight", "bert.embeddings.word_embeddings.weight")
# Tensors with one entry per vocabulary id besides the embeddings: the MLM bias (twice in older files) and an
# untied copy of the decoder.
BIAS_KEYS = ("cls.predictions.bias", "cls.predictions.decoder.bias")
DECODER_KEY = "cls.predictions.decoder.weight"
# Weights in other formats (stale once the vocabulary grows) and the files this module writes itself.
LEFT_OUT = ("pytorch_model.bin", "pytorch_model.bin.index.json", "tf_model.h5", "flax_model.msgpack",
            "rust_model.ot", "model.onnx", "onnx", "openvino", "model.safetensors.index.json")
WRITTEN = ("model.safetensors", "config.json", VOCAB_FILE, TOKENIZER_JSON, REPORT_FILE)


def extend_model(settings: TokenizerExtendSettings) -> dict[str, Any]:
    """Write `settings.output`: `settings.model` with the `settings.add` most useful pieces of the corpus appended
    to its vocabulary and embeddings (module docstring); return the report also written to
    output/vocabulary_extension.json."""
    model_dir, output, corpus = Path(settings.model), Path(settings.output), settings.corpus
    add, init, seed, min_count = settings.add, settings.init, settings.seed, settings.min_count
    strict, text_column = settings.strict, settings.text_column
    config = _bert_config(model_dir)
    if output.exists() and (output.resolve() == model_dir.resolve() or any(output.iterdir())):
        raise BertkitError(f"--output {output} already holds files; give a new directory (the extended model is "
                           "written beside the original, never over it)")
    check_writable(output, "--output")
    tokenizer = WordPieceTokenizer.from_pretrained(model_dir)
    tokens = sorted(tokenizer.vocab, key=tokenizer.vocab.__getitem__)  # in id order
    state = read_state_dict(model_dir)
    key = next((k for k in EMBEDDING_KEYS if k in state), None)
    if key is None or state[key].ndim != 2 or state[key].shape[0] < len(tokens):
        raise BertkitError(f"{model_dir}: not a BERT checkpoint - no word-embedding matrix "
                           f"({EMBEDDING_KEYS[0]}) with a row for each of the {len(tokens)} tokens of its vocabulary")
    extension = choose_new_pieces(tokens, tokenizer.do_lower_case, corpus, add, min_count, strict, text_column)
    measure(extension, tokens, corpus, tokenizer.do_lower_case, strict, text_column)
    rows, fallback = _new_rows(state, key, tokens, extension.pieces, init, seed, config)
    size = max(state[key].shape[0], len(tokens) + len(extension.pieces))
    for name, values in rows.items():
        state[name] = _grow(state[name], size, len(tokens), values)
    left_out = _write_directory(model_dir, output, state, {**config, "vocab_size": size},
                                tokens + extension.pieces)
    report = _report(model_dir, corpus, extension, init, fallback, size, left_out)
    write_text_atomic(output / REPORT_FILE, json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    return report


def _bert_config(model_dir: Path) -> dict[str, Any]:
    """config.json of a BERT directory, as a dict (every key kept for the copy)."""
    path = model_dir / "config.json"
    if not path.is_file():
        raise BertkitError(f"--model {model_dir}: no config.json there; give a BERT model directory (one that "
                           "transformers' BertModel or bertkit loads)")
    config = read_json(path)
    if not isinstance(config, dict) or config.get("model_type", "bert") != "bert" or "hidden_size" not in config:
        kind = config.get("model_type") if isinstance(config, dict) else None
        raise BertkitError(f"--model {model_dir}: not a BERT directory (config.json model_type {kind!r}); "
                           "`tokenizer extend` resizes BERT checkpoints with a WordPiece vocabulary")
    return config


def _new_rows(state: dict[str, torch.Tensor], key: str, tokens: list[str], pieces: list[str], init: str,
              seed: int, config: dict[str, Any]) -> tuple[dict[str, torch.Tensor], int]:
    """{tensor name: its rows for the new pieces} and how many pieces fell back to random init (their old
    split is [UNK])."""
    embeddings = state[key].float()
    index = {t: i for i, t in enumerate(tokens)}
    generator = torch.Generator().manual_seed(seed)
    std = float(config.get("initializer_range", 0.02))
    random_rows = torch.randn(len(pieces), embeddings.shape[1], generator=generator) * std  # (N, H)
    biases = [k for k in BIAS_KEYS if k in state]
    rows, bias_rows, fallback = [], [], 0
    for i, piece in enumerate(pieces):
        split = wordpiece(piece, index) if init == "mean" else None
        if split is None:
            fallback += init == "mean"
            rows.append(random_rows[i])
            bias_rows.append(0.0)
            continue
        ids = [index[p] for p in split]
        rows.append(embeddings[ids].mean(0))
        bias_rows.append(state[biases[0]].float()[ids].mean().item() if biases else 0.0)
    new = torch.stack(rows)
    result = {key: new} | ({DECODER_KEY: new} if DECODER_KEY in state else {})
    return result | {k: torch.tensor(bias_rows) for k in biases}, fallback


def _grow(tensor: torch.Tensor, size: int, first: int, rows: torch.Tensor) -> torch.Tensor:
    """`tensor` with `size` entries along dim 0: the old ones kept, `rows` at first.., zeros after them."""
    shape = (size - tensor.shape[0], *tensor.shape[1:])
    grown = torch.cat([tensor, torch.zeros(shape, dtype=tensor.dtype)]) if size > tensor.shape[0] else tensor.clone()
    grown[first:first + len(rows)] = rows.to(tensor.dtype)
    return grown.contiguous()


def _write_directory(source: Path, output: Path, state: dict[str, torch.Tensor], config: dict[str, Any],
                     tokens: list[str]) -> list[str]:
    """Copy `source` to `output` with the new weights, config and vocabulary; return the names left out."""
    left_out = sorted(p.name for p in source.iterdir() if p.name in LEFT_OUT or (p.name.endswith(".safetensors")
                      and p.name != "model.safetensors") or p.name.startswith("pytorch_model-"))
    skip = set(left_out) | set(WRITTEN)
    output.mkdir(parents=True, exist_ok=True)
    for path in source.iterdir():
        if path.name in skip or path.name.startswith("."):
            continue
        if path.is_dir():
            shutil.copytree(path, output / path.name)
        else:
            shutil.copy2(path, output / path.name)
    write_file_atomic(output / "model.safetensors", lambda t: save_file(state, t, metadata={"format": "pt"}))
    write_text_atomic(output / "config.json", json.dumps(config, indent=2) + "\n")
    write_text_atomic(output / VOCAB_FILE, vocab_text(tokens))
    if (source / TOKENIZER_JSON).is_file():
        _extend_tokenizer_json(source / TOKENIZER_JSON, output / TOKENIZER_JSON, tokens)
    if not (output / "tokenizer_config.json").is_file():
        WordPieceTokenizer.from_pretrained(output).save_pretrained(output)
    if left_out:
        logger.warning("left out %s: they hold the old vocabulary's weights (convert the new directory again)",
                       ", ".join(left_out))
    return left_out


def _extend_tokenizer_json(source: Path, target: Path, tokens: list[str]) -> None:
    """tokenizer.json with the vocabulary `tokens` (old ids unchanged, new ones after them)."""
    spec = read_json_object(source)
    spec["model"]["vocab"] = {token: i for i, token in enumerate(tokens)}
    write_text_atomic(target, json.dumps(spec, ensure_ascii=False) + "\n")


def _report(model_dir: Path, corpus: Sequence[str | Path], extension: Extension, init: str, fallback: int,
            size: int, left_out: list[str]) -> dict[str, Any]:
    before, after = extension.tokens_per_word()
    return {
        "model": str(model_dir), "corpus": [str(c) for c in corpus], "init": init,
        "added": len(extension.pieces), "vocab_size": size, "first_new_id": size - len(extension.pieces),
        "words": extension.words, "tokens_before": extension.tokens_before, "tokens_after": extension.tokens_after,
        "tokens_per_word_before": round(before, 4), "tokens_per_word_after": round(after, 4),
        "candidates_that_save_tokens": extension.candidates, "random_init_fallbacks": fallback,
        "left_out_files": left_out,
        "pieces": [{"token": p, "saved": s} for p, s in zip(extension.pieces, extension.saved)],
    }


def carry_pooler(source: str | Path, target: str | Path) -> bool:
    """Add the pooler of the checkpoint in `source` to `target`'s model.safetensors when `target` has none (a
    masked-LM-only model continued from `source` never uses, trains or saves it, so the released one is still
    the right one, and fine-tuning a classifier from `target` starts from it rather than from random weights).
    False when there is nothing to carry."""
    target_file = Path(target) / "model.safetensors"
    state = load_file(str(target_file))
    if any(".pooler." in f".{k}" for k in state):
        return False
    pooler = {k: v for k, v in read_state_dict(source).items() if k.removeprefix("bert.").startswith("pooler.")}
    if not pooler:
        return False
    prefix = "bert." if any(k.startswith("bert.") for k in state) else ""
    state |= {prefix + k.removeprefix("bert."): v.contiguous() for k, v in pooler.items()}
    write_file_atomic(target_file, lambda t: save_file(state, t, metadata={"format": "pt"}))
    return True
