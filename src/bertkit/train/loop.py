"""The training loop: one explicit function, `fit`, shared by pre-training and fine-tuning.

Design decision: the loop knows nothing about BERT. It takes a model, a `loss_fn(model, batch) ->
(loss, metrics)`, a map-style dataset with its collate function, and a `TrainConfig`, and owns
everything else in plain sight: gradient accumulation, clipping, precision, the non-finite guard,
evaluation (every N steps and/or every epoch), early stopping, checkpoints and exact resume. Exact resume
means the restored state is *all* the state: weights, optimizer moments, grad-scaler scale, every RNG
(python, numpy, torch CPU and CUDA, per rank) and the data position (epoch + samples consumed; see
`batches.py`); a resumed run then produces bit-identical losses on CPU. The learning rate is not state: it
is computed from the step and the run's settings before every step (`optim.LearningRateSchedule`).

Resume rules (docs/pretraining.md, "Resuming, extending, branching"): the settings saved in the checkpoint
are compared with the new ones; a change that breaks exactness (seed, data order, global batch, the data
and the model) is refused unless `--allow-change` names it, every other change (learning rate, budget,
cadence) is applied from the next step and listed in the log and in metrics.jsonl (a "resume" record).
Resuming from a checkpoint older than the newest moves the newer ones aside (`checkpoint.resolve_resume`),
so later saves and `--resume auto` follow the new branch.

Per step: for each of the `gradient_accumulation_steps` micro-batches, forward under autocast, scale the
loss by the micro-batch's share of the global batch, backward (DDP all-reduces on the last one only);
then unscale, clip, and step the optimizer only if the loss and gradient norm are finite.

A micro-batch's share is what its loss averages over. A plain `loss_fn(model, batch) -> (mean, metrics)`
averages over samples, so its share is its sample count over the global batch's. An `Objective` (a token
loss such as masked LM) says what each of its terms averages over (`counts(batch)`); the loop sums those
counts over every micro-batch of every process first (one small all-reduce), and the objective divides
by the global counts, so any split of a global batch into micro-batches and processes gives the same
gradient as one process computing it whole (torchtitan normalises by the global valid tokens the same way).

Every collective runs on the training device (NCCL serves no CPU tensors): the per-step statistics are
built there, summed in one all-reduce, and read back to the host once per step.

References: nanoGPT `train.py` and litgpt `pretrain.py` (shape of the loop); Devlin et al. 2018
(optimisation defaults).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
from safetensors.torch import load_model, save_model
from torch import nn
from torch.utils.data import Dataset

from bertkit import runtime
from bertkit.allocator import keep_freed_memory
from bertkit.errors import BertkitError, Interrupted
from bertkit.settings import RESUME_EXACT_SETTINGS, TrainConfig
from bertkit.train import checkpoint as ckpt
from bertkit.train.batches import EpochBatches, StepBatch
from bertkit.train.distributed import (
    DistributedContext,
    all_gather_objects,
    all_reduce_sum,
    barrier,
    broadcast_object,
    wrap_model,
)
from bertkit.train.optim import LearningRateSchedule, apply_hyperparameters, build_optimizer
from bertkit.train.reporting import Reporter

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
    """This process's peak memory in MiB (`runtime.peak_memory`: resident set; on CUDA, allocated and
    reserved since fit started); also the last record of metrics.jsonl."""


@dataclass
class _State:
    """The loop's own counters; saved in trainer_state.json."""

    step: int = 0
    elapsed_s: float = 0.0
    consecutive_nonfinite: int = 0
    skipped_steps: int = 0
    best: dict[str, Any] | None = None
    last_eval_step: int = -1
    evals_since_best: int = 0


