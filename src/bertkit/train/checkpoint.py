"""Atomic, pickle-free training checkpoints: write, verify, find the newest valid one, keep the last N.

Design decision: a checkpoint is a directory that only ever appears complete. It is written under a
temporary name in the same parent (so the final rename is atomic on one filesystem), every file is
fsynced, `manifest.json` with the sha256 of every other file is written last, then the directory is
renamed into place and the parent fsynced. A reader trusts a checkpoint only if its manifest exists and
every hash matches, so a save killed at any point leaves either nothing visible or a directory that
`--resume auto` recognises as partial and skips with a warning; the previous checkpoint is never touched.
A save that fails (disk full) removes its temporary directory and stops the run with a `BertkitError`.
When every checkpoint is broken, `--resume auto` stops too rather than start over from step 0 on top of
them: starting over is the deliberate `--overwrite`. Resuming from a checkpoint older than the newest
starts a new branch: once the loop has accepted the resume, the newer checkpoints are moved aside
(`move_newer_aside`), never deleted, and never resumed by `--resume auto` again.

State is tensors in safetensors files and everything else in JSON: no pickle is written or read. What is
read back is checked for the shape this module and the loop write, so a foreign or edited file that
still matches its hash ends in a `BertkitError` naming it, not a `KeyError` deep in the restore.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from bertkit.errors import BertkitError
from bertkit.io.atomic import failed_write_advice, fsync_path, replace_directory, write_text_atomic
from bertkit.io.digest import file_sha256
from bertkit.io.jsonfile import read_json
from bertkit.train.distributed import DistributedContext, rank0_decides

logger = logging.getLogger(__name__)

MANIFEST = "manifest.json"
PREFIX = "step-"
TEMP_PREFIX = ".tmp-"
ABANDONED_PREFIX = "abandoned-"
TRAINER_STATE = "trainer_state.json"
RNG_STATE = "rng.json"
START_OVER = "--overwrite"  # the flag of pretrain and finetune that deletes a run's checkpoints and starts at step 0


# --- directories ------------------------------------------------------------------------------

def checkpoint_name(step: int) -> str:
    return f"{PREFIX}{step:08d}"


def write_manifest(directory: Path, meta: dict[str, Any] | None = None) -> None:
    """Fsync every file in `directory` and write manifest.json (file -> sha256) last."""
    files = sorted(p for p in directory.rglob("*") if p.is_file() and p.name != MANIFEST)
    for path in files:
        fsync_path(path)
    manifest = {"files": {str(p.relative_to(directory)): file_sha256(p) for p in files}, **(meta or {})}
    write_text_atomic(directory / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    mode = (directory / MANIFEST).stat().st_mode & 0o777  # a plain write's mode (0666 minus the umask)
    for path in files:  # safetensors creates its files 0600: give every file the same mode
        os.chmod(path, mode)


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
    except BaseException as exc:
        shutil.rmtree(temp, ignore_errors=True)
        fix = failed_write_advice(exc, root)
        if fix is None:
            raise
        raise BertkitError(f"{final}: could not save the checkpoint ({exc}); nothing of it was kept and the "
                           f"earlier checkpoints are intact; {fix} and continue with --resume auto") from None
    return final


def verify_checkpoint(directory: Path) -> str | None:
    """None when `directory` is a complete checkpoint whose files match the manifest, else why not."""
    manifest_path = directory / MANIFEST
    if not manifest_path.is_file():
        return "no manifest.json (the save was interrupted)"
    manifest = read_json(manifest_path, damaged=None)
    if manifest is None:
        return "unreadable manifest.json (not UTF-8 JSON)"
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
        return 'manifest.json is not an object {"files": {name: sha256, ...}}'
    for relative, expected in files.items():
        if Path(relative).is_absolute() or ".." in Path(relative).parts:
            return f"manifest.json names {relative!r}, outside the checkpoint directory"
        path = directory / relative
        if not path.is_file():
            return f"{relative} is missing"
        if file_sha256(path) != expected:
            return f"{relative} does not match its sha256 in manifest.json"
    return None


def list_checkpoints(root: Path) -> list[Path]:
    """Checkpoint directories under `root`, oldest first (by step in the name)."""
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX))


def find_latest_valid(root: Path) -> Path | None:
    """The newest checkpoint under `root` that verifies; partial or corrupt ones are skipped with a warning."""
    return _scan(root)[0]


def _scan(root: Path) -> tuple[Path | None, list[str]]:
    """(newest valid checkpoint or None, 'name (problem)' of each newer broken one)."""
    broken: list[str] = []
    for candidate in reversed(list_checkpoints(root)):
        problem = verify_checkpoint(candidate)
        if problem is None:
            return candidate, broken
        logger.warning("skipping checkpoint %s: %s", candidate, problem)
        broken.append(f"{candidate.name} ({problem})")
    return None, broken


def refuse_fresh_start_over(root: Path, resume: str | Path | None, overwrite: bool) -> None:
    """A BertkitError when a fresh start (no `resume`, no `overwrite`) would write over the checkpoints under
    `root`; callers check it first too, before minutes of probes and planning end in the same refusal."""
    if resume is None and not overwrite and list_checkpoints(root):
        raise BertkitError(f"{root} already holds checkpoints; continue that run with --resume auto, start "
                           f"over with {START_OVER} (deletes them), or choose a new --output directory")


def resolve_resume(resume: str | Path | None, root: Path, overwrite: bool = False) -> Path | None:
    """The checkpoint to resume from, or None to start at step 0.

    `--resume auto` -> the newest valid checkpoint under `root` (None when there is none yet, an error when
    all are broken); a path -> that checkpoint, which must verify; None -> start fresh, which `root`
    must allow: it holds no checkpoints, or `overwrite` deletes them first."""
    if overwrite:
        if resume is not None:
            raise BertkitError(f"--resume {resume} and {START_OVER} contradict each other: --resume continues "
                               f"the run in {root}, {START_OVER} deletes it; pick one")
        doomed = list_checkpoints(root)
        for path in doomed:
            shutil.rmtree(path)
        if doomed:
            logger.info("%s: deleted %d checkpoints of the earlier run in %s", START_OVER, len(doomed), root)
        return None
    if resume is None:
        refuse_fresh_start_over(root, resume, overwrite)
        return None
    if str(resume) == "auto":
        return _newest_or_refuse(root)
    path = Path(resume)
    if not path.is_dir():
        raise BertkitError(f"--resume {path}: no such checkpoint directory; use --resume auto or a "
                           f"{PREFIX}NNNNNNNN directory under {root}")
    problem = verify_checkpoint(path)
    if problem is not None:
        raise BertkitError(f"--resume {path}: not a valid checkpoint: {problem}; pick another one "
                           "or use --resume auto, which skips broken checkpoints")
    return path


def _step_of(directory: Path) -> int:
    """The step in a checkpoint's name (step-NNNNNNNN), or -1 for another name."""
    number = directory.name.removeprefix(PREFIX)
    return int(number) if directory.name.startswith(PREFIX) and number.isdigit() else -1


