"""The seed toolkit that fine-tuning and sentence-embedding training share: a run is one `fit` per seed, each
evaluated on dev sets and keeping its best evaluation, the best seed's best kept as OUTPUT/best.

    train_seeds(settings, metric_names, ctx, report, train_one) -> results    every seed once; eval_results.json
    fit_seed(model, loss, data, train, run, ctx, resuming, what) -> best      one seed's `fit`
    SeedRun(task, tokenizer, dev_sets, eval_batch_size, directory, ctx)       its evaluation hook and best saving
    seed_training(settings, seed, main_metric) -> TrainConfig                 the seed's TrainConfig
    training_data(features, tokenizer, group_by_length) -> TrainingData       encoded examples as the loop draws
    step_shape(settings, features, ctx) -> (rows, tokens)                      the typical micro-batch

Design decision: a finished seed is marked by `seed-N/seed_results.json` and never trained again, and its
checkpoints are then deleted (a fine-tuning run's result is its best evaluation); an interrupted seed continues
from its newest checkpoint. The first dev set selects the best evaluation; the others are scored only when it
improves, since what is reported for them is their score at the selected evaluation.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import shutil
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn
from torch.utils.data import Dataset

from bertkit.errors import BertkitError, Interrupted
from bertkit.inference.batching import feature_length, pad_batch
from bertkit.model import accelerate_for_inference
from bertkit.runtime.device import peak_memory
from bertkit.settings import FinetuneSettings, TrainConfig
from bertkit.tasks.finetuned import save_finetuned
from bertkit.tasks.task import Task
from bertkit.tokenizer import WordPieceTokenizer
from bertkit.train import FitResult, Hooks, Resume, TrainingData, fit
from bertkit.train.distributed import DistributedContext, barrier, rank0_decides, unwrap_model
from bertkit.workflows.predict import RESULTS_FILE, predict_features, write_results
from bertkit.workflows.prepare import training_kernels
from bertkit.workflows.run_output import finished_seed, keep_best_seed, mark_seed_done, seed_summary

log = logging.getLogger(__name__)


@dataclass
class DevSet:
    name: str
    """'' for the first --dev file, else the file's stem (prefix of its metrics and predictions)."""
    examples: Sequence[Any]
    features: list[dict[str, Any]]


class SeedRun:
    """One seed's evaluation hook and best-evaluation saving (the loop tracks the best and early stopping).
    Under torchrun every process scores its share of the dev set (gathered); rank 0 alone writes.

    The first dev set selects the best evaluation; the others are scored only when it improves, since
    what is reported for them is their score at the selected evaluation (and scoring them every time
    doubled the quickstart's evaluation cost)."""

    def __init__(self, task: Task, tokenizer: WordPieceTokenizer, dev_sets: list[DevSet], eval_batch_size: int,
                 directory: Path, ctx: DistributedContext,
                 export: Callable[[nn.Module], nn.Module] = lambda model: model) -> None:
        self.task, self.tokenizer, self.dev_sets, self.eval_batch_size = task, tokenizer, dev_sets, eval_batch_size
        self.directory, self.ctx = directory, ctx
        self.export = export
        """The task model inside what trains (a distillation's student), which is evaluated and saved."""
        self.latest: list[tuple[DevSet, Any]] = []
        self.best_main: float | None = None  # of the evaluations of this process (a resumed run starts again)

    def hooks(self) -> Hooks:
        return Hooks(evaluate=self.evaluate, on_best=self.on_best) if self.dev_sets else Hooks()

    def on_final(self, model: nn.Module, step: int) -> None:
        """Without a dev set: the trained model is the seed's result."""
        save_finetuned(self.export(model), self.task, self.tokenizer, self.directory / "best")
        write_results(self.directory / RESULTS_FILE, {"step": step})

    def evaluate(self, model: nn.Module) -> dict[str, float]:
        self.latest = []
        first, *others = self.dev_sets
        model = accelerate_for_inference(self.export(model))  # fp32: predict_features turns autocast off
        metrics = self._score(model, first)
        if others and self._improved(metrics[self.task.metric_names[0]]):
            for dev in others:
                metrics.update(self._score(model, dev))
        return metrics

    def _score(self, model: nn.Module, dev: DevSet) -> dict[str, float]:
        decoded = predict_features(model, self.task, dev.examples, dev.features, self.tokenizer.pad_token_id,
                                   self.eval_batch_size, self.ctx.device, self.ctx)
        if not dev.name:  # settings chosen on the (first) dev set, e.g. SQuAD v2.0's null threshold
            decoded = self.task.select_on_dev(dev.examples, decoded)
        self.latest.append((dev, decoded))
        scores = self.task.score(dev.examples, decoded)
        return {(f"{dev.name}_{k}" if dev.name else k): float(v) for k, v in scores.items()}

    def _improved(self, value: float) -> bool:
        """Whether the first dev set's main metric beats every earlier evaluation (as the loop will judge)."""
        if not math.isfinite(value) or (self.best_main is not None and not value > self.best_main):
            return False
        self.best_main = value
        return True

    def on_best(self, model: nn.Module, step: int, metrics: dict[str, float]) -> None:
        save_finetuned(self.export(model), self.task, self.tokenizer, self.directory / "best")
        for dev, decoded in self.latest:
            self.task.write_predictions(dev.examples, decoded, self.directory, f"{dev.name}_" if dev.name else "")
        write_results(self.directory / RESULTS_FILE, {**metrics, "step": step})