class _Budget:
    """Total steps / time and the warmup fraction; gives the schedule its progress in [0, 1]."""

    def __init__(self, config: TrainConfig, steps_per_epoch: int, state: _State) -> None:
        self.max_steps = config.max_steps
        if config.num_epochs is not None:
            epoch_steps = max(1, math.ceil(config.num_epochs * steps_per_epoch))
            self.max_steps = min(self.max_steps or epoch_steps, epoch_steps)
        self.max_time_s, self.state = config.max_time_s, state
        if self.max_steps is not None:
            warmup_steps = (config.warmup_steps if config.warmup_steps is not None
                            else round(config.warmup_ratio * self.max_steps))
            if warmup_steps > self.max_steps:
                raise BertkitError(f"--warmup-steps {warmup_steps} is longer than the run "
                                   f"({self.max_steps} steps); lower it")
            self.warmup = warmup_steps / self.max_steps
        elif config.warmup_steps is not None:
            raise BertkitError("--warmup-steps needs a step budget; under --max-time alone use "
                               "--warmup-ratio (a fraction of the time)")
        else:
            self.warmup = config.warmup_ratio

    def progress(self, step: int) -> float:
        # Under a time budget the elapsed time is rank 0's, shared every step, so all ranks agree.
        by_steps = step / self.max_steps if self.max_steps else 0.0
        by_time = self.state.elapsed_s / self.max_time_s if self.max_time_s else 0.0
        return min(1.0, max(by_steps, by_time))

    def done(self, step: int) -> bool:
        return self.progress(step) >= 1.0


