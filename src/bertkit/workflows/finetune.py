"""Fine-tuning: one run per seed through `bertkit.train.loop.fit`, evaluated on dev every epoch, the best
evaluation of the best seed kept as OUTPUT/best, and the run's eval_results.json.

    run_finetuning(kind, train_path, dev_paths, settings, task_settings) -> results   files in, OUTPUT/best out
    finetune(task, settings, tokenizer, train_examples, dev_sets, report) -> results
    model_source(settings) -> ModelSource                                    --model and --tokenizer, read once
    build_model(task, settings, tokenizer, source) -> model                  the task model (or feature-based)
    compare_random_init(task, settings, ..., results, ...) -> results         random initialisation too, the
                                                                              better kept (`random_init`)

The task (`bertkit.tasks.task.Task`, made by `bertkit.tasks.kinds.build_task`) supplies everything
task-specific; the loop over seeds is `bertkit.workflows.seeds`, evaluation
`bertkit.workflows.predict.predict_features`, the fine-tuned directory format `bertkit.tasks.finetuned`, the
run's OUTPUT bookkeeping `bertkit.workflows.run_output`, batches `bertkit.inference.batching`, the
feature-based model `bertkit.model.feature_based`, the model made ready to train `bertkit.workflows.prepare`.

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
import shutil
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bertkit.config import PRESETS, BertConfig, check_model_directory, preset
from bertkit.errors import BertkitError
from bertkit.inference.batching import feature_length, pad_batch
from bertkit.inference.positions import PRETRAINING_FILE, trained_positions
from bertkit.io.jsonfile import read_json_object
from bertkit.model import accelerate_for_inference, compile_model, enable_gradient_checkpointing
from bertkit.model.feature_based import FeatureBasedModel
from bertkit.runtime.device import apply_threads, seed_everything
from bertkit.settings import FinetuneSettings, check_positions
from bertkit.tasks.finetuned import feature_based_model
from bertkit.tasks.kinds import build_task
from bertkit.tasks.task import Task, warn_empty_texts, warn_skipped
from bertkit.tokenizer import WordPieceTokenizer, check_model_vocabulary
from bertkit.train import checkpoint as ckpt
from bertkit.train.distributed import DistributedContext, barrier, rank0_decides, setup_distributed
from bertkit.workflows.prepare import prepare_training
from bertkit.workflows.pretrain_plan import SETTINGS_FILE as PRETRAIN_SETTINGS_FILE
from bertkit.workflows.random_init import RANDOM_INIT_DIRECTORY, keep_better_initialisation, restore_pretrained
from bertkit.workflows.recipe_notes import context_gain, long_input_task_note, random_init_comparison
from bertkit.workflows.recipes import finetune_learning_rate, pretraining_history
from bertkit.workflows.run_output import (
    data_record,
    prepare_output,
    record_run,
    stops_between_loops,
)
from bertkit.workflows.seeds import (
    DevSet,
    SeedRun,
    check_without_dev,
    fit_seed,
    seed_training,
    step_shape,
    train_seeds,
    training_data,
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
    trained_positions: int | None = None
    """The leading positions bertkit's pre-training of it trained (`bertkit.inference.positions`); None: all of them
    (a checkpoint made elsewhere), or random initialisation (none, and none expected)."""
    context_gain: float | None = None
    """The held-out context gain bertkit's pre-training of it ended at (`recipe_notes.context_gain`); None: unknown."""


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
    kept = pretraining_record(directory)
    return ModelSource(directory, config, tokenizer, pretraining_history(kept), trained_positions(kept),
                       context_gain(kept))


