"""Training sentence embeddings (`bertkit finetune embedding`): the encoder of `bertkit.tasks.embedding` trained
on (anchor, positive[, negative]) pairs once per seed, scored by retrieval before training and at every
evaluation, the best kept as a sentence-transformers directory.

    run_embedding_training(train_path, dev_paths, settings, embedding) -> results   files in, OUTPUT/best out
    save_sentence_transformers(model, tokenizer, max_seq_length, directory)

Design decision: one run per seed through the same pieces as the other fine-tuning tasks (`fit_seed` with
`seed_training`'s TrainConfig, the learning-rate rule and the run bookkeeping of `workflows.run_output`:
--seeds, --resume auto, early stopping, best seed kept as OUTPUT/best). OUTPUT/best is a plain Hugging Face
BERT checkpoint (`BertModel`, vocab.txt) with the sentence-transformers module files beside it
(`bertkit.interop.sentence_transformers`), so `SentenceTransformer(dir)`, `bertkit extract` and `bertkit serve`
compute the same vectors, which are the vectors trained here. In-batch negatives come from one micro-batch on
one process, so a micro-batch of one pair is refused; training runs in one process.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from bertkit.config import PRESETS, check_model_directory, preset
from bertkit.data.pairs import PairExample, read_pairs
from bertkit.errors import BertkitError
from bertkit.inference.batching import pad_batch
from bertkit.interop.sentence_transformers import read_sentence_transformers, write_module_files
from bertkit.io.atomic import replace_directory
from bertkit.model import BertModel, accelerate_for_inference, compile_model, enable_gradient_checkpointing
from bertkit.runtime.device import apply_threads, seed_everything
from bertkit.settings import EMBEDDING_POOLINGS, EmbeddingSettings, FinetuneSettings
from bertkit.tasks.embedding import (
    METRIC_NAMES,
    DevPairs,
    SentenceEncoder,
    evaluate_retrieval,
    pair_features,
    pair_loss,
)
from bertkit.tasks.task import warn_skipped
from bertkit.tokenizer import WordPieceTokenizer
from bertkit.train import Hooks
from bertkit.train.distributed import DistributedContext, setup_distributed, unwrap_model
from bertkit.workflows.finetune import ModelSource, check_length_fits, model_source, run_settings, with_learning_rate
from bertkit.workflows.predict import RESULTS_FILE, write_results
from bertkit.workflows.prepare import prepare_training
from bertkit.workflows.run_output import data_record, prepare_output, record_run, stops_between_loops
from bertkit.workflows.seeds import check_without_dev, fit_seed, seed_training, step_shape, train_seeds, training_data

log = logging.getLogger(__name__)


# --- the sentence-transformers directory ----------------------------------------------------------------

def save_sentence_transformers(model: SentenceEncoder, tokenizer: WordPieceTokenizer, max_seq_length: int,
                               directory: Path) -> None:
    """Write `directory` (replacing an older one only once complete): the encoder as a Hugging Face BertModel
    checkpoint with its vocabulary, and the sentence-transformers module files beside it
    (`bertkit.interop.sentence_transformers.write_module_files`)."""
    staging = directory.with_name(f".{directory.name}.{os.getpid()}.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    model.bert.save_pretrained(staging, tokenizer=tokenizer)
    write_module_files(staging, model.bert.config.hidden_size, model.pooling, model.normalize, max_seq_length,
                       torch.__version__)
    replace_directory(staging, directory)


# --- the run ------------------------------------------------------------------------------------------------

def build_encoder(settings: FinetuneSettings, embedding: EmbeddingSettings, tokenizer: WordPieceTokenizer
                  ) -> SentenceEncoder:
    """The encoder to train: a preset (random initialisation) or a checkpoint's BERT, with --dropout (its length
    was checked once, by `check_length_fits`)."""
    dropout: dict[str, Any] = {"hidden_dropout_prob": settings.dropout,
                               "attention_probs_dropout_prob": settings.dropout}
    if settings.model in PRESETS:
        bert = BertModel(preset(settings.model, vocab_size=tokenizer.vocab_size, **dropout))
    else:
        bert = BertModel.from_pretrained(check_model_directory(settings.model, presets=True), **dropout)
    model = SentenceEncoder(bert, embedding.pooling, embedding.normalize)
    if settings.train.compile:
        compile_model(model)
    if settings.train.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    return model


def as_starting_directory(embedding: EmbeddingSettings, model: str) -> EmbeddingSettings:
    """`embedding` with the length, pooling and normalisation of the starting sentence-transformers directory
    where no flag chose them (`embedding.given`): training an all-MiniLM-L6-v2 keeps its Normalize module and its
    256 tokens unless told otherwise. A plain BERT directory or a preset keeps the settings' defaults."""
    sentence = read_sentence_transformers(model) if Path(model).is_dir() else None
    if sentence is None:
        return embedding
    kept: dict[str, Any] = {"normalize": sentence.normalize}
    if sentence.max_seq_length is not None:
        kept["max_seq_length"] = sentence.max_seq_length
    if len(sentence.poolings) == 1 and sentence.poolings[0] in EMBEDDING_POOLINGS:
        kept["pooling"] = sentence.poolings[0]
    kept = {name: value for name, value in kept.items() if name not in embedding.given}
    if kept:
        log.info("kept from %s: %s (a flag overrides each)", model, ", ".join(f"{k} {v}" for k, v in kept.items()))
    return dataclasses.replace(embedding, **kept)