class _Cadence:
    """When the loop refreshes the progress bar, evaluates and saves: steps, epochs resolved to steps.

    An epoch is `steps_per_epoch` optimizer steps (every epoch has that many, the short tail rule being
    the same each epoch), so "the end of every epoch" is every multiple of it, resumed runs included."""

    def __init__(self, config: TrainConfig, steps_per_epoch: int, state: _State) -> None:
        self.config, self.steps_per_epoch, self.state = config, steps_per_epoch, state
        shortest = min(config.eval_every or steps_per_epoch, steps_per_epoch)
        self.log_every = config.log_every or max(1, shortest // 10)

    def evaluates(self, step: int) -> bool:
        every, epochs = self.config.eval_every, self.config.eval_every_epoch
        return bool(every and step % every == 0) or (epochs and step % self.steps_per_epoch == 0)

    def saves(self, step: int) -> bool:
        every, on_eval = self.config.save_every, self.config.save_on_eval
        return bool(every and step % every == 0) or (on_eval and self.state.last_eval_step == step)


def _precision(config: TrainConfig, ctx: DistributedContext, model: nn.Module, dataset: Dataset | None = None,
               micro_batch: int | None = None) -> tuple[Callable[[], Any], Any]:
    """(autocast context factory, grad scaler or None) for the configured precision; under torchrun
    every rank runs what rank 0 resolved ('auto' measures the step at the micro-batch and the length of
    the data's first examples, and ranks must agree)."""
    device, precision = ctx.device, config.precision
    if precision == "auto":
        length = _sequence_length(dataset, micro_batch or 1) if dataset is not None else None
        resolved = runtime.resolve_precision("auto", device, model, micro_batch, length) if ctx.rank == 0 else None
        precision = broadcast_object(resolved, ctx)
    if precision != "fp16":
        return runtime.autocast(precision, device), None
    if device.type != "cuda":
        raise BertkitError("--precision fp16 needs a CUDA device (it relies on a grad scaler); "
                           "on CPU use --precision bf16 or fp32")
    return runtime.autocast(precision, device), torch.amp.GradScaler("cuda")


def _sequence_length(dataset: Dataset, count: int) -> int | None:
    """The longest `input_ids` among the first `count` examples (the length a step runs at; the last
    dimension, for multiple choice's one row per choice), or None when the examples hold none."""
    lengths = []
    for index in range(min(count, len(dataset))):  # type: ignore[arg-type]  # fit's datasets are sized
        item = dataset[index]
        ids = item.get("input_ids") if isinstance(item, dict) else None
        if ids is None:
            return None
        try:
            lengths.append(int(torch.as_tensor(ids).shape[-1]))
        except (ValueError, TypeError, RuntimeError, IndexError):  # ragged rows, not token ids
            return None
    return max(lengths) if lengths else None


def _to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return {key: _to_device(value, device) for key, value in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(_to_device(value, device) for value in batch)
    return batch


def _count_tokens(batch: Any, size: int) -> int:
    """Real tokens in a micro-batch: the attention mask's sum when there is one, else the sample count."""
    if isinstance(batch, dict) and isinstance(batch.get("attention_mask"), torch.Tensor):
        return int(batch["attention_mask"].sum())
    return size


class _StopSignal:
    """SIGTERM/SIGINT set a flag; the loop finishes its step, saves and returns. A second one aborts."""

    def __init__(self) -> None:
        self.requested = False
        self.signum: int | None = None
        self.previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested:
            signal.signal(signum, self.previous.get(signum, signal.SIG_DFL))
            raise Interrupted(f"stopped by a second {signal.Signals(signum).name} before the checkpoint of this "
                              "step was written; the newest checkpoint on disk is the one before", signum)
        self.requested, self.signum = True, signum
        logger.warning("received %s: finishing this step, saving a checkpoint, then stopping",
                       signal.Signals(signum).name)

    def __enter__(self) -> _StopSignal:
        with contextlib.suppress(ValueError):  # not the main thread: leave signals alone
            for signum in (signal.SIGTERM, signal.SIGINT):
                self.previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)


def fit(model: nn.Module, loss_fn: LossFn, dataset: Dataset, config: TrainConfig, output_dir: str | Path,
        *, collate_fn: Callable[[list[Any]], Any] | None = None, eval_fn: EvalFn | None = None,
        on_best: Callable[[nn.Module, int, dict[str, float]], None] | None = None,
        save_weights: Callable[[nn.Module, Path], None] | None = None,
        load_weights: Callable[[nn.Module, Path], None] | None = None,
        resume: str | Path | None = None, overwrite: bool = False, ctx: DistributedContext | None = None,
        lengths: Any = None, identity: dict[str, Any] | None = None) -> FitResult:
    """Train `model` on `dataset` until the budget in `config` is spent or a stop signal arrives.

    `lengths` (one int per example), when given, groups each epoch's batches by length (less padding).

    `loss_fn(model, batch)` returns the mean loss of the micro-batch and a dict of float metrics
    (averaged over the global batch, weighted by samples, for the log), or is an `Objective` (a loss
    normalised by global counts, such as masked tokens). The batch sizes come from
    `config.batch_plan(world size)`. `eval_fn(model)` returns eval metrics; it runs on every process (in
    eval mode, without gradients; it may share the work out and gather it) and rank 0's metrics count.
    `save_weights(model, dir)` / `load_weights(model, dir)` write/read the weights of a checkpoint
    (default: model.safetensors of the state dict). `resume` is None, 'auto' (newest valid checkpoint in
    output_dir/checkpoints, if any) or a checkpoint directory; `overwrite` deletes earlier checkpoints and
    starts at step 0 (see `checkpoint.resolve_resume`). Checkpoints go to output_dir/checkpoints/step-NNNNNNNN.
    `ctx` None: one process on the local GPU when there is one, else the CPU (`runtime.resolve_device("auto")`).
    `identity` (JSON values, e.g. the data's and the model's fingerprints) is what else a resumed run must
    share with the checkpoint it continues; see `_compare_settings` for the rules on resume.
    """
    keep_freed_memory()  # large activations reused, not page-faulted every step (bertkit.allocator)
    ctx = ctx or DistributedContext(device=runtime.resolve_device("auto"))
    global_batch, micro_batch, accumulation = config.batch_plan(ctx.world_size)
    if ctx.is_main:
        logger.info("global batch %d = micro-batch %d x %d accumulation step(s) x %d process(es)",
                    global_batch, micro_batch, accumulation, ctx.world_size)
    output_dir = Path(output_dir)
    save = save_weights or (lambda m, d: save_model(m, str(d / "model.safetensors")))
    load = load_weights or (lambda m, d: load_model(m, str(d / "model.safetensors"), device=str(ctx.device)))
    autocast, scaler = _precision(config, ctx, model, dataset, micro_batch)
    runtime.reset_peak_memory(ctx.device)
    model.to(ctx.device).train()
    runtime.seed_everything(config.seed + ctx.rank)
    state = _State()
    batches = EpochBatches(dataset, collate_fn, micro_batch_size=micro_batch, accumulation=accumulation, rank=ctx.rank,
                           world_size=ctx.world_size, seed=config.seed, shuffle=config.shuffle,
                           num_workers=config.num_workers, lengths=lengths)
    budget = _Budget(config, batches.steps_per_epoch, state)
    optimizer = build_optimizer(model, config.optimizer, config.learning_rate, config.weight_decay,
                                config.betas, config.eps)
    schedule = LearningRateSchedule(config.learning_rate, budget.progress, budget.warmup, config.lr_schedule)
    checkpoints = output_dir / "checkpoints"
    parts = _Parts(model, optimizer, schedule, scaler, batches, state, save, load, dict(identity or {}))
    start, resumed = _resume(parts, resume, overwrite, checkpoints, config, ctx)
    ddp_model = wrap_model(model, ctx)
    reporter = Reporter(output_dir, ctx.is_main, budget.max_steps, state.step, config.max_time_s)
    if resumed is not None:
        reporter.record(resumed)
    last_checkpoint = start
    try:
        with _StopSignal() as stop:
            stop_reason = _train(ddp_model, loss_fn, parts, config, budget, autocast, stop, reporter, ctx,
                                 eval_fn, on_best, checkpoints)
            if stop_reason == "budget" and eval_fn is not None and state.last_eval_step != state.step:
                _evaluate(parts, eval_fn, on_best, config, autocast, reporter, ctx)
            last_checkpoint = _save(parts, checkpoints, config, ctx) or last_checkpoint
            if stop.requested:  # arrived during the last evaluation or save: the run is complete, but the
                stop_reason = "signal"  # user asked the command to stop, so the caller must not go on
        peak = runtime.peak_memory(ctx.device)
        reporter.record({"kind": "memory", "step": state.step, **peak})
    finally:
        reporter.close()
    # Another rank may have caught the signal; SIGTERM is what a cluster scheduler sends.
    signum = (stop.signum or signal.SIGTERM) if stop_reason == "signal" else None
    return FitResult(state.step, stop_reason, last_checkpoint if ctx.is_main else None, state.skipped_steps,
                     batches.skipped_samples, state.best, signum, peak)


@dataclass
class _Parts:
    """Everything a checkpoint holds, in one place."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    schedule: LearningRateSchedule
    scaler: torch.amp.GradScaler | None
    batches: EpochBatches
    state: _State
    save_weights: Callable[[nn.Module, Path], object]  # return values are ignored (load_model returns
    load_weights: Callable[[nn.Module, Path], object]  # the missing and unexpected keys)
    identity: dict[str, Any]


def _train(model: nn.Module, loss_fn: LossFn, parts: _Parts, config: TrainConfig, budget: _Budget,
           autocast: Callable[[], Any], stop: _StopSignal, reporter: Reporter, ctx: DistributedContext,
           eval_fn: EvalFn | None, on_best: Any, checkpoints: Path) -> str:
    """Steps until the budget is spent ('budget') or a stop was requested ('signal')."""
    state = parts.state
    if budget.done(state.step):
        return "budget"
    started, elapsed_before = time.perf_counter(), state.elapsed_s
    cadence = _Cadence(config, parts.batches.steps_per_epoch, state)
    data: Iterator[StepBatch] = iter(parts.batches)
    while True:
        lr = parts.schedule.apply(parts.optimizer, state.step)  # skipped steps count: see optim.py
        local = _forward_backward(model, loss_fn, next(data), autocast, parts.scaler, ctx)
        clock = time.perf_counter() - started + elapsed_before
        loss, metrics, tokens, stop_requested, elapsed = _reduce(*local, stop.requested, clock, ctx)
        state.elapsed_s = elapsed
        grad_norm = _optimizer_step(parts, config, loss)
        state.step += 1
        record = {"kind": "train", "step": state.step, "loss": loss, **metrics, "lr": lr,
                  "grad_norm": grad_norm, "epoch": parts.batches.epoch, "elapsed_s": round(elapsed, 3)}
        if not math.isfinite(loss) or not math.isfinite(grad_norm):
            _count_nonfinite(state, record, reporter)
        else:
            state.consecutive_nonfinite = 0
        reporter.train_step(record, tokens, show=state.step % cadence.log_every == 0)
        if state.consecutive_nonfinite >= config.max_nonfinite_steps:
            raise BertkitError(
                f"{state.consecutive_nonfinite} optimizer steps in a row (up to step {state.step}) had a "
                "non-finite loss or gradient norm, so training stopped without saving the poisoned state; "
                "lower --learning-rate, use --precision fp32 or bf16, check the data, and resume from the "
                "last checkpoint with --resume auto")
        if eval_fn is not None and cadence.evaluates(state.step):
            _evaluate(parts, eval_fn, on_best, config, autocast, reporter, ctx)
        if stop_requested:
            return "signal"
        if config.early_stopping_patience and state.evals_since_best >= config.early_stopping_patience:
            reporter.message(f"early stopping at step {state.step}: {config.best_metric} has not improved for "
                             f"{state.evals_since_best} evaluations")
            return "early_stop"
        if budget.done(state.step):
            return "budget"
        if cadence.saves(state.step):
            _save(parts, checkpoints, config, ctx)


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
    vector = torch.stack([local[key] for key in keys]).to(device)
    vector = all_reduce_sum(vector, ctx)
    return {key: vector[i].clamp(min=1.0) for i, key in enumerate(keys)}  # an empty term divides by 1


def _step_statistics(loss_sum: torch.Tensor, sums: dict[str, Any], tokens: int, stop_requested: bool,
                     clock: float, ctx: DistributedContext) -> tuple[list[str], torch.Tensor]:
    """(metric names, one float64 vector on the training device): loss, metrics, tokens, stop flag, clock."""
    keys = sorted(sums)
    device = loss_sum.device
    host = torch.tensor([float(tokens), float(stop_requested), clock if ctx.is_main else 0.0], dtype=torch.float64)
    parts = [loss_sum.reshape(1).to(torch.float64)]
    parts += [torch.as_tensor(sums[key], dtype=torch.float64, device=device).reshape(1) for key in keys]
    return keys, torch.cat([*parts, host.to(device)])


def _reduce(loss_sum: torch.Tensor, sums: dict[str, Any], tokens: int, stop_requested: bool, clock: float,
            ctx: DistributedContext) -> tuple[float, dict[str, float], int, bool, float]:
    """One all-reduce per step, on the training device: loss, metrics, tokens, stop flags (any rank) and
    rank 0's clock; read back to the host once."""
    keys, vector = _step_statistics(loss_sum, sums, tokens, stop_requested, clock, ctx)
    values = all_reduce_sum(vector, ctx).tolist()
    reduced = dict(zip(keys, values[1:1 + len(keys)]))
    return values[0], reduced, int(values[-3]), values[-2] > 0, values[-1]


def _optimizer_step(parts: _Parts, config: TrainConfig, loss: float) -> float:
    """Unscale, clip, and step the optimizer only when everything is finite; returns the grad norm."""
    params = [p for p in parts.model.parameters() if p.grad is not None]
    if parts.scaler is not None:
        parts.scaler.unscale_(parts.optimizer)
    max_norm = config.max_grad_norm if config.max_grad_norm > 0 else math.inf
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm)) if params else 0.0
    if math.isfinite(loss) and math.isfinite(grad_norm):
        if parts.scaler is not None:
            parts.scaler.step(parts.optimizer)
        else:
            parts.optimizer.step()
    if parts.scaler is not None:
        parts.scaler.update()
    parts.optimizer.zero_grad(set_to_none=True)
    return grad_norm


