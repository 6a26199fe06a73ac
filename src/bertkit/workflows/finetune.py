"""Fine-tuning: one run per seed through `bertkit.train.loop.fit`, evaluated on dev every epoch, the best
evaluation of the best seed kept as OUTPUT/best, and the run's eval_results.json.

    run_finetuning(kind, train_path, dev_paths, settings, task_settings) -> results   files in, OUTPUT/best out
    finetune(task, settings, tokenizer, train_examples, dev_sets, report) -> results
    model_source(settings) -> ModelSource                                    --model and --tokenizer, read once
    build_model(task, settings, tokenizer, source) -> model                  the task model (or feature-based)
    fit_seed(model, loss, data, train, run, ctx, resuming, what) -> best     one seed's `fit` (embedding's too)

The task (`bertkit.tasks.task.Task`, made by `bertkit.tasks.kinds.build_task`) supplies everything
task-specific; evaluation is `bertkit.workflows.predict.predict_features`, the fine-tuned directory format
`bertkit.tasks.finetuned`, the run's OUTPUT bookkeeping `bertkit.workflows.run_output`, batches
`bertkit.inference.batching`, the feature-based model `bertkit.model.feature_based`, the model made ready to
train `bertkit.workflows.prepare`.

Design decision: one fine-tuning run per seed, each evaluated on dev at the end of every epoch (or every
`eval_every` steps) and checkpointed at each evaluation: the seed's TrainConfig is the run's
(`FinetuneSettings.train`) with what fine-tuning derives from it (`seed_training`: the seed, evaluation every
epoch, checkpoints at evaluations, the dev metric to keep the best of);
the loop tracks the best evaluation and stops early (`TrainConfig.best_metric`, `early_stopping_patience`),
and only the best evaluation of the best seed is kept as `OUTPUT/best` (a
directory that `predict`, `evaluate` and the server load with nothing else). A seed keeps the loop's
resumable checkpoints in `OUTPUT/seed-N/checkpoints` until it finishes, so an interrupted run continues
with `resume="auto"` exactly where it stopped (bit-identical losses on CPU); a finished seed is marked by
`seed-N/seed_results.json` and is never trained again, and its checkpoints are then deleted, since a
fine-tuning run's result is its best evaluation.

The feature-based approach (paper section 5.3): `freeze_encoder` trains only the head; with
`feature_layers` the head reads a combination (concat, sum or mean) of the chosen layers' hidden states
of the frozen encoder instead of the last layer (`bertkit.model.feature_based`).

References: Devlin et al. (2018), sections 4 and 5.3 and appendix A.3 (lr 5e-5/3e-5/2e-5, batch 32,
3 epochs, warmup 10%, dropout 0.1, best of several restarts on dev).
"""

from __future__ import annotations

import dataclasses
import functools
import json
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

from bertkit.config import PRESETS, BertConfig, check_model_directory, preset
from bertkit.errors import BertkitError, Interrupted
from bertkit.inference.batching import feature_length, pad_batch
from bertkit.io.jsonfile import read_json_object
from bertkit.model import accelerate_for_inference, compile_model, enable_gradient_checkpointing
from bertkit.model.feature_based import FeatureBasedModel
from bertkit.runtime.device import apply_threads, peak_memory, seed_everything
from bertkit.settings import FinetuneSettings, TrainConfig, check_positions
from bertkit.tasks.finetuned import feature_based_model, save_finetuned
from bertkit.tasks.kinds import build_task
from bertkit.tasks.task import Task, warn_empty_texts, warn_skipped
from bertkit.tokenizer import WordPieceTokenizer, check_model_vocabulary
from bertkit.train import FitResult, Hooks, TrainingData, fit
from bertkit.train.distributed import DistributedContext, barrier, rank0_decides, setup_distributed, unwrap_model
from bertkit.workflows.predict import RESULTS_FILE, predict_features, write_results
from bertkit.workflows.prepare import prepare_training
from bertkit.workflows.recipes import PRETRAINING_FILE, finetune_learning_rate, pretraining_history
from bertkit.workflows.run_output import (
    data_record,
    finished_seed,
    keep_best_seed,
    mark_seed_done,
    prepare_output,
    record_run,
    seed_summary,
)