def pretraining_record(directory: Path) -> dict[str, Any]:
    """The model's bertkit_pretraining.json ({} without one; a training checkpoint, which has none, is said in one
    line). One that cannot be read, or whose step count is not a count, is said in one line and read as {}: a
    checkpoint pre-trained elsewhere, assumed to convergence, which decides the learning rate rule and
    --compare-random-init auto."""
    path = directory / PRETRAINING_FILE
    if not path.exists() and _pretraining_checkpoint(directory) and directory not in _SAID_CHECKPOINTS:
        _SAID_CHECKPOINTS.add(directory)
        log.warning("%s is a checkpoint of a bertkit pre-training: only the run's final/ has the %s that says how "
                    "it was pre-trained, so the model is taken as pre-trained elsewhere to convergence (the "
                    "learning rate rule and --compare-random-init auto read it); fine-tune from the run's final/, or "
                    "give --learning-rate and --compare-random-init yourself", directory, PRETRAINING_FILE)
    kept = read_json_object(path, missing={}, damaged=None)
    steps = kept.get("total_steps", kept.get("steps")) if kept else None
    if kept is None or (steps is not None and not (isinstance(steps, int) and not isinstance(steps, bool)
                                                     and steps >= 0)):
        log.warning("%s: %s, so the model is taken as pre-trained elsewhere to convergence (the learning rate rule "
                    "and --compare-random-init auto read it); restore the file bertkit wrote, or give "
                    "--learning-rate and --compare-random-init yourself", path,
                    "not readable JSON" if kept is None else f"its step count {steps!r} is not a whole number")
        return {}
    return kept


_SAID_CHECKPOINTS: set[Path] = set()
"""Checkpoints `pretraining_record` has spoken of in this process (glue reads a model once per task and rate)."""


def _pretraining_checkpoint(directory: Path) -> bool:
    """Whether `directory` is RUN/checkpoints/step-N of a `bertkit pretrain` run (another trainer's checkpoint
    has a trainer_state.json too, but no run beside it)."""
    run = directory.parent.parent
    return (directory / ckpt.TRAINER_STATE).is_file() and directory.parent.name == "checkpoints" and \
        (run / PRETRAIN_SETTINGS_FILE).is_file()


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
        order = checkpoint_head_order(task, source.config, source.directory)
        model = task.model_class.from_pretrained(source.directory, without=("classifier.",) if order is None else (),
                                                 **overrides)
        if order and order != list(range(len(order))):
            with torch.no_grad():  # the checkpoint's rows, in this run's label order
                for parameter in (model.classifier.weight, model.classifier.bias):
                    parameter.copy_(parameter[order].clone())
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


def checkpoint_head_order(task: Task, config: BertConfig, directory: Path | str) -> list[int] | None:
    """For a checkpoint that has this task's head (a classifier or tagger of `task.model_class`): the row of its
    head each of the task's labels reads (its own order, when the label sets are the same: transformers' labels
    are in their id2label's order, bertkit's sorted), or None when its labels are other ones, so the head starts
    fresh (said; it used to be loaded as it was, its rows read as other labels, or refused on a shape); also None
    when the checkpoint is of another head class. An empty list: the task has no labelled head."""
    wanted = task.config_overrides().get("id2label")
    if wanted is None:
        return []
    if task.model_class.__name__ not in (config.architectures or []):
        return None  # another head class's classifier (a sequence classifier's for a tagger) is no start either
    have = config.label_names or []
    regression = config.problem_type == "regression" or config.num_labels == 1
    if regression and list(wanted.values()) == ["score"]:
        return [0]
    if sorted(have) == sorted(wanted.values()) and len(set(have)) == len(have):
        order = [have.index(name) for name in wanted.values()]
        if order != list(range(len(order))):
            log.info("%s: its head's labels are in another order (%s); its rows are read in this run's (%s)",
                     directory, ", ".join(have), ", ".join(wanted.values()))
        return order
    log.warning("%s: its %s head is for the labels %s, not this task's (%s); the head starts fresh, the encoder is "
                "the checkpoint's", directory, task.model_class.__name__, ", ".join(map(str, have[:10])) or "none",
                ", ".join(list(wanted.values())[:10]))
    return None