def _count_nonfinite(state: _State, record: dict[str, Any], reporter: Reporter) -> None:
    state.consecutive_nonfinite += 1
    state.skipped_steps += 1
    record["skipped"] = True
    reporter.message(f"step {state.step}: non-finite loss {record['loss']} or gradient norm "
                     f"{record['grad_norm']}; optimizer step skipped "
                     f"({state.consecutive_nonfinite} in a row, {state.skipped_steps} in total)")


def _evaluate(parts: _Parts, eval_fn: EvalFn, on_best: Any, config: TrainConfig,
              autocast: Callable[[], Any], reporter: Reporter, ctx: DistributedContext) -> None:
    """Every process evaluates the plain model (an eval_fn may share the work out and gather it); rank 0's
    metrics are logged and decide the best `config.best_metric`, which every rank then shares."""
    state = parts.state
    state.last_eval_step = state.step
    parts.model.eval()
    with torch.no_grad(), autocast():
        metrics = {key: float(value) for key, value in eval_fn(parts.model).items()}
    parts.model.train()
    if ctx.is_main:
        reporter.eval_step(state.step, metrics)
        if config.best_metric is not None:
            _track_best(parts, metrics, config, on_best)
    state.best, state.evals_since_best = broadcast_object((state.best, state.evals_since_best), ctx)
    barrier(ctx)


