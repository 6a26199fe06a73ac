"""Atomic, pickle-free training checkpoints: write, verify, find the newest valid one, keep the last N.

Design decision: a checkpoint is a directory that only ever appears complete. It is written under a
temporary name in the same parent (so the final rename is atomic on one filesystem), every file is
fsynced, `manifest.json` with the sha256 of every other file is written last, then the directory is
renamed into place and the parent fsynced. A reader trusts a checkpoint only if its manifest exists and
every hash matches, so a save killed at any point leaves either nothing visible or a directory that
`--resume auto` recognises as partial and skips with a warning; the previous checkpoint is never touched.

State is tensors in safetensors files and everything else in JSON: no pickle is written or read.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from bertkit.atomic import fsync_path, replace_directory, write_text_atomic
from bertkit.errors import BertkitError

logger = logging.getLogger(__name__)

MANIFEST = "manifest.json"
PREFIX = "step-"
TEMP_PREFIX = ".tmp-"


# --- directories ------------------------------------------------------------------------------

def checkpoint_name(step: int) -> str:
    return f"{PREFIX}{step:08d}"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_manifest(directory: Path, meta: dict[str, Any] | None = None) -> None:
    """Fsync every file in `directory` and write manifest.json (file -> sha256) last."""
    files = sorted(p for p in directory.rglob("*") if p.is_file() and p.name != MANIFEST)
    for path in files:
        fsync_path(path)
    manifest = {"files": {str(p.relative_to(directory)): _sha256(p) for p in files}, **(meta or {})}
    write_text_atomic(directory / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def save_atomically(root: Path, name: str, write: Callable[[Path], None],
                    meta: dict[str, Any] | None = None) -> Path:
    """Create `root/name` complete or not at all: `write(temp_dir)` fills a temporary directory in `root`,
    which is then hashed into a manifest, fsynced and renamed."""
    root.mkdir(parents=True, exist_ok=True)
    final = root / name
    temp = root / f"{TEMP_PREFIX}{name}-{os.getpid()}"
    shutil.rmtree(temp, ignore_errors=True)
    temp.mkdir()
    try:
        write(temp)
        write_manifest(temp, meta)
        replace_directory(temp, final)  # replaces only an invalid leftover: a valid one is never re-saved
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    return final


def verify_checkpoint(directory: Path) -> str | None:
    """None when `directory` is a complete checkpoint whose files match the manifest, else why not."""
    manifest_path = directory / MANIFEST
    if not manifest_path.is_file():
        return "no manifest.json (the save was interrupted)"
    try:
        files = json.loads(manifest_path.read_text(encoding="utf-8"))["files"]
    except (json.JSONDecodeError, KeyError, UnicodeDecodeError) as exc:
        return f"unreadable manifest.json ({exc})"
    for relative, expected in files.items():
        path = directory / relative
        if not path.is_file():
            return f"{relative} is missing"
        if _sha256(path) != expected:
            return f"{relative} does not match its sha256 in manifest.json"
    return None


def list_checkpoints(root: Path) -> list[Path]:
    """Checkpoint directories under `root`, oldest first (by step in the name)."""
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX))


def find_latest_valid(root: Path) -> Path | None:
    """The newest checkpoint under `root` that verifies; partial or corrupt ones are skipped with a warning."""
    for candidate in reversed(list_checkpoints(root)):
        problem = verify_checkpoint(candidate)
        if problem is None:
            return candidate
        logger.warning("skipping checkpoint %s: %s", candidate, problem)
    return None


def resolve_resume(resume: str | Path | None, root: Path) -> Path | None:
    """`--resume auto` -> newest valid checkpoint under `root` (None when there is none yet);
    a path -> that checkpoint, which must verify; None -> start fresh."""
    if resume is None:
        return None
    if str(resume) == "auto":
        return find_latest_valid(root)
    path = Path(resume)
    if not path.is_dir():
        raise BertkitError(f"--resume {path}: no such checkpoint directory; use --resume auto or a "
                           f"{PREFIX}NNNNNNNN directory under {root}")
    problem = verify_checkpoint(path)
    if problem is not None:
        raise BertkitError(f"--resume {path}: not a valid checkpoint: {problem}; pick another one "
                           "or use --resume auto, which skips broken checkpoints")
    return path


def prune_checkpoints(root: Path, keep_last: int) -> list[Path]:
    """Delete all but the newest `keep_last` checkpoints; returns the deleted directories."""
    doomed = list_checkpoints(root)[:-keep_last] if keep_last > 0 else []
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    return doomed


def remove_stale_temps(root: Path) -> int:
    """Delete temporary directories left by killed saves; returns how many there were."""
    if not root.is_dir():
        return 0
    stale = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(TEMP_PREFIX)]
    for path in stale:
        logger.warning("removing %s, left by an interrupted save", path)
        shutil.rmtree(path, ignore_errors=True)
    return len(stale)


# --- JSON + safetensors state --------------------------------------------------------------------

def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def save_optimizer(optimizer: torch.optim.Optimizer, directory: Path) -> None:
    """optimizer.safetensors (per-parameter tensors as 'index.name') + optimizer.json (the rest)."""
    state = optimizer.state_dict()
    tensors, scalars = {}, {}
    for index, slots in state["state"].items():
        for slot, value in slots.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{index}.{slot}"] = value.detach().cpu().contiguous()
            else:
                scalars[f"{index}.{slot}"] = value
    save_file(tensors, str(directory / "optimizer.safetensors"))
    write_json(directory / "optimizer.json", {"param_groups": state["param_groups"], "scalars": scalars})


IMPLEMENTATION_FLAGS = ("fused", "foreach", "capturable", "differentiable")  # how a step runs, not what it computes


def load_optimizer(optimizer: torch.optim.Optimizer, directory: Path) -> None:
    """Inverse of save_optimizer; tensors are moved to their parameters' devices by torch."""
    meta = read_json(directory / "optimizer.json")
    state: dict[int, dict[str, Any]] = {}
    for key, value in load_file(str(directory / "optimizer.safetensors")).items():
        index, slot = key.split(".", 1)
        state.setdefault(int(index), {})[slot] = value
    for key, value in meta["scalars"].items():
        index, slot = key.split(".", 1)
        state.setdefault(int(index), {})[slot] = value
    groups = [{**group, "betas": tuple(group["betas"])} if "betas" in group else group
              for group in meta["param_groups"]]
    # The implementation flags stay this run's: a checkpoint from a build without the fused kernel would
    # otherwise switch it off and leave torch's grad-scaler support flag pointing at the fused path.
    for saved, current in zip(groups, optimizer.param_groups):
        for flag in IMPLEMENTATION_FLAGS:
            if flag in current:
                saved[flag] = current[flag]
    optimizer.load_state_dict({"state": state, "param_groups": groups})


def capture_rng_state() -> dict[str, Any]:
    """Python, numpy, torch CPU and CUDA generator states as JSON-able values (tensors as byte lists)."""
    version, mt_state, gauss = random.getstate()
    kind, keys, position, has_gauss, cached = np.random.get_state()
    state = {
        "python": [version, list(mt_state), gauss],
        "numpy": [kind, keys.tolist(), int(position), int(has_gauss), float(cached)],
        "torch": torch.get_rng_state().tolist(),
    }
    if torch.cuda.is_available():
        state["cuda"] = [s.tolist() for s in torch.cuda.get_rng_state_all()]
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Inverse of capture_rng_state."""
    version, mt_state, gauss = state["python"]
    random.setstate((version, tuple(mt_state), gauss))
    kind, keys, position, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), position, has_gauss, cached))
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([torch.tensor(s, dtype=torch.uint8) for s in state["cuda"]])


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (CPU and CUDA) generators."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