# --- training ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SeedRecipe:
    """What each seed trains and on what: fine-tuning's own by default (the task model, the task's loss, the
    training file's features); distillation (`bertkit.workflows.distill`) gives its own, over the same seeds,
    evaluation, best-keeping and resume."""

    wrap: Callable[[nn.Module], nn.Module] = lambda model: model
    """The module that trains, made around the seed's task model (`build_model`'s)."""
    export: Callable[[nn.Module], nn.Module] = lambda model: model
    """The task model inside the trained module: what is evaluated and saved as OUTPUT/best."""
    loss: Callable[[Task], Any] = lambda task: task.training_loss()
    """The loop's loss (`bertkit.train.loop.LossFn`) for the task."""
    extend: Callable[[list[dict]], list[dict]] = lambda features: features
    """The training features (the training file's, encoded) as the seeds train on them."""
    collate: Callable[[list[dict], int], Any] = pad_batch
    """A micro-batch of features: `collate(features, pad token id)`."""
    record: dict[str, Any] = dataclasses.field(default_factory=dict)
    """What finetune_run.json records beside fine-tuning's settings (checked on resume by the rulebook)."""


PLAIN = SeedRecipe()

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


def _train_seed(task: Task, settings: FinetuneSettings, tokenizer: WordPieceTokenizer, train_features: list[dict],
                dev_sets: list[DevSet], seed: int, ctx: DistributedContext, source: ModelSource,
                recipe: SeedRecipe = PLAIN) -> dict[str, float]:
    """Train one seed (continuing its checkpoint when resuming); its best dev metrics with their step."""
    directory = settings.output / f"seed-{seed}"
    resuming = rank0_decides(lambda: settings.resume and any((directory / "checkpoints").glob("step-*")), ctx)
    if ctx.is_main and not resuming:
        shutil.rmtree(directory, ignore_errors=True)  # a partial seed without a checkpoint starts fresh
    if ctx.is_main:
        directory.mkdir(parents=True, exist_ok=True)
    barrier(ctx)
    seed_everything(seed)  # the head's initialisation depends on the seed too (the same on every rank)
    model = recipe.wrap(build_model(task, settings, tokenizer, source))
    plain = model
    metric = task.metric_names[0] if dev_sets else None
    model, train = prepare_training(model, seed_training(settings, seed, metric), ctx,
                                    *step_shape(settings, train_features, ctx))
    if isinstance(plain, FeatureBasedModel) and ctx.device.type == "cpu" and not train.compile:
        # Frozen features with prediction's kernels (with --compile, the compiled encoder computes them).
        plain.use_encoder_copy(functools.partial(accelerate_for_inference, autocast=train.precision == "bf16"))
    run = SeedRun(task, tokenizer, dev_sets, settings.eval_batch_size, directory, ctx, recipe.export)
    every = f"{train.eval_every} steps" if train.eval_every else "epoch"
    log.info("seed %d: %s, precision %s%s", seed, f"evaluation every {every}" if dev_sets else "no dev set",
             train.precision, ", resuming" if resuming else "")
    data = training_data(train_features, tokenizer, settings.group_by_length, recipe.collate)
    return fit_seed(model, recipe.loss(task), data, train, run, ctx, resuming, f"fine-tuning seed {seed}")


def finetune(task: Task, settings: FinetuneSettings, tokenizer: WordPieceTokenizer, train_examples: Sequence[Any],
             dev_sets: list[tuple[str, Sequence[Any]]], report: dict[str, Any],
             inputs: dict[str, Any] | None = None, input_labels: dict[str, str] | None = None,
             source: ModelSource | None = None, recipe: SeedRecipe = PLAIN) -> dict[str, Any]:
    """Fine-tune once per seed; keep the best seed's best evaluation in OUTPUT/best; write eval_results.json.

    `dev_sets` are (name, examples) with '' naming the first (selection) set; `report` holds counts of
    skipped/truncated inputs, written into eval_results.json. With `settings.resume`, seeds finished earlier
    are read back and an interrupted seed continues from its checkpoint; the run's settings, its task and
    `inputs` (what `run_finetuning` records of the files; `input_labels` name them in messages) must then be
    those of the interrupted run by the rulebook (`bertkit.settings.rules`). `recipe` says what each seed trains
    (fine-tuning's own unless a distillation gives another).
    """
    apply_threads(settings.train.threads)
    ctx = setup_distributed(settings.train.device)  # the process's group, kept for whatever trains next
    return _finetune_seeds(task, settings, tokenizer, train_examples, dev_sets, report, ctx, inputs or {},
                           input_labels or {}, source or model_source(settings), recipe)