def _track_best(parts: _Parts, metrics: dict[str, float], config: TrainConfig, on_best: Any) -> None:
    state = parts.state
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


# --- checkpoints -----------------------------------------------------------------------------------

def _save(parts: _Parts, root: Path, config: TrainConfig, ctx: DistributedContext) -> Path | None:
    """Write checkpoint step-NNNNNNNN (rank 0, with every rank's RNG state); prune to keep_last."""
    if parts.state.consecutive_nonfinite:
        logger.warning("step %d is in a run of non-finite steps; no checkpoint is written from it",
                       parts.state.step)
        return None
    rng_states = all_gather_objects(ckpt.capture_rng_state(), ctx)
    target = root / ckpt.checkpoint_name(parts.state.step)
    written = None
    if ctx.is_main and ckpt.verify_checkpoint(target) is not None:
        for name, tensor in parts.model.state_dict().items():
            if tensor.is_floating_point() and not torch.isfinite(tensor).all():
                raise BertkitError(f"parameter {name} is not finite at step {parts.state.step}; refusing to "
                                   "save a poisoned checkpoint; resume from the last one with a lower "
                                   "--learning-rate")
        written = ckpt.save_atomically(root, target.name, lambda d: _write_parts(parts, d, rng_states, config),
                                       meta={"step": parts.state.step})
        ckpt.prune_checkpoints(root, config.keep_last)
    barrier(ctx)
    return written or (target if ctx.is_main else None)


