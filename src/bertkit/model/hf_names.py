"""Hugging Face BERT state dicts <-> bertkit state dicts, as a key map kept as data: the names of the
checkpoint layout that `pretrained.py` reads and writes (bertkit's own checkpoints are Hugging Face
directories), so it lives beside the model; `bertkit.interop` converts other layouts into it.

Design decision: bertkit names its modules for readability (`layers.3.ffn_in`) and fuses Q, K and V
into one projection; Hugging Face names them after the TensorFlow original
(`encoder.layer.3.intermediate.dense`) with three separate projections. This module is the only
place that knows both: `from_hf` and `to_hf` are pure functions over {name: tensor} dicts, with no
model classes involved.

bertkit's task models keep the encoder under `bert.` like Hugging Face's; `from_hf` always returns
encoder keys under `bert.` (a checkpoint saved from a bare BertModel has none), and the loader strips
the prefix again for a bare BertModel.

Reference layout: transformers/models/bert/modeling_bert.py.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch

# (Hugging Face prefix, bertkit prefix); "{i}" is a layer number. Encoder names, without "bert.".
ENCODER_KEY_MAP: list[tuple[str, str]] = [
    ("embeddings.word_embeddings.", "embeddings.word."),
    ("embeddings.position_embeddings.", "embeddings.position."),
    ("embeddings.token_type_embeddings.", "embeddings.token_type."),
    ("embeddings.LayerNorm.", "embeddings.norm."),
    ("encoder.layer.{i}.attention.output.dense.", "layers.{i}.attn_out."),
    ("encoder.layer.{i}.attention.output.LayerNorm.", "layers.{i}.attn_norm."),
    ("encoder.layer.{i}.intermediate.dense.", "layers.{i}.ffn_in."),
    ("encoder.layer.{i}.output.dense.", "layers.{i}.ffn_out."),
    ("encoder.layer.{i}.output.LayerNorm.", "layers.{i}.ffn_norm."),
    ("pooler.dense.", "pooler."),
]

# Head names (outside the encoder, never prefixed).
HEAD_KEY_MAP: list[tuple[str, str]] = [
    ("cls.predictions.transform.dense.", "mlm.transform."),
    ("cls.predictions.transform.LayerNorm.", "mlm.norm."),
    ("cls.predictions.bias", "mlm.bias"),
    ("cls.seq_relationship.", "nsp."),
    ("classifier.", "classifier."),
    ("qa_outputs.", "qa_outputs."),
]

# Hugging Face keys that carry no information of their own: tied copies and buffers.
REDUNDANT_HF_KEYS = re.compile(
    r"^(bert\.)?embeddings\.position_ids$|^cls\.predictions\.decoder\.(weight|bias)$")

QKV_HF = re.compile(r"^encoder\.layer\.(\d+)\.attention\.self\.(query|key|value)\.(weight|bias)$")
QKV_OURS = re.compile(r"^layers\.(\d+)\.qkv\.(weight|bias)$")


def _compile(pairs: list[tuple[str, str]], reverse: bool) -> list[tuple[re.Pattern[str], str]]:
    rules = []
    for hf, ours in pairs:
        source, target = (ours, hf) if reverse else (hf, ours)
        pattern = re.compile("^" + re.escape(source).replace(r"\{i\}", r"(?P<i>\d+)"))
        rules.append((pattern, target))
    return rules


_ENCODER_FROM_HF = _compile(ENCODER_KEY_MAP, reverse=False)
_ENCODER_TO_HF = _compile(ENCODER_KEY_MAP, reverse=True)
_HEADS_FROM_HF = _compile(HEAD_KEY_MAP, reverse=False)
_HEADS_TO_HF = _compile(HEAD_KEY_MAP, reverse=True)


def _rename(key: str, rules: list[tuple[re.Pattern[str], str]]) -> str | None:
    for pattern, target in rules:
        match = pattern.match(key)
        if match:
            prefix = target.replace("{i}", match.group("i")) if "{i}" in target else target
            return prefix + key[match.end():]
    return None


def _legacy_layer_norm_names(key: str) -> str:
    """Old checkpoints (and TF conversions) call LayerNorm weight/bias gamma/beta."""
    if "LayerNorm." in key:
        key = re.sub(r"\.gamma$", ".weight", key)
        key = re.sub(r"\.beta$", ".bias", key)
    return key


def from_hf(state: Mapping[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], list[str]]:
    """Hugging Face names -> bertkit names (encoder under `bert.`). Returns (converted, unknown keys)."""
    converted: dict[str, torch.Tensor] = {}
    qkv_parts: dict[tuple[str, str], dict[str, torch.Tensor]] = {}
    unknown: list[str] = []
    for original_key, tensor in state.items():
        if REDUNDANT_HF_KEYS.match(original_key):
            continue
        key = _legacy_layer_norm_names(original_key)
        encoder_key = key[len("bert."):] if key.startswith("bert.") else key
        qkv = QKV_HF.match(encoder_key)
        if qkv:
            layer, which, kind = qkv.groups()
            qkv_parts.setdefault((layer, kind), {})[which] = tensor
            continue
        renamed = _rename(encoder_key, _ENCODER_FROM_HF)
        if renamed is not None:
            converted["bert." + renamed] = tensor
            continue
        renamed = _rename(key, _HEADS_FROM_HF)
        if renamed is not None:
            converted[renamed] = tensor
        else:
            unknown.append(original_key)
    for (layer, kind), parts in qkv_parts.items():
        missing = [name for name in ("query", "key", "value") if name not in parts]
        if missing:
            unknown.extend(f"encoder.layer.{layer}.attention.self.{name}.{kind} (missing)" for name in missing)
            continue
        converted[f"bert.layers.{layer}.qkv.{kind}"] = torch.cat([parts["query"], parts["key"], parts["value"]])
    return converted, unknown


def to_hf(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """bertkit names -> Hugging Face names. Encoder keys keep or lack `bert.` as given."""
    converted: dict[str, torch.Tensor] = {}
    for key, tensor in state.items():
        prefix = "bert." if key.startswith("bert.") else ""
        encoder_key = key[len(prefix):]
        qkv = QKV_OURS.match(encoder_key)
        if qkv:
            layer, kind = qkv.groups()
            for name, part in zip(("query", "key", "value"), tensor.chunk(3)):
                converted[f"{prefix}encoder.layer.{layer}.attention.self.{name}.{kind}"] = part
            continue
        renamed = _rename(encoder_key, _ENCODER_TO_HF)
        if renamed is not None:
            converted[prefix + renamed] = tensor
            continue
        renamed = _rename(key, _HEADS_TO_HF)
        if renamed is None:
            raise KeyError(f"no Hugging Face name for bertkit parameter {key!r}")
        converted[renamed] = tensor
    return converted