def _finetune_seeds(task: Task, settings: FinetuneSettings, tokenizer: WordPieceTokenizer,
                    train_examples: Sequence[Any], dev_sets: list[tuple[str, Sequence[Any]]], report: dict[str, Any],
                    ctx: DistributedContext, inputs: dict[str, Any], labels: dict[str, str], source: ModelSource,
                    recipe: SeedRecipe = PLAIN) -> dict[str, Any]:
    """`finetune` inside its process group: every rank trains each seed, rank 0 writes the run's files. The run's
    record holds its settings as resolved (the learning rate `auto` chose) and is written once every check has
    passed and the examples are encoded: a refused or failed resume leaves the record of the run it tried to
    continue."""
    settings.train.batch_plan(ctx.world_size)  # a batch that cannot be split says so before any work
    check_length_fits(settings, task.settings.max_seq_length, source)
    settings = rank0_decides(lambda: with_learning_rate(settings, source=source), ctx)  # rank 0 says why
    record = {**run_settings(settings), **run_task(task), **inputs, **recipe.record}
    rank0_decides(lambda: prepare_output(settings.output, settings.resume, settings.overwrite, record,
                                         settings.train.allow_change, labels,
                                         {"--model": settings.model, "--tokenizer": settings.tokenizer}), ctx)
    report["learning_rate"] = settings.train.learning_rate
    train_features = task.features(train_examples, tokenizer, training=True)
    report["truncated_train_examples"] = task.last_truncated
    report["past_trained_positions"] = warn_untrained_positions(source, train_features, task.settings.max_seq_length)
    if recipe is PLAIN:
        report["random_init"] = decide_random_init(settings, source, train_features, bool(dev_sets))
    majority = dev_majority(task, dev_sets)
    if majority is not None:
        report["dev_majority"] = majority
    train_features = recipe.extend(train_features)
    sets = [DevSet(name, examples, task.features(examples, tokenizer)) for name, examples in dev_sets]
    report["truncated_dev_examples"] = task.last_truncated if sets else 0
    if ctx.is_main:
        record_run(settings.output, record)
    return train_seeds(settings, task.metric_names if sets else (), ctx, report,
                       lambda seed: _train_seed(task, settings, tokenizer, train_features, sets, seed, ctx, source,
                                                recipe))


def warn_untrained_positions(source: ModelSource, features: list[dict], max_seq_length: int) -> int:
    """How many training features reach positions the model's pre-training never trained (0 when it trained them
    all, or is a checkpoint made elsewhere); said in one line with the fix when any do. A short-budget recipe
    trains on short instances (64 tokens), and fine-tuning longer inputs through positions it never saw cost the
    pre-trained model its gain over random initialisation on long texts (docs/pretraining.md)."""
    trained = source.trained_positions
    if trained is None or trained >= max_seq_length:
        return 0
    past = sum(feature_length(f) > trained for f in features)
    if past:
        log.warning("%d of %d training examples reach positions past %d, which the pre-training of %s never trained "
                    "(its instances were %d tokens): continue pre-training at the length you fine-tune at "
                    "(`bertkit pretrain --init-from %s --max-seq-length %d ...`), or fine-tune with "
                    "--max-seq-length %d",
                    past, len(features), trained, source.directory, trained, source.directory, max_seq_length,
                    trained)
    budget = long_input_task_note(trained, [feature_length(f) for f in features],
                                  (source.pretraining or {}).get("steps"))
    if budget:
        log.warning("%s", budget)
    return past


def decide_random_init(settings: FinetuneSettings, source: ModelSource, features: list[dict], dev: bool
                       ) -> dict[str, Any]:
    """--compare-random-init resolved for this model and these training inputs (`recipe_notes.random_init_comparison`),
    said in one line when it compares: {"compare": bool, "reason": why}. auto without a dev set cannot compare,
    and says so (`check_random_init` refused `on` without one)."""
    if source.directory is None:
        return {"compare": False, "reason": "the model is random initialisation"}
    compare, reason = random_init_comparison(settings.compare_random_init, source.trained_positions,
                                             [feature_length(f) for f in features],
                                             (source.pretraining or {}).get("steps"), source.context_gain)
    if compare and not dev:
        log.warning("--compare-random-init %s: no --dev to compare on, so only the pre-trained model is fine-tuned "
                    "(%s)", settings.compare_random_init, reason)
        return {"compare": False, "reason": f"{reason}; no dev set to compare on"}
    if compare:
        log.warning("fine-tuning random initialisation as well, the same seeds in %s, and keeping the better on dev "
                    "(%s); this doubles the run: --compare-random-init off skips it",
                    settings.output / RANDOM_INIT_DIRECTORY, reason)
    return {"compare": compare, "reason": reason}