def _write_parts(parts: _Parts, directory: Path, rng_states: list[dict], config: TrainConfig) -> None:
    parts.save_weights(parts.model, directory)
    ckpt.save_optimizer(parts.optimizer, directory)
    ckpt.write_json(directory / "rng.json", {"ranks": rng_states})
    ckpt.write_json(directory / "trainer_state.json", {
        "state": dataclasses.asdict(parts.state),
        # For the resume log only: the learning rate is recomputed from the settings, never restored.
        "schedule": {"lr_last_step": parts.schedule(parts.state.step - 1) if parts.state.step else 0.0},
        "identity": parts.identity,
        "scaler": parts.scaler.state_dict() if parts.scaler is not None else None,
        "data": parts.batches.position(),
        "world_size": len(rng_states),
        "config": dataclasses.asdict(config),
    })


def _resume(parts: _Parts, resume: str | Path | None, overwrite: bool, root: Path, config: TrainConfig,
            ctx: DistributedContext) -> tuple[Path | None, dict[str, Any] | None]:
    """Restore every part from the chosen checkpoint (rank 0 picks it, all ranks load it); returns it and
    the metrics.jsonl record of the resume (None when starting at step 0)."""
    chosen = ckpt.choose_checkpoint(resume, overwrite, root, ctx)
    if chosen is None:
        return None, None
    with ckpt.restoring(chosen):
        trainer = ckpt.read_trainer_state(chosen)
        changes = _compare_settings(chosen, trainer, config, parts)
        parts.load_weights(parts.model, chosen)
        ckpt.load_optimizer(parts.optimizer, chosen)
        apply_hyperparameters(parts.optimizer, parts.model, config.weight_decay, config.betas, config.eps)
        if parts.scaler is not None and trainer["scaler"] is not None:
            parts.scaler.load_state_dict(trainer["scaler"])
        parts.batches.restore(trainer["data"])
        _restore_rng(ckpt.read_rng_states(chosen), config, trainer["state"]["step"], ctx)
    if ctx.is_main:  # only now: a refused resume (above) leaves the run directory as it was
        ckpt.move_newer_aside(chosen, root)
    barrier(ctx)
    saved = trainer["state"]
    parts.state.__dict__.update({k: v for k, v in saved.items() if k in parts.state.__dict__})
    step = parts.state.step
    lr_before = (trainer.get("schedule") or {}).get("lr_last_step")
    lr_now = parts.schedule(step)
    if ctx.is_main:
        logger.info("resumed from %s at step %d%s", chosen, step, _describe_changes(changes, lr_before, lr_now))
    return chosen, {"kind": "resume", "step": step, "checkpoint": str(chosen), "lr_last_step": lr_before,
                    "lr": lr_now, "changed": {name: [old, new] for name, (old, new) in changes.items()}}