def seed_training(settings: FinetuneSettings, seed: int, main_metric: str | None) -> TrainConfig:
    """One seed's TrainConfig: the run's, with what fine-tuning derives from it: --max-steps replaces --epochs
    (transformers' Trainer's rule), evaluation at every epoch end unless --eval-every, a checkpoint at every
    evaluation unless --save-every (only the last kept), the dev metric whose best is kept (None: no dev set,
    so no evaluation; checkpoints every --save-every steps and at the end)."""
    train = settings.train
    return dataclasses.replace(train, seed=seed, num_epochs=None if train.max_steps else train.num_epochs,
                               eval_every_epoch=train.eval_every is None and main_metric is not None,
                               save_on_eval=train.save_every is None, keep_last=1, log_every=None,
                               best_metric=main_metric)


def training_data(features: list[dict], tokenizer: WordPieceTokenizer, group_by_length: bool,
                  collate: Callable[[list[dict], int], Any] = pad_batch) -> TrainingData:
    """Encoded examples as the loop draws batches from them: `collate(items, pad id)` per micro-batch (padded), grouped
    by length if asked."""
    # A list of feature dicts is a map-style dataset (sized, indexable), which is all fit needs.
    return TrainingData(cast(Dataset, features), lambda items: collate(items, tokenizer.pad_token_id),
                        [feature_length(f) for f in features] if group_by_length else None)


def fit_seed(model: nn.Module, loss: Any, data: TrainingData, train: TrainConfig, run: Any, ctx: DistributedContext,
             resuming: bool, what: str) -> dict[str, float]:
    """Train one seed's prepared model with `fit` (its checkpoints in `run.directory`, dev scored and the best
    kept by `run.hooks()`); its best dev metrics with their step. Shared by every fine-tuning task and by
    sentence-embedding training."""
    # recorded with each checkpoint; a resume that runs others lists them
    kernels = training_kernels(unwrap_model(model), ctx.device, train.precision, bool(train.compile))
    result = fit(model, loss, data, train, run.directory, ctx=ctx, hooks=run.hooks(),
                 resume=Resume("auto" if resuming else None, context={"kernels": kernels}))
    if result.stop_reason == "signal":
        raise _interrupted(result, what, run.directory)
    if train.best_metric is None:  # no dev set: the trained model is the result
        if ctx.is_main:
            run.on_final(unwrap_model(model), result.step)
        barrier(ctx)
        return {"step": result.step}
    if result.best is None:
        raise BertkitError(f"seed {train.seed}: no evaluation produced a finite {train.best_metric}; "
                           "check the dev file and the learning rate")
    return {**result.best["metrics"], "step": result.best["step"]}