def check_random_init(settings: FinetuneSettings, dev: bool) -> None:
    """Refuse, before anything is read, a comparison --compare-random-init on cannot make."""
    if settings.compare_random_init != "on":
        return
    if not dev:
        raise BertkitError("--compare-random-init on compares dev scores: give --dev")
    if settings.model in PRESETS:
        raise BertkitError(f"--compare-random-init on: --model {settings.model} is random initialisation already; "
                           "give a pre-trained model directory, or leave the flag out")


def compare_random_init(task: Task, settings: FinetuneSettings, tokenizer: WordPieceTokenizer,
                        train: Sequence[Any], dev_sets: list[tuple[str, Sequence[Any]]], results: dict[str, Any],
                        inputs: dict[str, Any], labels: dict[str, str], source: ModelSource) -> dict[str, Any]:
    """After the pre-trained model's seeds: where the run decided to compare (`decide_random_init`), fine-tune the
    same architecture from random initialisation with the same seeds and settings in OUTPUT/random-init and keep
    the better (`bertkit.workflows.random_init`); else `results` as they are."""
    decision = results.get("random_init")
    ctx = setup_distributed(settings.train.device)  # the group the seeds trained in: rank 0 alone writes
    if not decision or not decision["compare"]:
        # a resumed run that compared before and no longer does: OUTPUT/best is what `results` describe
        rank0_decides(lambda: restore_pretrained(settings.output), ctx)
        return results
    baseline = dataclasses.replace(settings, output=settings.output / RANDOM_INIT_DIRECTORY,
                                   model=f"random initialisation of {settings.model}", compare_random_init="off")
    random_source = ModelSource(None, source.config, tokenizer, None)
    log.info("random initialisation: fine-tuning seeds %s in %s", ",".join(map(str, settings.seeds)),
             baseline.output)
    counts = {key: value for key, value in results.items() if key.startswith("skipped_")}
    random_results = finetune(task, baseline, tokenizer, train, dev_sets, counts, inputs, labels, random_source)
    return rank0_decides(lambda: keep_better_initialisation(settings.output, task.metric_names[0], results,
                                                             random_results, decision), ctx)


def with_learning_rate(settings: FinetuneSettings, log_choice: bool = True, source: ModelSource | None = None
                       ) -> FinetuneSettings:
    """`settings` with the run's learning rate resolved (`resolve_learning_rate`)."""
    rate = resolve_learning_rate(settings, log_choice, source)
    return dataclasses.replace(settings, train=dataclasses.replace(settings.train, learning_rate=rate))


# What OUTPUT/finetune_run.json records, by the names it has always used (so runs written before still resume);
# which of them a resumed run may change is the rulebook's (bertkit.settings.rules). The global batch is not here:
# each seed's checkpoint holds the one it trained with, and `fit` compares that.
_RUN_SETTINGS = ("model", "tokenizer", "dropout", "freeze_encoder", "feature_layers", "feature_combine",
                 "group_by_length", "compare_random_init")
_RUN_TRAINING = {"epochs": "num_epochs", "max_steps": "max_steps", "eval_every": "eval_every",
                 "learning_rate": "learning_rate", "warmup_ratio": "warmup_ratio", "lr_schedule": "lr_schedule",
                 "weight_decay": "weight_decay", "adam_epsilon": "adam_epsilon",
                 "early_stopping_patience": "early_stopping_patience"}


def run_task(task: Task) -> dict[str, Any]:
    """What finetune_run.json records of the task: its kind, columns and labels ("task"), and its length."""
    described = task.to_json()
    return {"max_seq_length": described.pop("max_seq_length", None), "task": described}