# A change of a setting in RESUME_EXACT_SETTINGS (seed, data order, global batch, and the caller's
# `identity`: data, model) breaks a resumed run's exactness, so it is refused unless TrainConfig.allow_change
# names it. Every other TrainConfig setting may change on resume and takes effect from the next step: the
# learning rate and schedule (recomputed from the step), the budget, evaluation and checkpoint cadence, weight
# decay, Adam's betas and epsilon, clipping, precision, and how the global batch is split.
UNCOMPARED = ("allow_change",)


def _compare_settings(chosen: Path, trainer: dict[str, Any], config: TrainConfig, parts: _Parts
                      ) -> dict[str, tuple[Any, Any]]:
    """{setting: (checkpoint's value, this run's)} of every setting that differs; a BertkitError for the first
    one that breaks exactness and --allow-change does not name. Checkpoints of older versions lack some
    entries: what was not saved is not compared."""
    saved = _section(trainer, "config")
    now = json.loads(json.dumps(dataclasses.asdict(config)))  # tuples as lists, as saved
    changes = {name: (saved[name], now[name]) for name in now
               if name in saved and name not in UNCOMPARED and saved[name] != now[name]}
    old_global = trainer["data"]["global_batch_size"]
    if old_global != parts.batches.global_batch_size:
        changes["global_batch_size"] = (old_global, parts.batches.global_batch_size)
    elif "global_batch_size" in changes:  # spelled differently, the same batch
        del changes["global_batch_size"]
    saved_identity = _section(trainer, "identity")
    changes |= {name: (saved_identity[name], value) for name, value in parts.identity.items()
                if name in saved_identity and saved_identity[name] != value}
    for name, (old, new) in changes.items():
        exact = name in RESUME_EXACT_SETTINGS or name in parts.identity
        if exact and name not in config.allow_change:
            raise BertkitError(
                f"--resume {chosen}: {name} was {_short(old)} in the run being resumed and is {_short(new)} now; "
                f"a resumed run with another {name} is no longer exact. Resume with the run's own {name}, "
                f"continue anyway with --allow-change {name}, or start a new run in another --output directory")
    return changes


def _section(trainer: dict[str, Any], name: str) -> dict[str, Any]:
    section = trainer.get(name)
    return section if isinstance(section, dict) else {}


def _short(value: Any, limit: int = 80) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _describe_changes(changes: dict[str, tuple[Any, Any]], lr_before: float | None, lr_now: float) -> str:
    if not changes:
        return ""
    listed = ", ".join(f"{name} {_short(old, 40)} -> {_short(new, 40)}" for name, (old, new) in changes.items())
    lr = f"{lr_before:.3g} at the last step, {lr_now:.3g} now" if lr_before is not None else f"{lr_now:.3g} now"
    return f"; settings changed since the checkpoint, applied from this step: {listed} (learning rate {lr})"


def _restore_rng(rank_states: list[dict], config: TrainConfig, step: int, ctx: DistributedContext) -> None:
    if len(rank_states) != ctx.world_size:
        logger.warning("checkpoint saved by %d processes, resuming with %d: RNG streams (dropout) of "
                       "ranks without a saved state are reseeded", len(rank_states), ctx.world_size)
    if ctx.rank < len(rank_states):
        ckpt.restore_rng_state(rank_states[ctx.rank])
    else:
        runtime.seed_everything(config.seed + ctx.rank + 1_000_003 * step)
