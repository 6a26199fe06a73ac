"""The teacher's outputs on every training feature, computed once and kept in chunks that a resumed run reuses.

    teacher_outputs(teacher, outputs, features, directory, pad_token_id, batch_size, device, teacher_id, ctx,
                    variant) -> [{name: array}]
    weights_sha256(teacher) -> str      what a distillation's run record keeps of its teacher

Layout: DIRECTORY/manifest.json (`{"key": ..., "chunk_size": ..., "features": ...}`) and one
chunk-NNNNN.safetensors per `CHUNK_SIZE` features, each holding, per output name, the chunk's arrays flattened
into one float32 vector and their shapes (`NAME.shapes`, int64 (n, ndim)).

Design decision: the key is a digest of the teacher's weights, the features' token ids and the output names, so
a cache is reused only for the same teacher on the same inputs (another key: the directory starts over, said in a
line); each chunk is written atomically with the key in its metadata and validated when read back (its key, the
right count, each array's shape against the teacher's output on one feature, finite values), and a damaged one or
one from another run is computed again with a warning, never used. An interrupted computation keeps its finished
chunks. Under torchrun, rank 0 computes and writes (the others wait at a barrier: a large --unlabeled file is
computed by one process, within the process group's timeout) and every rank then reads; the output directory must
be shared by the processes, as the run's checkpoints are.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.numpy import load_file, save_file
from torch import nn
from tqdm.auto import tqdm

from bertkit.inference.batching import check_finite, model_outputs
from bertkit.io.atomic import write_file_atomic, write_text_atomic
from bertkit.io.jsonfile import read_json_object
from bertkit.train.distributed import DistributedContext, barrier

log = logging.getLogger(__name__)

class Outputs(Protocol):
    """Which outputs of the teacher are kept: a `Task` (its outputs), or any object naming them alike."""

    @property
    def output_names(self) -> Sequence[str]: ...

    @property
    def token_level_outputs(self) -> Sequence[str]: ...


CHUNK_SIZE = 2048
"""Features per chunk file: what an interruption can cost to compute again."""
MANIFEST = "manifest.json"


def cache_key(teacher: nn.Module, features: Sequence[dict[str, Any]], names: Sequence[str], variant: str = "") -> str:
    """sha256 of the teacher's weights (names, shapes, bytes), every feature's token ids and segment ids, the output
    names and `variant` (what else decides the outputs, e.g. a sentence encoder's pooling)."""
    digest = hashlib.sha256(json.dumps([list(names), variant]).encode())
    _update_with_weights(digest, teacher)
    for feature in features:
        digest.update(json.dumps([feature["input_ids"], feature["token_type_ids"]]).encode())
    return digest.hexdigest()


def weights_sha256(module: nn.Module) -> str:
    """sha256 (first 16 hex digits) of a module's weights: names, shapes, dtypes and bytes. A run records its
    teacher's, so a resume with another teacher at the same path is refused."""
    digest = hashlib.sha256()
    _update_with_weights(digest, module)
    return digest.hexdigest()[:16]


def _update_with_weights(digest: Any, module: nn.Module) -> None:
    for key, value in sorted(module.state_dict().items()):
        tensor = value.detach().cpu().contiguous()
        digest.update(f"{key}:{tuple(tensor.shape)}:{tensor.dtype}".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())


def teacher_outputs(teacher: nn.Module, outputs: Outputs, features: Sequence[dict[str, Any]], directory: Path,
                    pad_token_id: int, batch_size: int, device: torch.device, teacher_id: str = "the teacher",
                    ctx: DistributedContext | None = None, variant: str = "") -> list[dict[str, np.ndarray]]:
    """The teacher's `outputs.output_names` for each feature (float32; its `token_level_outputs` cut to the
    feature's length), from the cache in `directory` where it holds them, computed (and kept) where it does not. A
    non-finite output raises `ModelFault` naming `teacher_id` (a broken teacher teaches nothing)."""
    names = tuple(outputs.output_names)
    if not features:
        return []
    key = cache_key(teacher, features, names, variant)
    chunks = range(0, len(features), CHUNK_SIZE)
    one = model_outputs(teacher, features[:1], names, outputs.token_level_outputs, 1, pad_token_id, device)
    expected = Expected(key, {name: one[name][0].shape for name in names}, frozenset(outputs.token_level_outputs))
    if ctx is None or ctx.is_main:
        _start(directory, key, len(features))
        computed = 0
        for start in tqdm(chunks, desc="teacher outputs", unit="chunk", disable=len(chunks) < 2):
            path = _chunk_path(directory, start)
            part = features[start:start + CHUNK_SIZE]
            if _read_chunk(path, part, expected) is None:
                computed_outputs = model_outputs(teacher, part, names, outputs.token_level_outputs, batch_size,
                                                 pad_token_id, device)
                check_finite(computed_outputs, teacher_id)
                _write_chunk(path, names, computed_outputs, key)
                computed += 1
        log.info("teacher outputs of %d features: %d chunk(s) computed, %d read from %s", len(features), computed,
                 len(chunks) - computed, directory)
    if ctx is not None:
        barrier(ctx)
    rows: list[dict[str, np.ndarray]] = []
    for start in chunks:
        part = features[start:start + CHUNK_SIZE]
        count = len(part)
        chunk = _read_chunk(_chunk_path(directory, start), part, expected)
        if chunk is None:
            raise RuntimeError(f"{_chunk_path(directory, start)}: written and then unreadable")
        rows += [{name: chunk[name][i] for name in names} for i in range(count)]
    return rows


def _start(directory: Path, key: str, count: int) -> None:
    """Keep the directory's chunks when its manifest has this key; else start it over."""
    manifest = read_json_object(directory / MANIFEST, missing={}, damaged={})
    if manifest.get("key") != key or manifest.get("chunk_size") != CHUNK_SIZE:
        if directory.exists():
            if manifest:
                log.info("%s holds another teacher's outputs or other inputs; computing them again", directory)
            shutil.rmtree(directory)
        directory.mkdir(parents=True)
        write_text_atomic(directory / MANIFEST, json.dumps({"key": key, "chunk_size": CHUNK_SIZE,
                                                            "features": count}) + "\n")


def _chunk_path(directory: Path, start: int) -> Path:
    return directory / f"chunk-{start // CHUNK_SIZE:05d}.safetensors"


def _write_chunk(path: Path, names: Sequence[str], outputs: dict[str, list[np.ndarray]], key: str) -> None:
    tensors: dict[str, np.ndarray] = {}
    for name in names:
        arrays = outputs[name]
        tensors[name] = np.concatenate([a.reshape(-1) for a in arrays]).astype(np.float32)
        tensors[f"{name}.shapes"] = np.array([a.shape for a in arrays], dtype=np.int64).reshape(len(arrays), -1)
    write_file_atomic(path, lambda target: save_file(tensors, str(target), metadata={"key": key}))


@dataclass(frozen=True)
class Expected:
    """What a chunk of this run holds: its key, and per output name the teacher's output shape on one feature
    (a token-level output's first axis is each feature's own length)."""

    key: str
    shapes: dict[str, tuple[int, ...]]
    token_level: frozenset[str]

    def row_shape(self, name: str, feature: dict[str, Any]) -> tuple[int, ...]:
        shape = self.shapes[name]
        if name in self.token_level:
            return (len(feature["input_ids"]), *shape[1:])
        if shape and feature["input_ids"] and isinstance(feature["input_ids"][0], list):  # one row per choice
            return (len(feature["input_ids"]), *shape[1:])
        return shape


def _read_chunk(path: Path, part: Sequence[dict[str, Any]], expected: Expected) -> dict[str, list[np.ndarray]] | None:
    """The chunk's arrays per name, or None when it is missing, damaged or another run's (said: it is then
    computed again)."""
    if not path.is_file():
        return None
    try:
        with safe_open(str(path), framework="np") as handle:
            key = (handle.metadata() or {}).get("key")
        if key != expected.key:
            raise ValueError("written for another teacher or other inputs")
        tensors = load_file(str(path))
        chunk = {name: _split(tensors[name], tensors[f"{name}.shapes"],
                              [expected.row_shape(name, feature) for feature in part]) for name in expected.shapes}
    except (SafetensorError, KeyError, ValueError, OSError) as exc:
        log.warning("%s is damaged (%s); computing it again", path, exc)
        return None
    return chunk


def _split(flat: np.ndarray, shapes: np.ndarray, wanted: list[tuple[int, ...]]) -> list[np.ndarray]:
    """The arrays of a chunk's flat vector; ValueError for a count, a shape or a size other than `wanted`'s, or a
    non-finite value."""
    count = len(wanted)
    if shapes.ndim != 2 or shapes.shape[0] != count or (shapes < 0).any():
        raise ValueError(f"{shapes.shape[0] if shapes.ndim else 0} arrays, expected {count}")
    found = next((i for i in range(count) if tuple(int(n) for n in shapes[i]) != tuple(wanted[i])), None)
    if found is not None:
        raise ValueError(f"array {found} has shape {tuple(int(n) for n in shapes[found])}, the teacher's is "
                         f"{tuple(wanted[found])}")
    sizes = [int(np.prod(shape)) for shape in shapes]
    if sum(sizes) != flat.size:
        raise ValueError(f"{flat.size} values, the shapes say {sum(sizes)}")
    if not np.isfinite(flat).all():
        raise ValueError("non-finite values")
    offsets = np.cumsum([0, *sizes])
    return [flat[offsets[i]:offsets[i + 1]].reshape(tuple(shapes[i])) for i in range(count)]