def move_newer_aside(chosen: Path, root: Path) -> list[Path]:
    """Resuming from `chosen` starts a new branch of the run: checkpoints in `root` of later steps (the
    abandoned branch) move into root/abandoned-TIME-from-STEP, where neither `--resume auto` nor pruning looks,
    so every later save and resume follows the new branch. Returns the moved directories' new paths."""
    step = read_trainer_state(chosen)["state"]["step"]
    newer = [p for p in list_checkpoints(root) if _step_of(p) > step and p.resolve() != chosen.resolve()]
    if not newer:
        return []
    aside = root / f"{ABANDONED_PREFIX}{time.strftime('%Y%m%d-%H%M%S')}-from-{chosen.name}"
    while aside.exists():  # two branches within a second
        aside = aside.with_name(aside.name + "-1")
    aside.mkdir()
    moved = []
    for path in newer:
        path.rename(aside / path.name)
        moved.append(aside / path.name)
    fsync_path(root)
    logger.warning("--resume %s is older than the newest checkpoint: moved %s aside to %s; from here on the run "
                   "continues from step %d and --resume auto follows this branch", chosen,
                   ", ".join(p.name for p in newer), aside, step)
    return moved


def _newest_or_refuse(root: Path) -> Path | None:
    """`--resume auto`: the newest valid checkpoint; none at all is a fresh start, only broken ones an error."""
    newest, broken = _scan(root)
    if newest is None and broken:
        shown = "; ".join(broken[:5]) + (f"; and {len(broken) - 5} more" if len(broken) > 5 else "")
        raise BertkitError(f"--resume auto: none of the checkpoints in {root} is valid: {shown}. Not starting "
                           f"over from step 0 on top of them: restore them from a backup, or start over "
                           f"deliberately with {START_OVER} (deletes them) or a new --output directory")
    return newest


