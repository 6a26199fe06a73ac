"""What a training checkpoint holds and the rules for continuing one: the loop's state bundle (`Checkpointed`),
writing it (`save_checkpoint`), and restoring it (`restore`) under the resume rules.

Exact resume means the restored state is *all* the state: weights, optimizer moments, grad-scaler scale, every
RNG (python, numpy, torch CPU and CUDA, per rank) and the data position (epoch + samples consumed; see
`batches.py`); a resumed run with the same kernels then produces bit-identical losses on CPU. The learning rate
is not state: it is computed from the step and the run's settings before every step (`optim.LearningRateSchedule`).

Resume rules (docs/pretraining.md, "Resuming, extending, branching"): the settings saved in the checkpoint are
compared with the new ones under the one rulebook (`bertkit.settings.rules`): a change that breaks exactness
(seed, data order, global batch, and the caller's `identity`: data, model) is refused unless `--allow-change`
names it; every other change (learning rate, budget, cadence, precision, how the global batch is split, and the
caller's `context`: the kernels the steps run) is applied from the next step and listed in the log and in
metrics.jsonl (a "resume" record). Resuming from a checkpoint older than the newest moves the newer ones aside
(`checkpoint.move_newer_aside`), so later saves and `--resume auto` follow the new branch.

Design decision: one bundle (torchtitan's `Stateful` idea) names everything a checkpoint holds, so writing and
restoring cannot drift apart; the loop only says when.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bertkit.errors import BertkitError
from bertkit.runtime.device import seed_everything
from bertkit.settings import TrainConfig
from bertkit.settings.rules import EXACT, FIXED, Difference, check_resume, describe_changes
from bertkit.train import checkpoint as ckpt
from bertkit.train.batches import EpochBatches
from bertkit.train.distributed import DistributedContext, all_gather_objects, barrier
from bertkit.train.optim import LearningRateSchedule, apply_hyperparameters

logger = logging.getLogger(__name__)

UNCOMPARED = ("allow_change",)
"""TrainConfig settings a resumed run never reports as changed (how to resume, not what the run is)."""


@dataclass
class Resume:
    """Where a run starts: a fresh run, or the continuation of a checkpoint in its run directory."""

    checkpoint: str | Path | None = None
    """None (start at step 0; a directory with checkpoints is refused), 'auto' (the newest valid checkpoint in
    OUTPUT/checkpoints, if any) or a checkpoint directory."""
    overwrite: bool = False
    """Delete earlier checkpoints and start at step 0 (`checkpoint.resolve_resume`)."""
    identity: dict[str, Any] = dataclasses.field(default_factory=dict)
    """JSON values a resumed run must share with its checkpoint beyond TrainConfig (e.g. the data's and the
    model's fingerprints); each name is refused on change unless --allow-change names it."""
    context: dict[str, Any] = dataclasses.field(default_factory=dict)
    """JSON values recorded with each checkpoint that a resumed run may change, each change listed in the log and
    the resume record like a free setting's (e.g. the CPU kernels the steps run: another probe can choose others,
    and the steps after it are then not bit-identical to an uninterrupted run's). Its names are none of TrainConfig's,
    `identity`'s or the rulebook's (a ValueError)."""

    @classmethod
    def of(cls, request: Resume | str | Path | None) -> Resume:
        """`request` as a Resume: a checkpoint given alone ('auto' or a directory) is one."""
        return request if isinstance(request, Resume) else cls(request)


@dataclass
class Counters:
    """The loop's own counters; saved in trainer_state.json."""

    step: int = 0
    elapsed_s: float = 0.0
    consecutive_nonfinite: int = 0
    skipped_steps: int = 0
    best: dict[str, Any] | None = None
    last_eval_step: int = -1
    evals_since_best: int = 0
    eval_pending: bool = False
    """A stop skipped this step's evaluation to save at once; the resumed run evaluates first."""


@dataclass
class Checkpointed:
    """Everything a checkpoint holds, in one place."""

    model: nn.Module
    """The plain model (never its DDP wrapper: the checkpoint's names are the model's own)."""
    optimizer: torch.optim.Optimizer
    schedule: LearningRateSchedule
    scaler: torch.amp.GradScaler | None
    batches: EpochBatches
    counters: Counters
    save_weights: Callable[[nn.Module, Path], object]  # return values are ignored (load_model returns
    load_weights: Callable[[nn.Module, Path], object]  # the missing and unexpected keys)
    identity: dict[str, Any]
    context: dict[str, Any] = dataclasses.field(default_factory=dict)


def save_checkpoint(parts: Checkpointed, root: Path, config: TrainConfig, ctx: DistributedContext) -> Path | None:
    """Write checkpoint step-NNNNNNNN (rank 0, with every rank's RNG state); prune to keep_last."""
    if parts.counters.consecutive_nonfinite:
        logger.warning("step %d is in a run of non-finite steps; no checkpoint is written from it",
                       parts.counters.step)
        return None
    rng_states = all_gather_objects(ckpt.capture_rng_state(), ctx)
    target = root / ckpt.checkpoint_name(parts.counters.step)
    written = None
    if ctx.is_main and ckpt.verify_checkpoint(target) is not None:
        for name, tensor in parts.model.state_dict().items():
            if tensor.is_floating_point() and not torch.isfinite(tensor).all():
                raise BertkitError(f"parameter {name} is not finite at step {parts.counters.step}; refusing to "
                                   "save a poisoned checkpoint; resume from the last one with a lower "
                                   "--learning-rate")
        written = ckpt.save_atomically(root, target.name, lambda d: _write(parts, d, rng_states, config),
                                       meta={"step": parts.counters.step})
        ckpt.prune_checkpoints(root, config.keep_last)
    barrier(ctx)
    return written or (target if ctx.is_main else None)


def _write(parts: Checkpointed, directory: Path, rng_states: list[dict], config: TrainConfig) -> None:
    parts.save_weights(parts.model, directory)
    ckpt.save_optimizer(parts.optimizer, directory)
    ckpt.write_json(directory / "rng.json", {"ranks": rng_states})
    ckpt.write_json(directory / "trainer_state.json", {
        "state": dataclasses.asdict(parts.counters),
        # For the resume log only: the learning rate is recomputed from the settings, never restored.
        "schedule": {"lr_last_step": parts.schedule(parts.counters.step - 1) if parts.counters.step else 0.0},
        "identity": parts.identity,
        "context": parts.context,
        "scaler": parts.scaler.state_dict() if parts.scaler is not None else None,
        "data": parts.batches.position(),
        "world_size": len(rng_states),
        "config": dataclasses.asdict(config),
    })


def restore(parts: Checkpointed, request: Resume, root: Path, config: TrainConfig, ctx: DistributedContext
            ) -> tuple[Path | None, dict[str, Any] | None]:
    """Restore every part from the chosen checkpoint (rank 0 picks it, all ranks load it); returns it and the
    metrics.jsonl record of the resume (None when starting at step 0)."""
    _check_context(parts, config)
    chosen = ckpt.choose_checkpoint(request.checkpoint, request.overwrite, root, ctx)
    if chosen is None:
        return None, None
    with ckpt.restoring(chosen):
        trainer = ckpt.read_trainer_state(chosen)
        changes = compare_settings(chosen, trainer, config, parts)
        parts.load_weights(parts.model, chosen)
        ckpt.load_optimizer(parts.optimizer, chosen)
        apply_hyperparameters(parts.optimizer, parts.model, config.weight_decay, config.betas, config.adam_epsilon,
                              config.splits_encoder)
        if parts.scaler is not None and trainer["scaler"] is not None:
            parts.scaler.load_state_dict(trainer["scaler"])
        parts.batches.restore(trainer["data"])
        _restore_rng(ckpt.read_rng_states(chosen), config, trainer["state"]["step"], ctx)
    if ctx.is_main:  # only now: a refused resume (above) leaves the run directory as it was
        ckpt.move_newer_aside(chosen, root)
    barrier(ctx)
    saved = trainer["state"]
    parts.counters.__dict__.update({k: v for k, v in saved.items() if k in parts.counters.__dict__})
    step = parts.counters.step
    lr_before = (trainer.get("schedule") or {}).get("lr_last_step")
    lr_now = parts.schedule(step)
    if ctx.is_main:
        logger.info("resumed from %s at step %d%s", chosen, step, _describe_changes(changes, lr_before, lr_now))
    return chosen, {"kind": "resume", "step": step, "checkpoint": str(chosen), "lr_last_step": lr_before,
                    "lr": lr_now, "changed": {change.name: [change.then, change.now] for change in changes}}


def _check_context(parts: Checkpointed, config: TrainConfig) -> None:
    """A caller's context is JSON under names of its own: never a TrainConfig setting's, an identity's or a rule's
    (it would shadow the value compared, or be refused where it should be listed). A ValueError: a caller's bug."""
    taken = {*dataclasses.asdict(config), *parts.identity, *EXACT, *(name.split(".")[0] for name in FIXED),
             "global_batch_size"}
    clashes = sorted(taken & set(parts.context))
    if clashes:
        raise ValueError(f"Resume.context names {clashes} are settings or identities already compared on resume")
    try:
        json.dumps(parts.context)
    except (TypeError, ValueError) as error:
        raise ValueError(f"Resume.context must be JSON: {error}") from error


# Older checkpoints saved some settings under another name; compared under today's.
_RENAMED = {"eps": "adam_epsilon"}


def compare_settings(chosen: Path, trainer: dict[str, Any], config: TrainConfig, parts: Checkpointed
                     ) -> list[Difference]:
    """Every setting that differs from the checkpoint's, under the rulebook (`bertkit.settings.rules`: a
    BertkitError for the first change it refuses). What a checkpoint of an older version did not save is not
    compared."""
    saved = {_RENAMED.get(name, name): value for name, value in _section(trainer, "config").items()}
    now = json.loads(json.dumps(dataclasses.asdict(config)))  # tuples as lists, as saved
    if saved.get("precision") == "auto":  # older runs saved the setting; now the precision it resolved to
        saved.pop("precision")
    for name in UNCOMPARED:
        saved.pop(name, None)
        now.pop(name, None)
    # the global batch the data position counts in, however it was spelled (batch_size, micro x accumulation)
    saved["global_batch_size"] = trainer["data"]["global_batch_size"]
    now["global_batch_size"] = parts.batches.global_batch_size
    saved |= _section(trainer, "identity") | _section(trainer, "context")
    now |= parts.identity | parts.context
    return check_resume(saved, now, set(config.allow_change), where=str(chosen), exact=set(parts.identity))


def _section(trainer: dict[str, Any], name: str) -> dict[str, Any]:
    section = trainer.get(name)
    return section if isinstance(section, dict) else {}


def _describe_changes(changes: list[Difference], lr_before: float | None, lr_now: float) -> str:
    if not changes:
        return ""
    lr = f"{lr_before:.3g} at the last step, {lr_now:.3g} now" if lr_before is not None else f"{lr_now:.3g} now"
    return (f"; settings changed since the checkpoint, applied from this step: {describe_changes(changes)} "
            f"(learning rate {lr})")


def _restore_rng(rank_states: list[dict], config: TrainConfig, step: int, ctx: DistributedContext) -> None:
    if len(rank_states) != ctx.world_size:
        logger.warning("checkpoint saved by %d processes, resuming with %d: RNG streams (dropout) of "
                       "ranks without a saved state are reseeded", len(rank_states), ctx.world_size)
    if ctx.rank < len(rank_states):
        ckpt.restore_rng_state(rank_states[ctx.rank])
    else:
        seed_everything(config.seed + ctx.rank + 1_000_003 * step)