log = logging.getLogger(__name__)

# --- the model -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ModelSource:
    """--model and --tokenizer, read once per run: a preset (random initialisation) or a checkpoint directory, its
    config, the vocabulary checked against it, and what bertkit recorded of its pre-training."""

    directory: Path | None
    """The checkpoint directory; None for a preset."""
    config: BertConfig
    tokenizer: WordPieceTokenizer
    pretraining: dict[str, Any] | None
    """None: random initialisation; {}: pre-trained elsewhere (assumed to convergence); {"steps": N}: bertkit's."""


def model_source(settings: FinetuneSettings) -> ModelSource:
    """The run's model and vocabulary, read once and checked before any data is read: --model first (a directory
    with config.json, or a preset), then the vocabulary (`check_model_vocabulary`: what serve refuses is refused
    here, not after training)."""
    if settings.model in PRESETS:
        if settings.tokenizer is None:
            raise BertkitError(f"--model {settings.model} is a preset (random initialisation); give --tokenizer DIR "
                               "with the vocab.txt to use")
        return ModelSource(None, preset(settings.model), WordPieceTokenizer.from_pretrained(settings.tokenizer), None)
    directory = check_model_directory(settings.model, presets=True)
    tokenizer = WordPieceTokenizer.from_pretrained(settings.tokenizer or directory)
    config = BertConfig.from_json_file(directory / "config.json")
    check_model_vocabulary(tokenizer, config.vocab_size, directory, settings.tokenizer)
    record = pretraining_history(read_json_object(directory / PRETRAINING_FILE, missing={}, damaged={}))
    return ModelSource(directory, config, tokenizer, record)


def load_tokenizer(settings: FinetuneSettings) -> WordPieceTokenizer:
    """The run's vocabulary (`model_source`)."""
    return model_source(settings).tokenizer


def check_length_fits(settings: FinetuneSettings, max_seq_length: int, source: ModelSource | None = None) -> None:
    """Refuse a --max-seq-length longer than the model's positions before anything is written (a corrected
    command then finds --output as it was); the one place fine-tuning checks it."""
    check_positions(max_seq_length, (source or model_source(settings)).config.max_position_embeddings)


def build_model(task: Task, settings: FinetuneSettings, tokenizer: WordPieceTokenizer, source: ModelSource
                ) -> nn.Module:
    """A fresh task model (preset) or one loaded from the checkpoint, with the task's head and dropout, compiled
    or checkpointing its layers as the run asks (its length was checked by `check_length_fits`)."""
    overrides = {**task.config_overrides(), "hidden_dropout_prob": settings.dropout,
                 "attention_probs_dropout_prob": settings.dropout}
    if source.directory is None:
        model = task.model_class(source.config.replace(vocab_size=tokenizer.vocab_size, **overrides))
    else:
        model = task.model_class.from_pretrained(source.directory, **overrides)
    if settings.train.compile:
        compile_model(model)
    if settings.train.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    if settings.feature_layers:
        return feature_based_model(task, model.bert, settings.feature_layers, settings.feature_combine,
                                   settings.dropout)
    if settings.freeze_encoder:
        for parameter in model.bert.parameters():
            parameter.requires_grad_(False)
    return model


