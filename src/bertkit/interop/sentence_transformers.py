"""sentence-transformers directories: the one owner of that format in bertkit. A sentence-transformers directory
is a BERT checkpoint with module files beside it: modules.json (Transformer, Pooling, optionally Normalize),
1_Pooling/config.json, 2_Normalize/, sentence_bert_config.json and config_sentence_transformers.json.

    read_sentence_transformers(directory) -> SentenceModules | None    what `encode` computes there
    choose_pooling(pooling, normalize, settings) -> (modes, normalize)   "auto" resolved with them
    write_module_files(directory, hidden_size, pooling, normalize, max_seq_length)   beside a BertModel checkpoint
    copy_module_files(source, target) -> bool                           a continued model stays a sentence encoder
    cross_encoder_config(directory) / cross_encoder_sigmoid(directory, num_labels)   a CrossEncoder's saved head

Design decision: only the modules that make up a BERT sentence encoder are read (Transformer, then Pooling,
then an optional Normalize); any other module (Dense, LayerNorm, ...) or pooling mode (weightedmean,
lasttoken) is refused with an error rather than approximated. What is written is the layout every
sentence-transformers version since 2.x reads. Extraction, serving and embedding training all go through
here, so `bertkit extract`, `/embed` and the vectors training scored are sentence-transformers' vectors.

Reference: sentence-transformers' Transformer, Pooling, Normalize and CrossEncoder (Reimers and Gurevych,
2019, "Sentence-BERT", arXiv:1908.10084).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertkit import __version__
from bertkit.errors import BertkitError
from bertkit.inference.pooling import POOLINGS
from bertkit.io.atomic import write_text_atomic
from bertkit.io.bounded import file_present
from bertkit.io.jsonfile import read_json, read_json_object

MODULES_FILE = "modules.json"
"""The file that makes a directory a sentence-transformers one."""
CONFIG_FILES = ("sentence_bert_config.json", "config_sentence_transformers.json")
"""The module files at the top of the directory besides modules.json."""
_INCOMPLETE = "the sentence-transformers directory is incomplete or damaged"
# sentence-transformers' older boolean keys, in the order it concatenates the modes they turn on.
LEGACY_POOLING_KEYS = {"pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max",
                       "pooling_mode_mean_tokens": "mean", "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
                       "pooling_mode_weightedmean_tokens": "weightedmean", "pooling_mode_lasttoken": "lasttoken"}


@dataclass(frozen=True)
class SentenceModules:
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
    prompts: tuple[tuple[str, str], ...] = ()
    """The named prompts of config_sentence_transformers.json ((name, text) pairs): `encode(prompt_name=...)`."""

    def prepare(self, text: str, prompt: bool = True, prompt_name: str | None = None) -> str:
        """The text as the Transformer module tokenizes it (the prompt goes before a pair's first text);
        `prompt_name` puts that named prompt in place of the default one."""
        chosen = self.prompt if prompt_name is None else dict(self.prompts)[prompt_name]
        return (chosen if prompt else "") + (text.lower() if self.do_lower_case else text)


def choose_pooling(pooling: str, normalize: bool | None, settings: SentenceModules | None,
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


def read_sentence_transformers(directory: str | Path) -> SentenceModules | None:
    """The settings of a sentence-transformers directory, or None when it has no modules.json."""
    directory = Path(directory)
    modules_path = directory / MODULES_FILE
    if not file_present(modules_path):
        return None
    modules = read_json(modules_path, fix=_INCOMPLETE)
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
    transformer = _optional_object(directory / "sentence_bert_config.json")
    prompt = _default_prompt(directory / "config_sentence_transformers.json")
    poolings, include_prompt = _read_pooling(directory / modules[1].get("path", "") / "config.json")
    if prompt and not include_prompt:
        raise BertkitError(f"{directory}: the pooling excludes the default prompt's tokens (include_prompt "
                           "false), which bertkit does not implement; use sentence-transformers for this model")
    prompts = _optional_object(directory / "config_sentence_transformers.json").get("prompts") or {}
    if not isinstance(prompts, dict):
        raise BertkitError(f"{directory / 'config_sentence_transformers.json'}: 'prompts' must map names to texts, "
                           f"found {type(prompts).__name__}")
    return SentenceModules(poolings, len(kinds) == 3, _max_seq_length(directory, transformer),
                            bool(transformer.get("do_lower_case", False)), prompt,
                            tuple((str(name), str(text)) for name, text in sorted(prompts.items())))


def _module_kind(path: Path, module: Any) -> str:
    if not isinstance(module, dict) or not isinstance(module.get("type"), str):
        raise BertkitError(f"{path}: expected a list of modules with a 'type' each, as sentence-transformers writes")
    _module_folder(path, module)
    return module["type"].rpartition(".")[2]


def _module_folder(path: Path, module: dict[str, Any]) -> str:
    """A module's folder as modules.json names it: relative, inside the directory ("" the directory itself).
    Anything else (an absolute path, "..", not a string) is refused: a model's files never reach outside it."""
    folder = module.get("path", "")
    if not isinstance(folder, str) or Path(folder).is_absolute() or ".." in Path(folder).parts:
        raise BertkitError(f"{path}: module path {folder!r} is not a folder inside the model directory, as "
                           "sentence-transformers writes them (e.g. \"1_Pooling\"); fix modules.json")
    return folder


def _read_pooling(path: Path) -> tuple[tuple[str, ...], bool]:
    """Modes from 'pooling_mode' (a name or a list), or from the older pooling_mode_* booleans."""
    config = read_json_object(path, fix=_INCOMPLETE)
    modes = config.get("pooling_mode")
    if modes is None:
        modes = [mode for key, mode in LEGACY_POOLING_KEYS.items() if config.get(key)] or ["mean"]
    if not isinstance(modes, (str, list)):
        raise BertkitError(f"{path}: 'pooling_mode' must be a name or a list of names, found {type(modes).__name__}")
    modes = [modes] if isinstance(modes, str) else list(modes)
    unsupported = [m for m in modes if m not in POOLINGS]
    if unsupported or not modes:
        raise BertkitError(f"{path}: pooling mode {', '.join(map(repr, unsupported or modes))} is not supported; "
                           f"bertkit pools by {', '.join(POOLINGS)} (use sentence-transformers for this model)")
    return tuple(modes), bool(config.get("include_prompt", True))


def _check_normalize(directory: Path) -> None:
    config = _optional_object(directory / "config.json")
    if config.get("module_input_name", "sentence_embedding") != "sentence_embedding":
        raise BertkitError(f"{directory}/config.json: Normalize of {config['module_input_name']!r} (per-token "
                           "vectors) is not supported; bertkit normalises sentence vectors only")


def _max_seq_length(directory: Path, transformer: dict[str, Any]) -> int | None:
    """sentence_bert_config.json's max_seq_length; sentence-transformers 5+ keeps it in tokenizer_config.json."""
    length = transformer.get("max_seq_length")
    if length is None:
        length = _optional_object(directory / "tokenizer_config.json").get("model_max_length")
    return int(length) if isinstance(length, (int, float)) and 0 < length < 1 << 31 else None


def _default_prompt(path: Path) -> str:
    config = _optional_object(path)
    name = config.get("default_prompt_name")
    if name is None:
        return ""
    prompts = config.get("prompts") or {}
    if name not in prompts:
        raise BertkitError(f"{path}: default_prompt_name {name!r} is not among the prompts {sorted(prompts)}")
    return str(prompts[name])


def _optional_object(path: Path) -> dict[str, Any]:
    """An optional JSON object file: {} when absent; a damaged one is an error naming it."""
    return read_json_object(path, missing={}, fix=_INCOMPLETE)


def write_module_files(directory: Path, hidden_size: int, pooling: str, normalize: bool, max_seq_length: int,
                       pytorch_version: str) -> None:
    """Write the module files of a Transformer -> Pooling (`pooling`: mean, cls or max) -> optional Normalize
    sentence encoder into `directory`, beside the BertModel checkpoint already there."""
    kinds = [("", "Transformer"), ("1_Pooling", "Pooling")] + [("2_Normalize", "Normalize")] * normalize
    modules = [{"idx": i, "name": str(i), "path": path, "type": f"sentence_transformers.models.{kind}"}
               for i, (path, kind) in enumerate(kinds)]
    pooling_config = {"word_embedding_dimension": hidden_size, "pooling_mode": pooling,
                      **{f"pooling_mode_{mode}": pooling == name for name, mode in
                         (("cls", "cls_token"), ("mean", "mean_tokens"), ("max", "max_tokens"))},
                      "pooling_mode_mean_sqrt_len_tokens": False, "include_prompt": True}
    files: dict[str, Any] = {
        MODULES_FILE: modules, "1_Pooling/config.json": pooling_config,
        "sentence_bert_config.json": {"max_seq_length": max_seq_length, "do_lower_case": False},
        "config_sentence_transformers.json": {"__version__": {"bertkit": __version__, "pytorch": pytorch_version},
                                              "prompts": {}, "default_prompt_name": None,
                                              "similarity_fn_name": "cosine"}}
    if normalize:
        files["2_Normalize/config.json"] = {"module_input_name": "sentence_embedding",
                                            "module_output_name": "sentence_embedding"}
    for name, content in files.items():
        (directory / name).parent.mkdir(exist_ok=True)
        write_text_atomic(directory / name, json.dumps(content, indent=2) + "\n")


def copy_module_files(source: str | Path, target: str | Path) -> bool:
    """Copy the module files of the sentence-transformers directory `source` (modules.json, its module folders,
    their configs) into `target`, a BERT directory written from it; False when `source` is not one."""
    source, target = Path(source), Path(target)
    if not file_present(source / MODULES_FILE):
        return False
    modules = read_json(source / MODULES_FILE, fix=_INCOMPLETE)
    if not isinstance(modules, list):
        return False
    folders = {_module_folder(source / MODULES_FILE, m) for m in modules if isinstance(m, dict)} - {""}
    for name in (MODULES_FILE, *CONFIG_FILES):
        if (source / name).is_file():
            shutil.copy2(source / name, target / name)
    for folder in sorted(folders):
        if (source / folder).is_dir():
            shutil.copytree(source / folder, target / folder, dirs_exist_ok=True)
    return True


def cross_encoder_config(directory: Path) -> dict[str, Any] | None:
    """config_sentence_transformers.json of a sentence-transformers CrossEncoder directory, else None (a missing
    or unreadable file is optional metadata: None)."""
    config = read_json_object(directory / "config_sentence_transformers.json", missing={}, damaged={})
    return config if config.get("model_type") == "CrossEncoder" else None


def cross_encoder_length(directory: Path, max_position_embeddings: int) -> int | None:
    """A CrossEncoder's max_length (sentence-transformers keeps it in tokenizer_config.json), if it fits the
    position table; None for other directories."""
    if cross_encoder_config(directory) is None:
        return None
    length = read_json_object(directory / "tokenizer_config.json", missing={}, damaged={}).get("model_max_length")
    return length if isinstance(length, int) and 2 < length <= max_position_embeddings else None


def cross_encoder_sigmoid(directory: Path, num_labels: int) -> bool:
    """Whether sentence-transformers' CrossEncoder.predict passes this directory's one output through a
    sigmoid: the activation it saved (config_sentence_transformers.json since v5, config.json before), or
    its default for one label when a CrossEncoder saved none."""
    saved = read_json_object(directory / "config.json", missing={}, damaged={})
    activation = ((cross_encoder_config(directory) or {}).get("activation_fn")
                  or (saved.get("sentence_transformers") or {}).get("activation_fn")
                  or saved.get("sbert_ce_default_activation_function"))
    if activation is None:
        return cross_encoder_config(directory) is not None and num_labels == 1
    return str(activation).rpartition(".")[2] == "Sigmoid"