def check_settings(settings: FinetuneSettings, train: Sequence[PairExample]) -> None:
    """Refuse what cannot train a sentence encoder: no in-batch negatives, or a head-only setting."""
    if settings.freeze_encoder or settings.feature_layers:
        flag = "--freeze-encoder" if settings.freeze_encoder else "--feature-layers"
        raise BertkitError(f"{flag} trains a task head on a frozen encoder; a sentence encoder has no head, so the "
                           "encoder itself must train: leave it out")
    _, micro, _ = settings.train.batch_plan(1)
    if micro < 2:
        batch = settings.train
        given = next((f"--{n.replace('_', '-')} {getattr(batch, n)}" for n in ("batch_size", "micro_batch_size",
                     "global_batch_size") if getattr(batch, n) is not None), "the batch flags")
        raise BertkitError(f"{given} gives micro-batches of 1 pair: the loss takes the other pairs of a micro-batch "
                           "as negatives, so it needs at least 2 (32 or more is usual); raise it")
    if len(train) < 2:
        raise BertkitError(f"{train[0].guid.rpartition(':')[0]}: 1 pair; in-batch negatives need at least 2")


class EmbeddingRun:
    """One seed's evaluation hook and best-evaluation saving (the loop tracks the best and early stopping)."""

    def __init__(self, tokenizer: WordPieceTokenizer, dev_sets: list[DevPairs], embedding: EmbeddingSettings,
                 eval_batch_size: int, directory: Path, device: torch.device) -> None:
        self.tokenizer, self.dev_sets, self.embedding = tokenizer, dev_sets, embedding
        self.eval_batch_size, self.directory, self.device = eval_batch_size, directory, device

    def hooks(self) -> Hooks:
        return Hooks(evaluate=self.evaluate, on_best=self.on_best) if self.dev_sets else Hooks()

    def on_final(self, model: nn.Module, step: int) -> None:
        """Without a dev set: the trained encoder is the seed's result."""
        save_sentence_transformers(cast(SentenceEncoder, model), self.tokenizer, self.embedding.max_seq_length,
                                   self.directory / "best")
        write_results(self.directory / RESULTS_FILE, {"step": step})

    def evaluate(self, model: nn.Module) -> dict[str, float]:
        fast = accelerate_for_inference(model)  # a copy with this machine's inference kernels, fp32
        return evaluate_retrieval(fast, self.tokenizer, self.dev_sets, self.embedding, self.eval_batch_size,
                                  self.device)

    def on_best(self, model: nn.Module, step: int, metrics: dict[str, float]) -> None:
        save_sentence_transformers(cast(SentenceEncoder, model), self.tokenizer, self.embedding.max_seq_length,
                                   self.directory / "best")
        write_results(self.directory / RESULTS_FILE, {**metrics, "step": step})


@dataclass(frozen=True)
class EncoderRecipe:
    """What each seed of an embedding run trains: by default the encoder `build_encoder` makes, on the pairs with
    in-batch negatives; embedding distillation (`bertkit.workflows.distill_embedding`) gives its own: a student, on
    texts and the teacher's vectors."""

    build: Callable[[FinetuneSettings, EmbeddingSettings, WordPieceTokenizer], SentenceEncoder] = build_encoder
    """The seed's encoder, before training."""
    loss: Callable[[EmbeddingSettings], Any] = lambda embedding: pair_loss(embedding.scale)
    """The loop's loss."""
    features: Callable[[list[PairExample], WordPieceTokenizer, int], tuple[list[dict[str, Any]], int]] = \
        pair_features
    """(training features, texts truncated) of the training pairs at the run's length."""
    collate: Callable[[list[dict], int], Any] = pad_batch
    """A micro-batch of features: `collate(features, pad token id)`."""
    record: dict[str, Any] = dataclasses.field(default_factory=dict)
    """What finetune_run.json records beside the run's settings."""


PAIRS = EncoderRecipe()


def _train_seed(settings: FinetuneSettings, embedding: EmbeddingSettings, tokenizer: WordPieceTokenizer,
                features: list[dict[str, Any]], dev_sets: list[DevPairs], seed: int,
                ctx: DistributedContext, recipe: EncoderRecipe = PAIRS) -> dict[str, float]:
    """Train one seed (continuing its checkpoint when resuming); its best dev metrics with their step, and the
    metrics of the model before training (before_*)."""
    directory = settings.output / f"seed-{seed}"
    resuming = settings.resume and any((directory / "checkpoints").glob("step-*"))
    if not resuming:
        shutil.rmtree(directory, ignore_errors=True)  # a partial seed without a checkpoint starts fresh
    directory.mkdir(parents=True, exist_ok=True)
    seed_everything(seed)
    model, train = prepare_training(recipe.build(settings, embedding, tokenizer),
                                    seed_training(settings, seed, METRIC_NAMES[0] if dev_sets else None), ctx,
                                    *step_shape(settings, features, ctx))
    run = EmbeddingRun(tokenizer, dev_sets, embedding, settings.eval_batch_size, directory, ctx.device)
    before = run.evaluate(unwrap_model(model)) if dev_sets else {}  # (a DDP wrapper in a group of one)
    scores = f"before training {_shown(before)}" if before else "no dev set"
    log.info("seed %d: %s; precision %s%s", seed, scores, train.precision, ", resuming" if resuming else "")
    start = time.perf_counter()
    data = training_data(features, tokenizer, settings.group_by_length, recipe.collate)
    best = fit_seed(model, recipe.loss(embedding), data, train, run, ctx, resuming, f"embedding training seed {seed}")
    return {**best, "train_seconds": time.perf_counter() - start,
            **{f"before_{k}": v for k, v in before.items()}}