# --- training ----------------------------------------------------------------------------------------

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
                 directory: Path, ctx: DistributedContext) -> None:
        self.task, self.tokenizer, self.dev_sets, self.eval_batch_size = task, tokenizer, dev_sets, eval_batch_size
        self.directory, self.ctx = directory, ctx
        self.latest: list[tuple[DevSet, Any]] = []
        self.best_main: float | None = None  # of the evaluations of this process (a resumed run starts again)

    def hooks(self) -> Hooks:
        return Hooks(evaluate=self.evaluate, on_best=self.on_best) if self.dev_sets else Hooks()

    def on_final(self, model: nn.Module, step: int) -> None:
        """Without a dev set: the trained model is the seed's result."""
        save_finetuned(model, self.task, self.tokenizer, self.directory / "best")
        write_results(self.directory / RESULTS_FILE, {"step": step})

    def evaluate(self, model: nn.Module) -> dict[str, float]:
        self.latest = []
        first, *others = self.dev_sets
        model = accelerate_for_inference(model)  # fp32: predict_features turns autocast off
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
        save_finetuned(model, self.task, self.tokenizer, self.directory / "best")
        for dev, decoded in self.latest:
            self.task.write_predictions(dev.examples, decoded, self.directory, f"{dev.name}_" if dev.name else "")
        write_results(self.directory / RESULTS_FILE, {**metrics, "step": step})


def resolve_learning_rate(settings: FinetuneSettings, log_choice: bool = True, source: ModelSource | None = None
                          ) -> float:
    """The run's peak learning rate: the given one, or the rule's for this model (logged with why)."""
    if settings.train.learning_rate is not None:
        return settings.train.learning_rate
    source = source or model_source(settings)
    config = source.config
    rate, reason = finetune_learning_rate(config.hidden_size, source.pretraining, config.num_hidden_layers)
    if log_choice:
        log.info("learning rate auto: %.2g (%s); --learning-rate overrides it", rate, reason)
    return rate


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


def training_data(features: list[dict], tokenizer: WordPieceTokenizer, group_by_length: bool) -> TrainingData:
    """Encoded examples as the loop draws batches from them: padded per micro-batch, grouped by length if asked."""
    # A list of feature dicts is a map-style dataset (sized, indexable), which is all fit needs.
    return TrainingData(cast(Dataset, features), lambda items: pad_batch(items, tokenizer.pad_token_id),
                        [feature_length(f) for f in features] if group_by_length else None)


def _train_seed(task: Task, settings: FinetuneSettings, tokenizer: WordPieceTokenizer, train_features: list[dict],
                dev_sets: list[DevSet], seed: int, ctx: DistributedContext, source: ModelSource) -> dict[str, float]:
    """Train one seed (continuing its checkpoint when resuming); its best dev metrics with their step."""
    directory = settings.output / f"seed-{seed}"
    resuming = rank0_decides(lambda: settings.resume and any((directory / "checkpoints").glob("step-*")), ctx)
    if ctx.is_main and not resuming:
        shutil.rmtree(directory, ignore_errors=True)  # a partial seed without a checkpoint starts fresh
    if ctx.is_main:
        directory.mkdir(parents=True, exist_ok=True)
    barrier(ctx)
    seed_everything(seed)  # the head's initialisation depends on the seed too (the same on every rank)
    model = build_model(task, settings, tokenizer, source)
    plain = model
    metric = task.metric_names[0] if dev_sets else None
    model, train = prepare_training(model, seed_training(settings, seed, metric), ctx,
                                    *step_shape(settings, train_features, ctx))
    if isinstance(plain, FeatureBasedModel) and ctx.device.type == "cpu" and not train.compile:
        # Frozen features with prediction's kernels (with --compile, the compiled encoder computes them).
        plain.use_encoder_copy(functools.partial(accelerate_for_inference, autocast=train.precision == "bf16"))
    run = SeedRun(task, tokenizer, dev_sets, settings.eval_batch_size, directory, ctx)
    every = f"{train.eval_every} steps" if train.eval_every else "epoch"
    log.info("seed %d: %s, precision %s%s", seed, f"evaluation every {every}" if dev_sets else "no dev set",
             train.precision, ", resuming" if resuming else "")
    data = training_data(train_features, tokenizer, settings.group_by_length)
    return fit_seed(model, task.training_loss(), data, train, run, ctx, resuming, f"fine-tuning seed {seed}")


