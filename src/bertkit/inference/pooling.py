"""Sentence vectors from token vectors, and the sentence-transformers settings of a model directory.

`pool` reduces (B, T, H) hidden states to (B, H) at [CLS], or by mean, max or mean/sqrt(length) over
the real tokens (specials included). `read_sentence_transformers(directory)` reads the files that
sentence-transformers saves beside a BERT checkpoint (modules.json, 1_Pooling/config.json,
2_Normalize, sentence_bert_config.json, config_sentence_transformers.json) into `SentenceSettings`;
`choose_pooling` resolves "auto" with them, so `bertkit extract`, `Predictor.embed` and `/embed`
give the vectors sentence-transformers' `encode` gives for the same directory.

Design decision: only the modules that make up a BERT sentence encoder are read (Transformer, then
Pooling, then an optional Normalize); any other module (Dense, LayerNorm, ...) or pooling mode
(weightedmean, lasttoken) is refused with an error rather than approximated.

Reference: sentence-transformers' Pooling, Normalize and Transformer modules (Reimers and Gurevych,
2019, "Sentence-BERT", arXiv:1908.10084).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from bertkit.errors import BertkitError

POOLINGS = ("cls", "mean", "max", "mean_sqrt_len_tokens")
MODULES_FILE = "modules.json"
# sentence-transformers' older boolean keys, in the order it concatenates the modes they turn on.
LEGACY_POOLING_KEYS = {"pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max",
                       "pooling_mode_mean_tokens": "mean", "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
                       "pooling_mode_weightedmean_tokens": "weightedmean", "pooling_mode_lasttoken": "lasttoken"}


@dataclass(frozen=True)
class SentenceSettings:
    """How a sentence-transformers directory turns texts into sentence vectors."""

    poolings: tuple[str, ...]
    """Pooling modes of 1_Pooling, concatenated in this order."""
    normalize: bool
    """Whether a Normalize module scales each vector to unit length."""
    max_seq_length: int | None
    """Longest input in tokens (sentence_bert_config.json, else tokenizer_config.json); None = the model's."""
    do_lower_case: bool
    """sentence_bert_config.json's do_lower_case: texts are lowercased before tokenizing."""
    prompt: str
    """The default prompt put before every text (config_sentence_transformers.json), usually ''."""

    def prepare(self, text: str, prompt: bool = True) -> str:
        """The text as the Transformer module tokenizes it (the prompt goes before a pair's first text)."""
        return (self.prompt if prompt else "") + (text.lower() if self.do_lower_case else text)


def pool(hidden: torch.Tensor, attention_mask: torch.Tensor, pooling: str) -> torch.Tensor:
    """(B, T, H) -> (B, H) float32: the [CLS] position, or mean / max / sum over sqrt(count) of the
    positions where the mask is 1."""
    if pooling == "cls":
        return hidden[:, 0].float()
    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
    if pooling == "max":
        return hidden.masked_fill(mask == 0, float("-inf")).amax(dim=1).float()
    total = (hidden * mask).sum(dim=1, dtype=torch.float32)  # (B, H)
    count = mask.sum(dim=1, dtype=torch.float32).clamp(min=1)  # (B, 1)
    return total / (count if pooling == "mean" else count.sqrt())


def sentence_vectors(layers: Sequence[torch.Tensor], attention_mask: torch.Tensor, poolings: Sequence[str],
                     normalize: bool) -> torch.Tensor:
    """Each (B, T, H) layer pooled by each mode, concatenated layer by layer -> (B, layers * modes * H)."""
    vectors = torch.cat([pool(hidden, attention_mask, mode) for hidden in layers for mode in poolings], dim=-1)
    return F.normalize(vectors, dim=-1) if normalize else vectors


def choose_pooling(pooling: str, normalize: bool | None, settings: SentenceSettings | None,
                   name: str = "pooling") -> tuple[tuple[str, ...], bool]:
    """(modes, normalize): "auto" is the directory's sentence-transformers pooling, else [CLS];
    `normalize` None follows the directory's Normalize module (off without one)."""
    if pooling == "auto":
        modes = settings.poolings if settings else ("cls",)
    elif pooling in POOLINGS:
        modes = (pooling,)
    else:
        raise BertkitError(f"{name} {pooling!r} is not supported; use auto or one of {', '.join(POOLINGS)}")
    return modes, (settings.normalize if settings else False) if normalize is None else normalize