def choose_checkpoint(resume: str | Path | None, overwrite: bool, root: Path,
                      ctx: DistributedContext) -> Path | None:
    """Rank 0 removes stale temporary directories and resolves `resume`; every rank gets its answer, or its
    BertkitError (raised on every rank, so none is left waiting for a broadcast that never comes)."""
    def decide() -> Path | None:
        removed = remove_stale_temps(root)
        if removed:
            logger.warning("removed %d temporary checkpoint directories left by interrupted saves", removed)
        return resolve_resume(resume, root, overwrite)

    answer = rank0_decides(decide, ctx)
    return None if answer is None else Path(answer)


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


# What the loop writes to trainer_state.json: section -> key -> allowed types (bool is refused where int is).
_COUNT, _NUMBER = (int,), (int, float)
TRAINER_STATE_FIELDS: dict[str, dict[str, tuple[type, ...]]] = {
    "state": {"step": _COUNT, "elapsed_s": _NUMBER, "consecutive_nonfinite": _COUNT, "skipped_steps": _COUNT,
              "last_eval_step": _COUNT, "best": (dict, type(None))},
    "data": {"epoch": _COUNT, "samples_in_epoch": _COUNT, "global_batch_size": _COUNT},
}


def _fits(value: Any, types: tuple[type, ...]) -> bool:
    return isinstance(value, types) and not (isinstance(value, bool) and bool not in types)


def _foreign(path: Path, problem: str) -> BertkitError:
    return BertkitError(f"{path}: {problem}; the checkpoint matches its manifest, so it was written by another "
                        f"version of bertkit or for another model, or edited: resume from another one with "
                        f"--resume DIR, or start over with {START_OVER}")


def _read_state_json(directory: Path, name: str) -> Any:
    value = read_json(directory / name, missing=_UNREADABLE, damaged=_UNREADABLE)
    if value is _UNREADABLE:
        raise _foreign(directory / name, "unreadable (missing, not UTF-8 or not JSON)")
    return value


_UNREADABLE = object()


def read_trainer_state(directory: Path) -> dict[str, Any]:
    """trainer_state.json of a checkpoint, checked against TRAINER_STATE_FIELDS (scaler: an object or null)."""
    path = directory / TRAINER_STATE
    state = _read_state_json(directory, TRAINER_STATE)
    if not isinstance(state, dict) or not isinstance(state.get("scaler", "missing"), (dict, type(None))):
        raise _foreign(path, "not an object with state, scaler and data")
    for section, fields in TRAINER_STATE_FIELDS.items():
        values = state.get(section)
        if not isinstance(values, dict):
            raise _foreign(path, f"no {section!r} object")
        for key, types in fields.items():
            if not _fits(values.get(key), types):
                raise _foreign(path, f"{section}.{key} is {values.get(key)!r}, not "
                                     f"{' or '.join(t.__name__ for t in types)}")
    return state


