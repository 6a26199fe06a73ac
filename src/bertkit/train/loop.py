"""The training loop: one explicit function, `fit`, shared by pre-training and fine-tuning.

Design decision: the loop knows nothing about BERT and prepares nothing. It receives a model already placed
on the training device and, under torchrun, wrapped for DDP (and compiled, if asked); a TrainConfig whose
`precision` and `learning_rate` the workflow has resolved; the data; and owns everything else in plain sight:
gradient accumulation, clipping, precision, the non-finite guard, evaluation (every N steps and/or every epoch),
early stopping, checkpoints and exact resume (what a checkpoint holds and the resume rules: `resume.py`).
torchtitan's loop is shaped the same way.

Per step: for each of the `gradient_accumulation_steps` micro-batches, forward under autocast, scale the
loss by the micro-batch's share of the global batch, backward (DDP all-reduces on the last one only);
then unscale, clip, and step the optimizer only if the loss and gradient norm are finite - decided on the
device where the optimizer can skip a step itself (fused AdamW, LAMB: the `found_inf` flag torch's GradScaler
uses), so a step never waits for the device.

A micro-batch's share is what its loss averages over. A plain `loss_fn(model, batch) -> (mean, metrics)`
averages over samples, so its share is its sample count over the global batch's. An `Objective` (a token
loss such as masked LM) says what each of its terms averages over (`counts(batch)`); the loop sums those
counts over every micro-batch of every process first (one small all-reduce), and the objective divides
by the global counts, so any split of a global batch into micro-batches and processes gives the same
gradient as one process computing it whole (torchtitan normalises by the global valid tokens the same way).

Every collective runs on the training device (NCCL serves no CPU tensors): the per-step statistics are
built there and summed in one all-reduce, and stay there until the next read (`--read-every`: every step on a
CPU, every log step on a GPU, and before every evaluation, save and the end of a step budget), when the steps
since the last read come back in one transfer and are logged one by one as before; a stop signal and a time
budget take effect at a read.

References: nanoGPT `train.py` and litgpt `pretrain.py` (shape of the loop); Devlin et al. 2018
(optimisation defaults).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
from safetensors.torch import load_model, save_model
from torch import nn
from torch.utils.data import Dataset
from tqdm.contrib.logging import logging_redirect_tqdm

from bertkit.errors import BertkitError
from bertkit.runtime.device import autocast as autocast_for
from bertkit.runtime.device import peak_memory, reset_peak_memory, resolve_device, seed_everything
from bertkit.settings import TrainConfig
from bertkit.train.batches import EpochBatches, StepBatch
from bertkit.train.cadence import Budget, Cadence
from bertkit.train.distributed import DistributedContext, all_reduce_sum, barrier, broadcast_object, unwrap_model
from bertkit.train.optim import LearningRateSchedule, build_optimizer
from bertkit.train.reporting import Reporter
from bertkit.train.resume import Checkpointed, Counters, Resume, restore, save_checkpoint
from bertkit.train.stop import StopSignal

logger = logging.getLogger(__name__)

EvalFn = Callable[[nn.Module], "dict[str, float]"]


@runtime_checkable
class Objective(Protocol):
    """A loss normalised over the whole global batch: each term (e.g. 'mlm', 'nsp') averages over a count
    of its own (masked tokens, pairs) summed across micro-batches and processes before any backward."""

    def counts(self, batch: Any) -> dict[str, torch.Tensor]:
        """What each term of this micro-batch's loss averages over (the same keys for every batch)."""
        ...

    def __call__(self, model: nn.Module, batch: Any, totals: dict[str, torch.Tensor]
                 ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """(this micro-batch's part of the global loss: each term's sum over its units / totals[term],
        metrics as parts of the global metric in the same way)."""
        ...


LossFn = Callable[[nn.Module, Any], "tuple[torch.Tensor, dict[str, float]]"] | Objective
"""A per-sample mean loss function (`loss_fn(model, batch) -> (mean loss, float metrics)`) or an Objective."""


@dataclass
class TrainingData:
    """What the loop draws its batches from."""

    dataset: Dataset
    """Map-style (sized, indexable): the loop shards and shuffles indices itself to record an exact position."""
    collate_fn: Callable[[list[Any]], Any] | None = None
    """Items -> a micro-batch; unset: torch's default collate."""
    lengths: Sequence[int] | None = None
    """One length per example: each epoch's batches are grouped by length (less padding); unset: no grouping."""
    full_batches_only: bool = False
    """Every global batch the same size: an epoch's last, smaller global batch is skipped and counted (a step
    compiled for static shapes would compile again for it)."""
    phase: Callable[[int, float], Any] | None = None
    """`phase(step, progress)`: a key handed to the dataset with every index of the batch the optimizer step after
    `step` steps trains on, at `progress` (the budget's share spent, in [0, 1]): items are read as
    `dataset[(index, key)]` (pre-training's sequence length per step); unset: `dataset[index]`. A function of the
    step and the budget, so a resumed run reads the same keys."""


@dataclass
class Hooks:
    """What the caller's code does inside the loop: evaluate, keep the best, and the checkpoint's weight files."""

    evaluate: EvalFn | None = None
    """`evaluate(model) -> metrics`: runs on every process (in eval mode, without gradients, under no autocast:
    a hook that evaluates in the training precision is given it, e.g. `evaluate_pretraining(..., precision)`; it
    may share the work out and gather it); rank 0's metrics count. Unset: no evaluation."""
    on_best: Callable[[nn.Module, int, dict[str, float]], None] | None = None
    """Called on rank 0 with (model, step, metrics) when `config.best_metric` improves."""
    save_weights: Callable[[nn.Module, Path], object] | None = None
    """Writes the model's weights into a checkpoint directory; unset: model.safetensors of the state dict."""
    load_weights: Callable[[nn.Module, Path], object] | None = None
    """Reads them back; unset: model.safetensors."""


@dataclass
class FitResult:
    """How a run ended."""

    step: int
    """Optimizer steps done (including skipped non-finite ones)."""
    stop_reason: str
    """'budget' (max steps / time / epochs reached), 'early_stop' (no new best for
    early_stopping_patience evaluations) or 'signal' (SIGTERM/SIGINT; `signal` says which)."""
    checkpoint: Path | None
    """The last checkpoint written (None on ranks other than 0)."""
    skipped_steps: int
    """Steps skipped because of a non-finite loss or gradient norm."""
    skipped_samples: int
    """Training samples skipped at epoch ends (a last global batch too small to share out)."""
    best: dict[str, Any] | None = None
    """{'step': ..., 'metrics': {...}} of the best evaluation, when best_metric is set."""
    signal: int | None = None
    """The signal number that stopped the run (stop_reason 'signal')."""
    peak_memory: dict[str, float] = dataclasses.field(default_factory=dict)
    """This process's peak memory in MiB (`runtime.device.peak_memory`: resident set; on CUDA, allocated and
    reserved since fit started); also the last record of metrics.jsonl."""


def _check_prepared(model: nn.Module, config: TrainConfig, ctx: DistributedContext) -> None:
    """Refuse what the workflow prepares before `fit` (bugs in a caller, so plain exceptions)."""
    if config.precision == "auto" or config.learning_rate is None:
        raise ValueError("fit runs a resolved TrainConfig: resolve precision 'auto' and an unset learning rate "
                         "first (bertkit.workflows.prepare.prepare_training)")
    if config.early_stopping_patience is not None and config.best_metric is None:
        raise BertkitError("--early-stopping-patience needs an evaluation metric to watch")
    if config.precision == "fp16" and ctx.device.type != "cuda":
        raise BertkitError("--precision fp16 needs a CUDA device (it relies on a grad scaler); "
                           "on CPU use --precision bf16 or fp32")
    placed = {parameter.device for parameter in model.parameters()}
    if any(device.type != ctx.device.type for device in placed):
        raise ValueError(f"fit: the model is on {sorted(map(str, placed))} and the run on {ctx.device}; place it "
                         "(and wrap it for DDP) before fit (bertkit.workflows.prepare.prepare_training)")
    if ctx.distributed and not isinstance(model, nn.parallel.DistributedDataParallel):
        raise ValueError("fit under torchrun needs the model wrapped for DDP (bertkit.train.distributed.wrap_model)")


def _any_rank(flag: bool, ctx: DistributedContext) -> bool:
    """Whether `flag` is set on any process (one all-reduce on the training device; every rank asks)."""
    return bool(all_reduce_sum(torch.tensor([float(flag)], device=ctx.device), ctx).item() > 0)


def _to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {key: _to_device(value, device) for key, value in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(_to_device(value, device) for value in batch)
    return batch


def _count_tokens(batch: Any, size: int) -> int:
    """Real tokens in a micro-batch: the attention mask's sum when there is one, else every token of the input
    ids (a batch collated without a mask has no padding), else the sample count."""
    if isinstance(batch, dict) and isinstance(batch.get("attention_mask"), torch.Tensor):
        return int(batch["attention_mask"].sum())
    if isinstance(batch, dict) and isinstance(batch.get("input_ids"), torch.Tensor):  # no mask: nothing padded
        return batch["input_ids"].numel()
    return size


MIN_LOSS_SCALE = 1.0
"""Below it, the fp16 grad scaler has halved its scale (from 65,536) over about sixteen overflowing steps in a row
with no growth: the gradients are not finite at any scale, a failed run rather than the scaler settling."""
def fit(model: nn.Module, loss_fn: LossFn, data: TrainingData | Dataset, config: TrainConfig,
        output_dir: str | Path, *, ctx: DistributedContext | None = None, hooks: Hooks | None = None,
        resume: Resume | str | Path | None = None) -> FitResult:
    """Train `model` on `data` until the budget in `config` is spent or a stop signal arrives.

    `model` is ready to train: on the training device, wrapped for DDP under torchrun; `config` is resolved
    (`precision` not auto, `learning_rate` set): `bertkit.workflows.prepare.prepare_training` does both.
    `loss_fn(model, batch)` returns the mean loss of the micro-batch and a dict of float metrics (averaged
    over the global batch, weighted by samples, for the log), or is an `Objective` (a loss normalised by
    global counts, such as masked tokens). `data` is a TrainingData (or a map-style dataset alone); the
    batch sizes come from `config.batch_plan(world size)`. `hooks` evaluate, keep the best and write the
    weights of checkpoints (OUTPUT/checkpoints/step-NNNNNNNN); `resume` says whether to continue one (a
    `Resume`, or its checkpoint: 'auto' or a directory). `ctx` None: one process on `config.device`.
    """
    ctx = ctx or DistributedContext(device=resolve_device(config.device))
    data = data if isinstance(data, TrainingData) else TrainingData(data)
    hooks, request = hooks or Hooks(), Resume.of(resume)
    _check_prepared(model, config, ctx)
    global_batch, micro_batch, accumulation = config.batch_plan(ctx.world_size)
    if ctx.is_main:
        logger.info("global batch %d = micro-batch %d x %d accumulation step(s) x %d process(es)",
                    global_batch, micro_batch, accumulation, ctx.world_size)
    output_dir = Path(output_dir)
    save = hooks.save_weights or (lambda m, d: save_model(m, str(d / "model.safetensors")))
    load = hooks.load_weights or (lambda m, d: load_model(m, str(d / "model.safetensors"), device=str(ctx.device)))
    autocast = autocast_for(config.precision, ctx.device)
    scaler = torch.amp.GradScaler("cuda") if config.precision == "fp16" else None
    reset_peak_memory(ctx.device)
    model.train()
    seed_everything(config.seed + ctx.rank)
    counters = Counters()
    batches = EpochBatches(data.dataset, data.collate_fn, micro_batch_size=micro_batch, accumulation=accumulation,
                           rank=ctx.rank, world_size=ctx.world_size, seed=config.seed, shuffle=config.shuffle,
                           num_workers=config.num_workers, lengths=data.lengths,
                           full_batches_only=data.full_batches_only, pin_memory=ctx.device.type == "cuda")
    budget = Budget(config, batches.steps_per_epoch, counters)
    if data.phase is not None:
        phase = data.phase
        batches.phase = lambda step: phase(step, budget.progress(step))
    plain = unwrap_model(model)  # the optimizer and the checkpoints see the model's own parameter names
    assert config.learning_rate is not None  # _check_prepared
    optimizer = build_optimizer(plain, config.optimizer, config.learning_rate, config.weight_decay,
                                config.betas, config.adam_epsilon, config.splits_encoder)
    schedule = LearningRateSchedule(config.learning_rate, budget.progress, budget.warmup, config.lr_schedule,
                                    config.head_warmup_steps or 0, config.encoder_lr_ratio)
    checkpoints = output_dir / "checkpoints"
    parts = Checkpointed(plain, optimizer, schedule, scaler, batches, counters, save, load, dict(request.identity),
                         dict(request.context))
    start, resumed = restore(parts, request, checkpoints, config, ctx)
    reporter = Reporter(output_dir, ctx.is_main, budget.max_steps, counters.step, config.max_time_s)
    if resumed is not None:
        reporter.record(resumed)
    last_checkpoint = start
    try:
        with StopSignal() as stop, logging_redirect_tqdm():  # log lines above the bar, not glued to it
            stop_reason = _train(model, loss_fn, parts, config, budget, autocast, stop, reporter, ctx, hooks,
                                 checkpoints)
            if stop_reason == "budget" and hooks.evaluate is not None and counters.last_eval_step != counters.step:
                _evaluate(parts, hooks, config, reporter, ctx)
            last_checkpoint = save_checkpoint(parts, checkpoints, config, ctx) or last_checkpoint
            if _any_rank(stop.requested, ctx):  # arrived during the last evaluation or save, on any rank: the
                stop_reason = "signal"  # run is complete, but the job was asked to stop, so no caller may go on
        peak = peak_memory(ctx.device)
        reporter.record({"kind": "memory", "step": counters.step, **peak})
    finally:
        reporter.close()
    # Another rank may have caught the signal; SIGTERM is what a cluster scheduler sends.
    signum = (stop.signum or signal.SIGTERM) if stop_reason == "signal" else None
    return FitResult(counters.step, stop_reason, last_checkpoint if ctx.is_main else None, counters.skipped_steps,
                     batches.skipped_samples, counters.best, signum, peak)


def _train(model: nn.Module, loss_fn: LossFn, parts: Checkpointed, config: TrainConfig, budget: Budget,
           autocast: Callable[[], Any], stop: StopSignal, reporter: Reporter, ctx: DistributedContext,
           hooks: Hooks, checkpoints: Path) -> str:
    """Steps until the budget is spent ('budget') or a stop was requested ('signal').

    A step's statistics stay on the device until the next read (`Cadence.reads`): every step on a CPU, every
    log step on a GPU, and always before an evaluation, a save or the last step of a step budget. Between reads
    the host only queues work; a stop signal and a time budget take effect at the next read."""
    state = parts.counters
    if budget.done(state.step):
        return "budget"
    if state.eval_pending:  # a stop skipped this step's evaluation to save at once: it is owed first
        state.eval_pending = False
        if hooks.evaluate is not None:
            _evaluate(parts, hooks, config, reporter, ctx)
        if _patience_spent(state, config, reporter):
            return "early_stop"
    started, elapsed_before = time.perf_counter(), state.elapsed_s
    cadence = Cadence(config, parts.batches.steps_per_epoch, state, ctx.device)
    data: Iterator[StepBatch] = parts.batches.iterate(state.step)
    taken: list[_Taken] = []
    while True:
        lr = parts.schedule.apply(parts.optimizer, state.step)  # skipped steps count: see optim.py
        batch = next(data)
        local = _forward_backward(model, loss_fn, batch, autocast, parts.scaler, ctx)
        clock = time.perf_counter() - started + elapsed_before
        keys, statistics = _reduce(*local, stop.requested, clock, ctx)
        grad_norm = _optimizer_step(parts, config, statistics[0])
        state.step += 1
        encoder_lr = lr * parts.schedule.encoder_scale(state.step - 1) if config.splits_encoder else None
        taken.append(_Taken(state.step, lr, encoder_lr, parts.batches.epoch, keys, statistics, grad_norm))
        if config.head_warmup_steps and state.step == config.head_warmup_steps and ctx.is_main:
            logger.info("head warm-up done after %d step(s): the encoder trains from the next step, its learning "
                        "rate rising over %d step(s) to x %g of the heads'", state.step, state.step,
                        config.encoder_lr_ratio)
        due = hooks.evaluate is not None and cadence.evaluates(state.step, batch.ends_epoch)
        if not (due or cadence.reads(state.step) or cadence.saves(state.step) or budget.steps_done(state.step)):
            continue
        stop_requested = _read(taken, parts, config, cadence, reporter)
        taken = []
        if stop_requested:  # save at once (a scheduler's grace period is for the save); the resumed run evaluates
            state.eval_pending = due
            return "signal"
        if due:
            _evaluate(parts, hooks, config, reporter, ctx)
        if _patience_spent(state, config, reporter):
            return "early_stop"
        if budget.done(state.step):
            return "budget"
        if cadence.saves(state.step):
            save_checkpoint(parts, checkpoints, config, ctx)


@dataclass
class _Taken:
    """An optimizer step whose statistics are still on the device."""

    step: int
    lr: float
    encoder_lr: float | None
    epoch: int
    keys: list[str]
    """The metric names of `statistics` (`_step_statistics`)."""
    statistics: torch.Tensor
    """float64 on the device, summed over the processes: loss, metrics, tokens, stop flag, rank 0's clock."""
    grad_norm: torch.Tensor
    """0-d, on the device."""


def _read(taken: list[_Taken], parts: Checkpointed, config: TrainConfig, cadence: Cadence,
          reporter: Reporter) -> bool:
    """Read the taken steps' statistics back to the host in one transfer, log each step, count the skipped ones
    (stopping the run after `max_nonfinite_steps` in a row); returns whether any process asked to stop."""
    state = parts.counters
    flat = torch.cat([torch.cat([t.statistics, t.grad_norm.detach().double().reshape(1)]) for t in taken]).tolist()
    stop_requested, offset = False, 0
    for step in taken:
        values = flat[offset:offset + len(step.keys) + 5]
        offset += len(step.keys) + 5
        loss, grad_norm = values[0], values[-1]
        metrics = dict(zip(step.keys, values[1:1 + len(step.keys)]))
        tokens, stop_requested, state.elapsed_s = int(values[-4]), stop_requested or values[-3] > 0, values[-2]
        record = {"kind": "train", "step": step.step, "loss": loss, **metrics, "lr": step.lr,
                  **({"encoder_lr": step.encoder_lr} if step.encoder_lr is not None else {}),
                  "grad_norm": grad_norm, "epoch": step.epoch, "elapsed_s": round(state.elapsed_s, 3)}
        overflow = _scaler_overflow(parts.scaler, loss, grad_norm)
        _tally(state, record, overflow, reporter)
        reporter.train_step(record, tokens, show=step.step % cadence.log_every == 0)
        if overflow:
            _check_loss_scale(parts.scaler, step.step)
        if state.consecutive_nonfinite >= config.max_nonfinite_steps:
            raise BertkitError(
                f"{state.consecutive_nonfinite} optimizer steps in a row (up to step {step.step}) had a "
                "non-finite loss or gradient norm, so training stopped without saving the poisoned state; "
                "lower --learning-rate, use --precision fp32 or bf16, check the data, and resume from the "
                "last checkpoint with --resume auto")
    return stop_requested


def _patience_spent(state: Counters, config: TrainConfig, reporter: Reporter) -> bool:
    """Whether early stopping ends the run here (no new best for `early_stopping_patience` evaluations)."""
    if not config.early_stopping_patience or state.evals_since_best < config.early_stopping_patience:
        return False
    reporter.message(f"early stopping at step {state.step}: {config.best_metric} has not improved for "
                     f"{state.evals_since_best} evaluations")
    return True


def _forward_backward(model: nn.Module, loss_fn: LossFn, step: StepBatch, autocast: Callable[[], Any],
                      scaler: Any, ctx: DistributedContext) -> tuple[torch.Tensor, dict[str, Any], int]:
    """Accumulate gradients over this process's micro-batches; returns this process's part of the
    global-batch loss and metrics (on the device) and its real-token count."""
    device = next(model.parameters()).device
    totals = _global_counts(loss_fn, step, device, ctx) if isinstance(loss_fn, Objective) else None
    sums: dict[str, Any] = {}
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    tokens = 0
    for index, (batch, size) in enumerate(zip(step.micro_batches, step.micro_sizes)):
        tokens += _count_tokens(batch, size)  # on the host batch: no device sync
        last = index == len(step.micro_batches) - 1
        sync: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
        if not last and isinstance(model, nn.parallel.DistributedDataParallel):  # wrapped iff ctx.distributed
            sync = model.no_sync()
        with sync:
            with autocast():
                batch = _to_device(batch, device)
                if totals is not None:  # already this micro-batch's part of the global loss
                    loss, metrics = loss_fn(model, batch, totals)  # type: ignore[call-arg]
                    weight = 1.0
                else:  # a per-sample mean: its share is its share of the samples
                    loss, metrics = loss_fn(model, batch)  # type: ignore[call-arg]
                    weight = size / step.global_size
            # Times world_size because DDP averages gradients over processes.
            scaled = loss * (weight * ctx.world_size)
            (scaler.scale(scaled) if scaler is not None else scaled).backward()
        loss_sum += loss.detach().double() * weight
        for key, value in metrics.items():
            part = value.detach() * weight if isinstance(value, torch.Tensor) else float(value) * weight
            sums[key] = sums.get(key, 0.0) + part
    return loss_sum, sums, tokens


def _global_counts(objective: Objective, step: StepBatch, device: torch.device,
                   ctx: DistributedContext) -> dict[str, torch.Tensor]:
    """What each term averages over in the whole global batch: every micro-batch, every process."""
    local: dict[str, torch.Tensor] = {}
    for batch in step.micro_batches:
        for key, count in objective.counts(batch).items():
            local[key] = local.get(key, 0) + torch.as_tensor(count, dtype=torch.float64)
    keys = sorted(local)
    vector = all_reduce_sum(host_to_device(torch.stack([local[key] for key in keys]), device), ctx)
    return {key: vector[i].clamp(min=1.0) for i, key in enumerate(keys)}  # an empty term divides by 1


def host_to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on `device` without waiting for the device: to a GPU from pinned memory, asynchronously (a
    plain copy from pageable memory waits for every kernel queued before it)."""
    if device.type != "cuda":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


def _step_statistics(loss_sum: torch.Tensor, sums: dict[str, Any], tokens: int, stop_requested: bool,
                     clock: float, ctx: DistributedContext) -> tuple[list[str], torch.Tensor]:
    """(metric names, one float64 vector on the training device): loss, metrics, tokens, stop flag, clock.
    Device values stay on the device; host values (float metrics, counts, flags) travel in one async copy."""
    keys = sorted(sums)
    device = loss_sum.device
    on_host = [key for key in keys if not isinstance(sums[key], torch.Tensor)]
    host = host_to_device(torch.tensor([*(float(sums[key]) for key in on_host), float(tokens), float(stop_requested),
                                        clock if ctx.is_main else 0.0], dtype=torch.float64), device)
    from_host = dict(zip(on_host, host))
    parts = [loss_sum.reshape(1).to(torch.float64)]
    parts += [(from_host[key] if key in from_host else sums[key].to(torch.float64)).reshape(1) for key in keys]
    return keys, torch.cat([*parts, host[len(on_host):]])


def _reduce(loss_sum: torch.Tensor, sums: dict[str, Any], tokens: int, stop_requested: bool, clock: float,
            ctx: DistributedContext) -> tuple[list[str], torch.Tensor]:
    """One all-reduce per step, on the training device: loss, metrics, tokens, stop flags (any rank) and
    rank 0's clock, left on the device (`_read` brings them to the host)."""
    keys, vector = _step_statistics(loss_sum, sums, tokens, stop_requested, clock, ctx)
    return keys, all_reduce_sum(vector, ctx)


def _optimizer_step(parts: Checkpointed, config: TrainConfig, loss: torch.Tensor) -> torch.Tensor:
    """Unscale, clip, and step the optimizer only when the loss and the gradient norm are finite; returns the
    gradient norm (0-d, on the device).

    Where the optimizer can skip a step on the device (`_step_supports_amp_scaling`: fused AdamW, bertkit's LAMB)
    the guard never reads the device: it hands the optimizer a `found_inf` flag, as torch's GradScaler does.
    Otherwise (and with the fp16 grad scaler, whose own check is read on the host) the host reads the two values.
    A non-finite step leaves the weights and the optimizer state as they were; `_read` counts it."""
    params = [p for p in parts.model.parameters() if p.grad is not None]
    if parts.scaler is not None:
        parts.scaler.unscale_(parts.optimizer)
    max_norm = config.max_grad_norm if config.max_grad_norm > 0 else math.inf
    grad_norm = (torch.nn.utils.clip_grad_norm_(params, max_norm) if params
                 else torch.zeros((), device=loss.device))
    finite = torch.isfinite(loss) & torch.isfinite(grad_norm)
    if parts.scaler is None and getattr(parts.optimizer, "_step_supports_amp_scaling", False):
        optimizer: Any = parts.optimizer
        optimizer.grad_scale, optimizer.found_inf = None, (~finite).to(torch.float32)
        try:
            optimizer.step()
        finally:
            del optimizer.grad_scale, optimizer.found_inf
    elif bool(finite):
        if parts.scaler is not None:
            parts.scaler.step(parts.optimizer)
        else:
            parts.optimizer.step()
    if parts.scaler is not None:
        parts.scaler.update()
    parts.optimizer.zero_grad(set_to_none=True)
    return grad_norm


def _scaler_overflow(scaler: Any, loss: float, grad_norm: float) -> bool:
    """Whether a step was the fp16 grad scaler's overflow: a finite loss whose scaled gradients overflowed, which
    the scaler answers by skipping the step and lowering its scale (routine at the start and at every growth
    probe), not a non-finite step."""
    return scaler is not None and math.isfinite(loss) and not math.isfinite(grad_norm)


def _check_loss_scale(scaler: Any, step: int) -> None:
    """After an overflow: a scale the scaler has halved below MIN_LOSS_SCALE is a run whose gradients are not
    finite at any scale, stopped as the non-finite guard stops one (the scaler would go on to a zero scale)."""
    if scaler.get_scale() < MIN_LOSS_SCALE:
        raise BertkitError(
            f"the fp16 grad scaler lowered its loss scale below {MIN_LOSS_SCALE:g} by step {step}: the gradients "
            "overflow at any scale (not finite), so training stopped; use --precision bf16 or fp32, lower "
            "--learning-rate, check the data, and resume from the last checkpoint with --resume auto")


def _tally(state: Counters, record: dict[str, Any], overflow: bool, reporter: Reporter) -> None:
    """Count the step: a clean one ends a run of non-finite ones; the scaler's overflow is the scaler's business
    (marked in the record, neither counted toward the abort nor blocking checkpoints); else non-finite."""
    if overflow:
        record["scaler_overflow"] = True
    elif math.isfinite(record["loss"]) and math.isfinite(record["grad_norm"]):
        state.consecutive_nonfinite = 0
    else:
        _count_nonfinite(state, record, reporter)


def _count_nonfinite(state: Counters, record: dict[str, Any], reporter: Reporter) -> None:
    state.consecutive_nonfinite += 1
    state.skipped_steps += 1
    record["skipped"] = True
    reporter.message(f"step {state.step}: non-finite loss {record['loss']} or gradient norm "
                     f"{record['grad_norm']}; optimizer step skipped "
                     f"({state.consecutive_nonfinite} in a row, {state.skipped_steps} in total)")


def _evaluate(parts: Checkpointed, hooks: Hooks, config: TrainConfig, reporter: Reporter,
              ctx: DistributedContext) -> None:
    """Every process evaluates the plain model (an eval_fn may share the work out and gather it); rank 0's
    metrics are logged and decide the best `config.best_metric`, which every rank then shares."""
    state = parts.counters
    state.last_eval_step = state.step
    parts.model.eval()
    with torch.no_grad():  # in the hook's own precision, which it is given (no autocast leaks in from the loop)
        assert hooks.evaluate is not None  # the loop evaluates only then
        metrics = {key: float(value) for key, value in hooks.evaluate(parts.model).items()}
    parts.model.train()
    if ctx.is_main:
        reporter.eval_step(state.step, metrics)
        if config.best_metric is not None:
            _track_best(parts, metrics, config, hooks.on_best)
    state.best, state.evals_since_best = broadcast_object((state.best, state.evals_since_best), ctx)
    barrier(ctx)


def _track_best(parts: Checkpointed, metrics: dict[str, float], config: TrainConfig, on_best: Any) -> None:
    state = parts.counters
    if config.best_metric not in metrics:
        raise BertkitError(f"best metric {config.best_metric!r} is not among the eval metrics "
                           f"({', '.join(sorted(metrics))}); pick one of those")
    value = metrics[config.best_metric]
    previous = state.best["metrics"][config.best_metric] if state.best else None
    better = previous is None or (value > previous if config.greater_is_better else value < previous)
    if better and math.isfinite(value):
        state.best, state.evals_since_best = {"step": state.step, "metrics": metrics}, 0
        if on_best is not None:
            on_best(parts.model, state.step, metrics)
    else:
        state.evals_since_best += 1
