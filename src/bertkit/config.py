"""Model configuration: `BertConfig` with Hugging Face's field names, and the size presets.

Design decision: the dataclass fields are exactly the keys of a Hugging Face BERT `config.json`, so a
config round-trips through `transformers` unchanged. Keys we do not model (`use_cache`,
`torch_dtype`, ...) are kept in `extra` and written back, never silently lost. This module imports
no torch, so the CLI can read configs quickly.

Presets are the sizes of the paper (Base, Large) and of Google's released miniatures
(Turc et al., 2019: tiny, mini, small, medium); `bert-debug` is for tests.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bertkit.errors import BertkitError
from bertkit.io.bounded import file_present

SUPPORTED_ACTIVATIONS = ("gelu", "relu", "gelu_new", "gelu_pytorch_tanh")


@dataclass
class BertConfig:
    """Shape and regularisation of a BERT encoder; field names as in Hugging Face's BertConfig."""

    vocab_size: int = 30522
    """Number of WordPiece tokens (rows of the word embedding)."""
    hidden_size: int = 768
    """Width H of every layer's hidden state."""
    num_hidden_layers: int = 12
    """Number L of Transformer encoder layers."""
    num_attention_heads: int = 12
    """Number A of attention heads; hidden_size must be divisible by it."""
    intermediate_size: int = 3072
    """Width of the feed-forward layer (4H in the paper)."""
    hidden_act: str = "gelu"
    """Feed-forward activation: 'gelu' is the exact erf GELU of the original."""
    hidden_dropout_prob: float = 0.1
    """Dropout on embeddings, attention output and feed-forward output."""
    attention_probs_dropout_prob: float = 0.1
    """Dropout on attention probabilities."""
    max_position_embeddings: int = 512
    """Longest sequence the position embedding covers."""
    type_vocab_size: int = 2
    """Number of segment (token type) ids: A and B."""
    layer_norm_eps: float = 1e-12
    """LayerNorm epsilon (1e-12 in the original)."""
    initializer_range: float = 0.02
    """Std of the truncated-normal weight initialisation."""
    pad_token_id: int = 0
    """Id of [PAD]."""
    classifier_dropout: float | None = None
    """Dropout before task heads; None means hidden_dropout_prob."""
    num_labels: int | None = None
    """Outputs of a classification/tagging head (1 = regression); None when there is no task head."""
    id2label: dict[int, str] | None = None
    """Label names of a task head, by output index."""
    problem_type: str | None = None
    """Hugging Face's problem type, e.g. 'regression' or 'single_label_classification'."""
    architectures: list[str] | None = None
    """Hugging Face class names the weights belong to, e.g. ['BertForPreTraining']."""
    extra: dict[str, Any] = field(default_factory=dict)
    """config.json keys this dataclass does not model, written back unchanged."""

    def __post_init__(self) -> None:
        if self.id2label is not None and self.num_labels is None:
            self.num_labels = len(self.id2label)
        self.validate()

    def validate(self) -> None:
        """Raise BertkitError naming the first field that makes no sense."""
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "intermediate_size", "max_position_embeddings", "type_vocab_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise BertkitError(f"config: {name} must be a positive integer, got {value!r}")
        if self.hidden_size % self.num_attention_heads:
            raise BertkitError(
                f"config: hidden_size ({self.hidden_size}) must be divisible by num_attention_heads "
                f"({self.num_attention_heads}); pick a head count that divides it")
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise BertkitError(f"config: {name} must be in [0, 1), got {value!r}")
        if self.hidden_act not in SUPPORTED_ACTIVATIONS:
            raise BertkitError(f"config: hidden_act {self.hidden_act!r} is not supported; "
                               f"use one of {', '.join(SUPPORTED_ACTIVATIONS)}")
        if not self.layer_norm_eps > 0:
            raise BertkitError(f"config: layer_norm_eps must be positive, got {self.layer_norm_eps!r}")
        if not 0 <= self.pad_token_id < self.vocab_size:
            raise BertkitError(f"config: pad_token_id {self.pad_token_id} is outside the vocabulary "
                               f"(vocab_size {self.vocab_size})")
        if self.num_labels is not None and self.num_labels <= 0:
            raise BertkitError(f"config: num_labels must be positive, got {self.num_labels!r}")
        if self.id2label is not None and len(self.id2label) != self.num_labels:
            raise BertkitError(f"config: id2label names {len(self.id2label)} labels but num_labels is "
                               f"{self.num_labels}; give one name per label")
        if self.id2label is not None and sorted(self.id2label) != list(range(len(self.id2label))):
            raise BertkitError(f"config: id2label keys {sorted(self.id2label)[:8]} are not the label indices "
                               f"0..{len(self.id2label) - 1}; number the labels from 0 without gaps")

    def parameter_count(self) -> int:
        """Parameters of the encoder with its pooler (a task head adds at most H*H + H + V more)."""
        h, i = self.hidden_size, self.intermediate_size
        embeddings = (self.vocab_size + self.max_position_embeddings + self.type_vocab_size) * h + 2 * h
        layer = 4 * h * h + 4 * h + 2 * h * i + i + h + 4 * h  # Q, K, V, output; FFN in and out; two LayerNorms
        return embeddings + self.num_hidden_layers * layer + h * h + h

    @property
    def head_size(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def label_names(self) -> list[str] | None:
        if self.id2label is None:
            return None
        return [self.id2label[i] for i in sorted(self.id2label)]

    def replace(self, **changes: Any) -> BertConfig:
        """A validated copy with some fields changed."""
        return dataclasses.replace(self, **changes)

    # --- config.json -------------------------------------------------------------------------

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BertConfig:
        known = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        kwargs = {k: v for k, v in data.items() if k in known}
        extra = {k: v for k, v in data.items() if k not in known and k not in _DERIVED_KEYS}
        if data.get("model_type", "bert") != "bert":
            raise BertkitError(f"config: model_type is {data['model_type']!r}, not 'bert'")
        if data.get("is_decoder") or data.get("add_cross_attention"):
            raise BertkitError("config: is_decoder / add_cross_attention is set: a causal BERT (transformers' "
                               "BertLMHeadModel, or an encoder-decoder's half), which bertkit would run "
                               "bidirectionally; bertkit runs BERT's encoder: use transformers for this model")
        position_type = data.get("position_embedding_type", "absolute")
        if position_type != "absolute":
            raise BertkitError(f"config: position_embedding_type {position_type!r} is not supported; "
                               "bertkit implements the original absolute position embeddings")
        if kwargs.get("id2label") is not None:
            kwargs["id2label"] = _label_names(kwargs["id2label"])
            kwargs.setdefault("num_labels", len(kwargs["id2label"]))
        return cls(**kwargs, extra=extra)

    def to_dict(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "extra"}
        data = {k: v for k, v in data.items() if v is not None or k == "classifier_dropout"}
        # transformers derives num_labels from id2label, so a head size needs label names (LABEL_i by default).
        id2label = self.id2label
        if id2label is None and self.num_labels is not None:
            id2label = {i: f"LABEL_{i}" for i in range(self.num_labels)}
        if id2label is not None:
            data["id2label"] = {str(k): v for k, v in id2label.items()}
            data["label2id"] = {v: k for k, v in id2label.items()}
        data.pop("num_labels", None)
        data["model_type"] = "bert"
        data["position_embedding_type"] = "absolute"
        return {**self.extra, **data}

    @classmethod
    def from_json_file(cls, path: str | Path) -> BertConfig:
        path = Path(path)
        if path.is_dir():
            file_present(path)  # says it is a directory
        try:
            with open(path, "rb") as handle:  # bounded before decoding: a stream or a huge file is not a config
                raw = handle.read(MAX_CONFIG_BYTES + 1)
            if len(raw) > MAX_CONFIG_BYTES:
                raise BertkitError(f"{path}: more than {MAX_CONFIG_BYTES:,} bytes, which no config.json holds; is it "
                                   "the right file?")
            data = json.loads(raw.decode("utf-8"))
        except FileNotFoundError:
            raise BertkitError(f"{path}: config file not found") from None
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
            raise BertkitError(f"{path}: not a valid JSON config ({type(exc).__name__}: {exc})") from None
        except OSError as exc:
            raise BertkitError(f"{path}: cannot be read ({exc.strerror}); give a model directory or its config.json") \
                from None
        if not isinstance(data, dict):
            raise BertkitError(f"{path}: a config must be a JSON object")
        try:
            return cls.from_dict(data)
        except BertkitError as exc:
            raise BertkitError(f"{path}: {exc}") from None
        except TypeError as exc:
            raise BertkitError(f"{path}: invalid config ({exc})") from None

    def to_json_file(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _label_names(id2label: Any) -> dict[int, str]:
    """config.json's {"0": "negative", "1": "positive"} with int keys (validate() checks they are 0..n-1)."""
    example = '{"0": "negative", "1": "positive"}'
    if not isinstance(id2label, dict):
        raise BertkitError(f"config: id2label must be an object such as {example}, "
                           f"not a {type(id2label).__name__}")
    try:
        labels = {int(k): str(v) for k, v in id2label.items()}
    except ValueError:
        raise BertkitError(f"config: id2label keys must be label indices as in {example}; got "
                           f"{list(id2label)[:8]}") from None
    if len(labels) != len(id2label):
        raise BertkitError(f"config: id2label gives one index twice ({list(id2label)[:8]})")
    return labels


# Keys transformers writes that are derived from our fields (so they are not kept in `extra`).
_DERIVED_KEYS = {"label2id", "model_type", "position_embedding_type", "transformers_version", "dtype", "torch_dtype"}
"""Keys not kept: derived from the fields, or (the dtypes) not true of what bertkit saves (float32 weights; a kept
"bfloat16" made transformers load bertkit's float32 file in bfloat16)."""


# Shapes: (layers, hidden, heads). intermediate_size is 4 * hidden, as in the paper.
MAX_CONFIG_BYTES = 16 << 20
"""Largest config.json read (a BERT config is a few KB; one with a large id2label a few MB)."""

PRESETS: dict[str, tuple[int, int, int]] = {
    "bert-debug": (2, 32, 4),
    "bert-tiny": (2, 128, 2),
    "bert-mini": (4, 256, 4),
    "bert-small": (4, 512, 8),
    "bert-medium": (8, 512, 8),
    "bert-base": (12, 768, 12),
    "bert-large": (24, 1024, 16),
}


def preset(name: str, **overrides: Any) -> BertConfig:
    """The config of a named size; `overrides` set any field (e.g. vocab_size from a tokenizer)."""
    if name not in PRESETS:
        raise BertkitError(f"unknown model preset {name!r}; choose one of {', '.join(PRESETS)} "
                           "or give a path to a config.json")
    layers, hidden, heads = PRESETS[name]
    fields: dict[str, Any] = dict(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                                  intermediate_size=4 * hidden)
    if name == "bert-debug":
        fields["max_position_embeddings"] = 128
    fields.update(overrides)
    return BertConfig(**fields)


def load_config(name_or_path: str | Path, **overrides: Any) -> BertConfig:
    """A preset name, a config.json path, or a directory holding config.json."""
    path = Path(name_or_path)
    if str(name_or_path) in PRESETS:
        return preset(str(name_or_path), **overrides)
    if path.is_dir():
        path = path / "config.json"
    if path.suffix == ".json" or path.exists():
        config = BertConfig.from_json_file(path)
        return config.replace(**overrides) if overrides else config
    raise BertkitError(f"--model {name_or_path!r} is neither a preset ({', '.join(PRESETS)}) "
                       "nor a config.json / checkpoint directory")


# --- model directories ------------------------------------------------------------------------------

_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")
"""What a Hugging Face Hub id looks like: `bert-base-uncased`, `google/bert_uncased_L-2_H-128_A-2`."""


def _models_beside(path: Path, limit: int = 1000) -> list[str] | None:
    """The model directories (or runs holding best/ or final/) among the first `limit` entries of `path`'s folder,
    sorted; None when that folder is not a local directory other than the current one (a Hub id's owner)."""
    folder = path.parent
    if str(folder) in ("", ".") or not folder.is_dir():
        return None
    entries = sorted(itertools.islice(folder.iterdir(), limit))
    return [entry.name for entry in entries if any((entry / inside / "config.json").is_file()
                                                   for inside in ("", "best", "final"))]


def check_model_directory(path: str | Path, flag: str = "--model", presets: bool = False) -> Path:
    """`path` when it is a model directory (it holds config.json), else a one-line `BertkitError` naming
    `flag` that says what the path is instead and how to get a model directory.

    Every command that reads a model (finetune, predict, evaluate, extract, export, serve, info) calls it
    before anything else, so a Hub id or a wrong path is named as the model, before any data is read.
    bertkit never downloads: a Hub id that is not a local directory gets the command that fetches one
    on a machine with internet access. `presets`: the flag also takes a preset name (finetune), said so."""
    path = Path(path)
    label = f"{flag} {path}" if flag else str(path)
    layout = "config.json, model.safetensors or pytorch_model.bin, vocab.txt"
    if not path.exists():
        nor = f" (nor a preset for random initialisation: {', '.join(PRESETS)})" if presets else ""
        near = _models_beside(path)
        if near is not None:  # its folder is here: a local path with a typo or a run not made yet, not a Hub id
            raise BertkitError(f"{label}: no such model directory{nor}; {path.parent} holds "
                               f"{', '.join(near) if near else 'no model directory'} ({layout}, or a run's "
                               "best/ or final/)")
        hub_id = _HUB_ID.fullmatch(str(path)) is not None
        name = str(path) if hub_id else "bert-base-uncased"
        fetch = (f"`huggingface-cli download {name} --local-dir {name.rsplit('/', 1)[-1]}` on a machine with "
                 "internet access (or `save_pretrained` in transformers), then copy the directory here")
        hint = f"if {name} is a Hugging Face Hub id, get it with {fetch}" if hub_id else \
            f"for a Hugging Face Hub model, e.g. {name}: {fetch}"
        raise BertkitError(f"{label}: no such model directory{nor}. bertkit never downloads models; it reads a local "
                           f"directory ({layout}): {hint}; for Google's TensorFlow checkpoints, `bertkit convert "
                           "--tf-checkpoint DIR --output DIR`")
    if not path.is_dir():
        raise BertkitError(f"{label}: is a file; give the model directory that holds it ({path.parent}), "
                           f"with {layout}")
    if not file_present(path / "config.json"):
        inside = [d for d in ("best", "final") if (path / d / "config.json").is_file()]
        if inside:
            hint = f"; the model is in {path / inside[0]} (the run's {inside[0]}/)"
        elif (path / "vocab.txt").is_file() or (path / "tokenizer.json").is_file():
            hint = "; it holds a vocabulary only: a tokenizer directory (--tokenizer), not a model"
        else:
            hint = f"; a model directory holds {layout}"
        raise BertkitError(f"{label}: no config.json, so not a model directory{hint}")
    return path