def read_rng_states(directory: Path) -> list[dict[str, Any]]:
    """rng.json of a checkpoint: one capture_rng_state() per rank, each checked for its generators' shapes."""
    ranks = _read_state_json(directory, RNG_STATE)
    ranks = ranks.get("ranks") if isinstance(ranks, dict) else None
    if not isinstance(ranks, list) or not all(isinstance(r, dict) and _rng_shaped(r) for r in ranks):
        raise _foreign(directory / RNG_STATE, "not one python, numpy and torch generator state per rank, "
                                              "as capture_rng_state() writes them")
    return ranks


def _rng_shaped(state: dict[str, Any]) -> bool:
    python, numpy, cpu = state.get("python"), state.get("numpy"), state.get("torch")
    return (isinstance(python, list) and len(python) == 3 and isinstance(python[1], list)
            and isinstance(numpy, list) and len(numpy) == 5 and isinstance(numpy[1], list)
            and isinstance(cpu, list) and len(cpu) == torch.get_rng_state().numel())


@contextlib.contextmanager
def restoring(directory: Path) -> Iterator[None]:
    """Turn a failure to apply a checkpoint's contents into a BertkitError naming it. The files passed their
    hashes and their shape checks, so what is left to fail (a state dict for another model or optimizer, an
    RNG state of the wrong length) is the checkpoint's content, not a bug here."""
    try:
        yield
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, RuntimeError, SafetensorError) as exc:
        raise _foreign(directory, f"its {TRAINER_STATE}, {RNG_STATE}, optimizer or weights do not fit this run "
                                  f"({type(exc).__name__}: {exc})") from None


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
    meta = _read_state_json(directory, "optimizer.json")
    _check_param_groups(meta, optimizer.param_groups, directory / "optimizer.json")
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


def _check_param_groups(meta: Any, current: list[dict[str, Any]], path: Path) -> None:
    """optimizer.json holds one group per group of `current`, with numbers where `current` has numbers."""
    groups = meta.get("param_groups") if isinstance(meta, dict) else None
    if not isinstance(groups, list) or not isinstance(meta.get("scalars"), dict):
        raise _foreign(path, 'not an object {"param_groups": [...], "scalars": {...}}')
    if len(groups) != len(current) or not all(isinstance(g, dict) for g in groups):
        raise _foreign(path, f"{len(groups)} parameter groups where this optimizer has {len(current)} (a "
                             "--head-warmup-steps above 0 or an --encoder-lr-ratio below 1 gives the encoder groups "
                             "of its own: resume with those settings as the run began)")
    for index, (saved, now) in enumerate(zip(groups, current)):
        if isinstance(saved.get("params"), list) and len(saved["params"]) != len(now["params"]):
            raise _foreign(path, f"param_groups[{index}] holds {len(saved['params'])} parameters where this model "
                                 f"trains {len(now['params'])} (a version that trained other parameters, e.g. the "
                                 "pooler a sentence encoder now leaves frozen)")
        for key, value in now.items():
            if key == "params" or key not in saved:
                continue
            numbers = value if isinstance(value, (tuple, list)) else [value]
            found = saved[key] if isinstance(value, (tuple, list)) else [saved[key]]
            if all(_fits(v, _NUMBER) for v in numbers) and not (
                    isinstance(found, list) and len(found) == len(numbers) and all(_fits(v, _NUMBER) for v in found)):
                raise _foreign(path, f"param_groups[{index}].{key} is {saved[key]!r}, not like {value!r}")


def capture_rng_state() -> dict[str, Any]:
    """Python, numpy, torch CPU and CUDA generator states as JSON-able values (tensors as byte lists)."""
    version, mt_state, gauss = random.getstate()
    numpy_state = np.random.get_state()
    assert isinstance(numpy_state, tuple)  # a dict only for a non-MT19937 global generator, which bertkit never sets
    kind, keys, position, has_gauss, cached = numpy_state
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