def fit_seed(model: nn.Module, loss: Any, data: TrainingData, train: TrainConfig, run: Any, ctx: DistributedContext,
             resuming: bool, what: str) -> dict[str, float]:
    """Train one seed's prepared model with `fit` (its checkpoints in `run.directory`, dev scored and the best
    kept by `run.hooks()`); its best dev metrics with their step. Shared by every fine-tuning task and by
    sentence-embedding training."""
    result = fit(model, loss, data, train, run.directory, ctx=ctx, hooks=run.hooks(),
                 resume="auto" if resuming else None)
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


def finetune(task: Task, settings: FinetuneSettings, tokenizer: WordPieceTokenizer, train_examples: Sequence[Any],
             dev_sets: list[tuple[str, Sequence[Any]]], report: dict[str, Any],
             inputs: dict[str, Any] | None = None, input_labels: dict[str, str] | None = None,
             source: ModelSource | None = None) -> dict[str, Any]:
    """Fine-tune once per seed; keep the best seed's best evaluation in OUTPUT/best; write eval_results.json.

    `dev_sets` are (name, examples) with '' naming the first (selection) set; `report` holds counts of
    skipped/truncated inputs, written into eval_results.json. With `settings.resume`, seeds finished earlier
    are read back and an interrupted seed continues from its checkpoint; the run's settings, its task and
    `inputs` (what `run_finetuning` records of the files; `input_labels` name them in messages) must then be
    those of the interrupted run by the rulebook (`bertkit.settings.rules`).
    """
    apply_threads(settings.train.threads)
    ctx = setup_distributed(settings.train.device)  # the process's group, kept for whatever trains next
    return _finetune_seeds(task, settings, tokenizer, train_examples, dev_sets, report, ctx, inputs or {},
                           input_labels or {}, source or model_source(settings))


def _finetune_seeds(task: Task, settings: FinetuneSettings, tokenizer: WordPieceTokenizer,
                    train_examples: Sequence[Any], dev_sets: list[tuple[str, Sequence[Any]]], report: dict[str, Any],
                    ctx: DistributedContext, inputs: dict[str, Any], labels: dict[str, str], source: ModelSource
                    ) -> dict[str, Any]:
    """`finetune` inside its process group: every rank trains each seed, rank 0 writes the run's files. The run's
    record holds its settings as resolved (the learning rate `auto` chose) and is written once every check has
    passed and the examples are encoded: a refused or failed resume leaves the record of the run it tried to
    continue."""
    settings.train.batch_plan(ctx.world_size)  # a batch that cannot be split says so before any work
    check_length_fits(settings, task.settings.max_seq_length, source)
    settings = rank0_decides(lambda: with_learning_rate(settings, source=source), ctx)  # rank 0 says why
    record = {**run_settings(settings), **run_task(task), **inputs}
    rank0_decides(lambda: prepare_output(settings.output, settings.resume, settings.overwrite, record,
                                         settings.train.allow_change, labels), ctx)
    report["learning_rate"] = settings.train.learning_rate
    train_features = task.features(train_examples, tokenizer, training=True)
    report["truncated_train_examples"] = task.last_truncated
    sets = [DevSet(name, examples, task.features(examples, tokenizer)) for name, examples in dev_sets]
    report["truncated_dev_examples"] = task.last_truncated if sets else 0
    if ctx.is_main:
        record_run(settings.output, record)
    return train_seeds(settings, task.metric_names if sets else (), ctx, report,
                       lambda seed: _train_seed(task, settings, tokenizer, train_features, sets, seed, ctx, source))


def with_learning_rate(settings: FinetuneSettings, log_choice: bool = True, source: ModelSource | None = None
                       ) -> FinetuneSettings:
    """`settings` with the run's learning rate resolved (`resolve_learning_rate`)."""
    rate = resolve_learning_rate(settings, log_choice, source)
    return dataclasses.replace(settings, train=dataclasses.replace(settings.train, learning_rate=rate))


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