def _shown(metrics: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.4f}" for k, v in metrics.items())


def _read(path: str | Path, embedding: EmbeddingSettings, negatives: bool, report: dict[str, Any],
          key: str) -> list[PairExample]:
    pairs, skipped = read_pairs(path, embedding.anchor_column, embedding.positive_column,
                                embedding.negative_column if negatives else None, embedding.header)
    report[f"skipped_{key}"] = len(skipped)
    warn_skipped(path, pairs, skipped)
    return pairs


@stops_between_loops("training")
def run_embedding_training(train_path: str | Path, dev_paths: Sequence[str | Path], settings: FinetuneSettings,
                           embedding: EmbeddingSettings) -> dict[str, Any]:
    """Read the files, train once per seed, keep the best seed's best evaluation as OUTPUT/best (a
    sentence-transformers directory) and return eval_results.json's content (also written)."""
    if not dev_paths:
        check_without_dev(settings)
    apply_threads(settings.train.threads)
    embedding = as_starting_directory(embedding, settings.model)
    source = model_source(settings)
    tokenizer = source.tokenizer
    report: dict[str, Any] = {}
    train, dev_sets = read_pair_files(train_path, dev_paths, embedding, report)
    check_settings(settings, train)
    ctx = one_process(settings)
    data = data_record(train_path, dev_paths)
    return train_encoder_seeds(settings, embedding, tokenizer, train, dev_sets, report, ctx, data, source)


def read_pair_files(train_path: str | Path, dev_paths: Sequence[str | Path], embedding: EmbeddingSettings,
                    report: dict[str, Any]) -> tuple[list[PairExample], list[DevPairs]]:
    """(training pairs, dev sets) read by the run's columns, what each skipped and their sizes counted in
    `report`; the first dev set is named '' (it selects the best evaluation), the others by their file's stem."""
    train = _read(train_path, embedding, True, report, "train")
    dev_sets: list[DevPairs] = []
    for index, path in enumerate(dev_paths):
        name = "" if index == 0 else Path(path).stem
        if name and any(name == other.name for other in dev_sets):
            name = f"{name}{index}"
        pairs = _read(path, embedding, False, report, f"dev{'_' + name if name else ''}")  # dev negatives: unused
        dev_sets.append(DevPairs.of(name, pairs))
    report.update(train_pairs=len(train), dev_pairs=len(dev_sets[0].anchors) if dev_sets else 0,
                  dev_candidates=len(dev_sets[0].candidates) if dev_sets else 0)
    return train, dev_sets


def one_process(settings: FinetuneSettings) -> DistributedContext:
    """The run's context, refusing torchrun: in-batch negatives come from one micro-batch on one process."""
    ctx = setup_distributed(settings.train.device)
    if ctx.world_size > 1:
        raise BertkitError(f"embedding training runs in one process (in-batch negatives come from one "
                           f"micro-batch); run it without torchrun (WORLD_SIZE is {ctx.world_size})")
    return ctx


def train_encoder_seeds(settings: FinetuneSettings, embedding: EmbeddingSettings, tokenizer: WordPieceTokenizer,
                 train: list[PairExample], dev_sets: list[DevPairs], report: dict[str, Any],
                 ctx: DistributedContext, data: tuple[dict[str, Any], dict[str, str]], source: ModelSource,
                 recipe: EncoderRecipe = PAIRS) -> dict[str, Any]:
    check_length_fits(settings, embedding.max_seq_length, source)  # before anything is written
    settings = with_learning_rate(settings, source=source)  # recorded as resolved
    inputs, labels = data
    record = {**run_settings(settings), **dataclasses.asdict(embedding), **inputs, **recipe.record}
    prepare_output(settings.output, settings.resume, settings.overwrite, record, settings.train.allow_change, labels,
                   {"--model": settings.model, "--tokenizer": settings.tokenizer})
    features, report["truncated_train_texts"] = recipe.features(train, tokenizer, embedding.max_seq_length)
    record_run(settings.output, record)
    report.update(learning_rate=settings.train.learning_rate, **dataclasses.asdict(embedding))
    return train_seeds(settings, METRIC_NAMES if dev_sets else (), ctx, report,
                       lambda seed: _train_seed(settings, embedding, tokenizer, features, dev_sets, seed, ctx, recipe))