def step_shape(settings: FinetuneSettings, features: list[dict], ctx: DistributedContext) -> tuple[int, int]:
    """(rows, tokens) of a typical training micro-batch, for `--precision auto`'s step timing: the
    micro-batch, and the mean example length (batches are grouped by length, so a batch is about as long
    as its examples)."""
    lengths = [feature_length(f) for f in features[:2048]] or [128]
    return settings.train.batch_plan(ctx.world_size)[1], round(sum(lengths) / len(lengths))


def _interrupted(result: FitResult, what: str, directory: Path) -> Interrupted:
    assert result.signal is not None  # fit sets it whenever it stops for a signal
    saved = f"saved {result.checkpoint}" if result.checkpoint else f"the newest checkpoint in {directory} is kept"
    return Interrupted(f"{what} stopped by {signal.Signals(result.signal).name} at step {result.step}; {saved}",
                       result.signal, "--resume auto")


def train_seeds(settings: FinetuneSettings, metric_names: tuple[str, ...], ctx: DistributedContext,
                report: dict[str, Any], train_one: Callable[[int], dict[str, float]]) -> dict[str, Any]:
    """Each seed of the run once: one finished earlier is kept (with --resume), the others are trained by
    `train_one(seed)` and marked done; after each, the best seed's best evaluation is OUTPUT/best. Writes and
    returns eval_results.json: every seed's best metrics, their mean ± std, the best seed's, and `report`.
    Shared by fine-tuning and embedding training."""
    main = metric_names[0] if metric_names else None  # None: no dev set (one seed, its trained model)
    per_seed: dict[int, dict[str, float]] = {}
    for seed in settings.seeds:
        seed_dir = settings.output / f"seed-{seed}"
        finished = rank0_decides(lambda: finished_seed(seed_dir) if settings.resume else None, ctx)  # noqa: B023
        if finished is not None and main is not None and main not in finished:  # another task's, or edited
            finished = None
        result = "trained" if finished is None else "finished earlier"
        if finished is None:
            finished = train_one(seed)
            if ctx.is_main:
                mark_seed_done(seed_dir, finished)
        log.info("seed %d: %s, %s", seed, result, f"best {main} = {finished[main]:.4f}" if main else
                 f"{finished['step']} steps")
        per_seed[seed] = finished
        if ctx.is_main:
            shutil.rmtree(seed_dir / "checkpoints", ignore_errors=True)
            keep_best_seed(settings.output, per_seed, seed, main)
        barrier(ctx)
    best_seed = max(per_seed, key=lambda s: per_seed[s][main] if main else 0.0)  # the first of equals
    results = {**per_seed[best_seed], "best_seed": best_seed, "seeds": {str(s): m for s, m in per_seed.items()},
               "summary": seed_summary(per_seed, metric_names), "world_size": ctx.world_size,
               "threads": torch.get_num_threads(), "peak_memory": peak_memory(ctx.device), **report}
    if ctx.is_main:
        write_results(settings.output / RESULTS_FILE, results)
    barrier(ctx)
    return results


def check_without_dev(settings: FinetuneSettings) -> None:
    """Refuse, in one line, what only a dev set can do: choose among seeds, evaluate, stop early."""
    if len(settings.seeds) > 1:
        raise BertkitError(f"--seeds {','.join(map(str, settings.seeds))}: keeping the best of several seeds needs "
                           "a dev set; give --dev, or one seed")
    if settings.train.eval_every is not None:
        raise BertkitError("--eval-every evaluates on --dev; give --dev or leave --eval-every out")
    if settings.train.early_stopping_patience is not None:
        raise BertkitError("--early-stopping-patience watches the dev score; give --dev or leave it out")