# What OUTPUT/finetune_run.json records, by the names it has always used (so runs written before still resume);
# which of them a resumed run may change is the rulebook's (bertkit.settings.rules). The global batch is not here:
# each seed's checkpoint holds the one it trained with, and `fit` compares that.
_RUN_SETTINGS = ("model", "tokenizer", "dropout", "freeze_encoder", "feature_layers", "feature_combine",
                 "group_by_length")
_RUN_TRAINING = {"epochs": "num_epochs", "max_steps": "max_steps", "eval_every": "eval_every",
                 "learning_rate": "learning_rate", "warmup_ratio": "warmup_ratio", "lr_schedule": "lr_schedule",
                 "weight_decay": "weight_decay", "adam_epsilon": "adam_epsilon",
                 "early_stopping_patience": "early_stopping_patience"}


def check_without_dev(settings: FinetuneSettings) -> None:
    """Refuse, in one line, what only a dev set can do: choose among seeds, evaluate, stop early."""
    if len(settings.seeds) > 1:
        raise BertkitError(f"--seeds {','.join(map(str, settings.seeds))}: keeping the best of several seeds needs "
                           "a dev set; give --dev, or one seed")
    if settings.train.eval_every is not None:
        raise BertkitError("--eval-every evaluates on --dev; give --dev or leave --eval-every out")
    if settings.train.early_stopping_patience is not None:
        raise BertkitError("--early-stopping-patience watches the dev score; give --dev or leave it out")


def run_task(task: Task) -> dict[str, Any]:
    """What finetune_run.json records of the task: its kind, columns and labels ("task"), and its length."""
    described = task.to_json()
    return {"max_seq_length": described.pop("max_seq_length", None), "task": described}


def run_settings(settings: FinetuneSettings) -> dict[str, Any]:
    """The settings recorded in OUTPUT/finetune_run.json, as JSON values (tuples as lists)."""
    values = {key: getattr(settings, key) for key in _RUN_SETTINGS}
    values |= {key: getattr(settings.train, name) for key, name in _RUN_TRAINING.items()}
    return json.loads(json.dumps(values))


def _read_reporting(task: Task, path: str | Path, training: bool, report: dict[str, Any], key: str) -> list[Any]:
    examples, skipped = task.read(path, labelled=True, training=training)
    report[f"skipped_{key}"] = len(skipped)
    warn_skipped(path, examples, skipped)
    warn_empty_texts(path, examples)
    return examples


def run_finetuning(kind: str, train_path: str | Path, dev_paths: list[str | Path], settings: FinetuneSettings,
                   task_settings: dict[str, Any]) -> dict[str, Any]:
    """Read the files, fine-tune (see `finetune`) and return eval_results.json's content. `task_settings` are
    the task kind's own (bertkit.settings.tasks, as keyword values). Without dev files, one seed trains for
    its whole budget and its model is OUTPUT/best."""
    if not dev_paths:
        check_without_dev(settings)
    apply_threads(settings.train.threads)  # reading and encoding the files run on them too
    source = model_source(settings)
    tokenizer = source.tokenizer
    task = build_task(kind, train_path, task_settings)
    report: dict[str, Any] = {}
    train = _read_reporting(task, train_path, True, report, "train")
    dev_sets: list[tuple[str, Sequence[Any]]] = []
    for index, path in enumerate(dev_paths):
        name = "" if index == 0 else Path(path).stem
        if name and any(name == other for other, _ in dev_sets):
            name = f"{name}{index}"
        dev_sets.append((name, _read_reporting(task, path, False, report, f"dev{'_' + name if name else ''}")))
    inputs, labels = data_record(train_path, dev_paths)
    return finetune(task, settings, tokenizer, train, dev_sets, report, inputs, labels, source)