def read_sentence_transformers(directory: str | Path) -> SentenceSettings | None:
    """The settings of a sentence-transformers directory, or None when it has no modules.json."""
    directory = Path(directory)
    modules_path = directory / MODULES_FILE
    if not modules_path.is_file():
        return None
    modules = _read_json(modules_path)
    kinds = [_module_kind(modules_path, m) for m in (modules if isinstance(modules, list) else [None])]
    if kinds not in (["Transformer", "Pooling"], ["Transformer", "Pooling", "Normalize"]):
        raise BertkitError(f"{modules_path}: modules {', '.join(kinds)} are not a BERT sentence encoder that "
                           "bertkit reads (Transformer, Pooling, optionally Normalize); use sentence-transformers "
                           "for this model, or remove modules.json to use the plain BERT encoder")
    if modules[0].get("path", ""):
        raise BertkitError(f"{modules_path}: the transformer lives in {modules[0]['path']!r}; bertkit reads "
                           "sentence-transformers directories that keep it at the top (path \"\"), as recent versions "
                           "save them; use sentence-transformers for this model")
    if len(kinds) == 3:
        _check_normalize(directory / modules[2].get("path", ""))
    transformer = _read_object(directory / "sentence_bert_config.json", required=False)
    prompt = _default_prompt(directory / "config_sentence_transformers.json")
    poolings, include_prompt = _read_pooling(directory / modules[1].get("path", "") / "config.json")
    if prompt and not include_prompt:
        raise BertkitError(f"{directory}: the pooling excludes the default prompt's tokens (include_prompt "
                           "false), which bertkit does not implement; use sentence-transformers for this model")
    return SentenceSettings(poolings, len(kinds) == 3, _max_seq_length(directory, transformer),
                            bool(transformer.get("do_lower_case", False)), prompt)


def _module_kind(path: Path, module: Any) -> str:
    if not isinstance(module, dict) or not isinstance(module.get("type"), str):
        raise BertkitError(f"{path}: expected a list of modules with a 'type' each, as sentence-transformers writes")
    return module["type"].rpartition(".")[2]


def _read_pooling(path: Path) -> tuple[tuple[str, ...], bool]:
    """Modes from 'pooling_mode' (a name or a list), or from the older pooling_mode_* booleans."""
    config = _read_object(path)
    modes = config.get("pooling_mode")
    if modes is None:
        modes = [mode for key, mode in LEGACY_POOLING_KEYS.items() if config.get(key)] or ["mean"]
    modes = [modes] if isinstance(modes, str) else list(modes)
    unsupported = [m for m in modes if m not in POOLINGS]
    if unsupported or not modes:
        raise BertkitError(f"{path}: pooling mode {', '.join(map(repr, unsupported or modes))} is not supported; "
                           f"bertkit pools by {', '.join(POOLINGS)} (use sentence-transformers for this model)")
    return tuple(modes), bool(config.get("include_prompt", True))


def _check_normalize(directory: Path) -> None:
    config = _read_object(directory / "config.json", required=False)
    if config.get("module_input_name", "sentence_embedding") != "sentence_embedding":
        raise BertkitError(f"{directory}/config.json: Normalize of {config['module_input_name']!r} (per-token "
                           "vectors) is not supported; bertkit normalises sentence vectors only")


def _max_seq_length(directory: Path, transformer: dict[str, Any]) -> int | None:
    """sentence_bert_config.json's max_seq_length; sentence-transformers 5+ keeps it in tokenizer_config.json."""
    length = transformer.get("max_seq_length")
    if length is None:
        length = _read_object(directory / "tokenizer_config.json", required=False).get("model_max_length")
    return int(length) if isinstance(length, (int, float)) and 0 < length < 1 << 31 else None


def _default_prompt(path: Path) -> str:
    config = _read_object(path, required=False)
    name = config.get("default_prompt_name")
    if name is None:
        return ""
    prompts = config.get("prompts") or {}
    if name not in prompts:
        raise BertkitError(f"{path}: default_prompt_name {name!r} is not among the prompts {sorted(prompts)}")
    return str(prompts[name])


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BertkitError(f"{path}: not found; the sentence-transformers directory is incomplete") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BertkitError(f"{path}: not valid JSON ({exc})") from None


def _read_object(path: Path, required: bool = True) -> dict[str, Any]:
    """A JSON object file; an optional one that does not exist reads as {}."""
    if not required and not path.is_file():
        return {}
    data = _read_json(path)
    if not isinstance(data, dict):
        raise BertkitError(f"{path}: expected a JSON object, as sentence-transformers writes")
    return data