def run_settings(settings: FinetuneSettings) -> dict[str, Any]:
    """The settings recorded in OUTPUT/finetune_run.json, as JSON values (tuples as lists)."""
    values = {key: getattr(settings, key) for key in _RUN_SETTINGS}
    values |= {key: getattr(settings.train, name) for key, name in _RUN_TRAINING.items()}
    return json.loads(json.dumps(values))


def read_reporting(task: Task, path: str | Path, training: bool, report: dict[str, Any], key: str) -> list[Any]:
    examples, skipped = task.read(path, labelled=True, training=training)
    report[f"skipped_{key}"] = len(skipped)
    warn_skipped(path, examples, skipped)
    warn_empty_texts(path, examples)
    return examples


@stops_between_loops("fine-tuning")
def run_finetuning(kind: str, train_path: str | Path, dev_paths: list[str | Path], settings: FinetuneSettings,
                   task_settings: dict[str, Any]) -> dict[str, Any]:
    """Read the files, fine-tune (see `finetune`) and return eval_results.json's content. `task_settings` are
    the task kind's own (bertkit.settings.tasks, as keyword values). Without dev files, one seed trains for
    its whole budget and its model is OUTPUT/best."""
    if not dev_paths:
        check_without_dev(settings)
    check_random_init(settings, bool(dev_paths))
    apply_threads(settings.train.threads)  # reading and encoding the files run on them too
    source = model_source(settings)
    tokenizer = source.tokenizer
    task = build_task(kind, train_path, task_settings)
    report: dict[str, Any] = {}
    train, dev_sets = read_files(task, train_path, dev_paths, report)
    inputs, labels = data_record(train_path, dev_paths)
    results = finetune(task, settings, tokenizer, train, dev_sets, report, inputs, labels, source)
    results = compare_random_init(task, settings, tokenizer, train, dev_sets, results, inputs, labels, source)
    if setup_distributed(settings.train.device).is_main:  # the group fine-tuning joined (one line, not one a rank)
        warn_at_majority(results)
    return results


def dev_majority(task: Task, dev_sets: Sequence[tuple[str, Sequence[Any]]]) -> dict[str, Any] | None:
    """What always answering the first dev set's commonest label scores ({"label", "accuracy"}), for a
    classification task scored by accuracy; None for any other task or without labelled dev examples."""
    if not dev_sets or task.metric_names[:1] != ("accuracy",):
        return None
    labels = [label for label in (getattr(e, "label", None) for e in dev_sets[0][1]) if isinstance(label, str)]
    if not labels:
        return None
    label, count = Counter(labels).most_common(1)[0]
    return {"label": label, "accuracy": count / len(labels)}


def warn_at_majority(results: dict[str, Any]) -> None:
    """Say in one line when no seed's best dev accuracy beats always answering the commonest dev label: the
    accuracy looks like a result, and is none."""
    majority, best = results.get("dev_majority"), results.get("summary", {}).get("accuracy", {}).get("max")
    if majority is None or best is None or best > majority["accuracy"] + 1e-9:
        return
    log.warning("no seed scores more on dev (best accuracy %.4f) than always answering its commonest label %r "
                "(%.4f): the model has learned nothing that carries over to dev; try more epochs, another learning "
                "rate, more labelled examples, or a model pre-trained longer", best, majority["label"],
                majority["accuracy"])


def read_files(task: Task, train_path: str | Path, dev_paths: Sequence[str | Path], report: dict[str, Any]
               ) -> tuple[list[Any], list[tuple[str, Sequence[Any]]]]:
    """(training examples, dev sets as (name, examples)) read with the task, what each skipped counted in `report`;
    the first dev set is named '' (it selects the best evaluation), the others by their file's stem."""
    train = read_reporting(task, train_path, True, report, "train")
    dev_sets: list[tuple[str, Sequence[Any]]] = []
    for index, path in enumerate(dev_paths):
        name = "" if index == 0 else Path(path).stem
        if name and any(name == other for other, _ in dev_sets):
            name = f"{name}{index}"
        dev_sets.append((name, read_reporting(task, path, False, report, f"dev{'_' + name if name else ''}")))
    return train, dev_sets
