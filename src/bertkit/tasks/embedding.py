"""Training sentence embeddings (`bertkit finetune embedding`): a bi-encoder on (anchor, positive[, negative])
pairs with in-batch negatives, evaluated by retrieval, saved as a sentence-transformers directory.

    run_embedding_training(train_path, dev_paths, cfg, settings) -> results   files in, OUTPUT/best out
    SentenceEncoder(bert, pooling, normalize)(input_ids, ...) -> (B, H)        BERT + pooling (+ normalize)
    multiple_negatives_ranking_loss(anchors, candidates, scale) -> loss
    retrieval_metrics(anchors, candidates, gold) -> recall@1/5/10, mrr@10
    save_sentence_transformers(model, tokenizer, max_seq_length, directory)

The loss is sentence-transformers' MultipleNegativesRankingLoss: the anchors' cosine similarities to every
candidate of the micro-batch (all positives, then all hard negatives), times `scale` (20: temperature 0.05),
under a cross-entropy whose target for anchor i is positive i; every other pair's positive (and negative) is
a negative of anchor i. Retrieval is scored on each --dev set: every anchor against all the set's distinct
positive texts by cosine similarity, before training and at every evaluation.

Design decision: one run per seed through the same pieces as the other fine-tuning tasks (`fit` with
`tasks.finetune`'s loop settings, learning-rate rule and run bookkeeping in `tasks.run_output`: --seeds,
--resume auto, early stopping, best seed kept as OUTPUT/best), but not the `Task` protocol: a sentence
encoder has no head, its evaluation compares examples with each other, and its directory is not a
fine-tuned one. OUTPUT/best is a plain Hugging Face BERT checkpoint (`BertModel`, vocab.txt) with the
sentence-transformers module files beside it, so `SentenceTransformer(dir)`, `bertkit extract` and
`bertkit serve` (`bertkit.inference.pooling.read_sentence_transformers`) compute the same vectors, which are
the vectors trained here (`pool` is shared). In-batch negatives come from one micro-batch on one process, so
a micro-batch of one pair is refused; training runs in one process.

References: Henderson et al. (2017), "Efficient Natural Language Response Suggestion for Smart Reply",
arXiv:1705.00652 (the loss); Reimers and Gurevych (2019), "Sentence-BERT", arXiv:1908.10084; van den Oord et
al. (2018), arXiv:1807.03748 (InfoNCE, the temperature).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bertkit import __version__
from bertkit.atomic import replace_directory, write_text_atomic
from bertkit.config import PRESETS, check_model_directory, preset
from bertkit.data.pairs import PairExample, read_pairs
from bertkit.errors import BertkitError
from bertkit.inference.batching import run_sorted
from bertkit.inference.pooling import sentence_vectors
from bertkit.model import BertModel, accelerate_for_inference, compile_model, enable_gradient_checkpointing
from bertkit.runtime import peak_memory, resolve_precision, seed_everything
from bertkit.settings import EmbeddingSettings, FinetuneConfig
from bertkit.tasks.evaluate import RESULTS_FILE, write_results
from bertkit.tasks.finetune import fit_seed, load_tokenizer, resolve_learning_rate, run_settings, step_shape
from bertkit.tasks.run_output import finished_seed, keep_best_seed, mark_seed_done, prepare_output, seed_summary
from bertkit.tasks.task import warn_skipped
from bertkit.tokenizer import WordPieceTokenizer
from bertkit.train.distributed import DistributedContext, setup_distributed, teardown_distributed

log = logging.getLogger(__name__)

METRIC_NAMES = ("mrr@10", "recall@1", "recall@5", "recall@10")
"""Retrieval metrics of a dev set; the first selects the best evaluation."""
ANCHOR_BLOCK = 1024
"""Anchors scored against all candidates at a time (bounds the similarity matrix's memory)."""


# --- the model and the loss -------------------------------------------------------------------------------

class SentenceEncoder(nn.Module):
    """BERT, then one pooling of the last layer (mean / cls / max over the real tokens), then optionally unit
    length: sentence-transformers' Transformer, Pooling and Normalize modules."""

    def __init__(self, bert: BertModel, pooling: str, normalize: bool) -> None:
        super().__init__()
        self.bert, self.pooling, self.normalize = bert, pooling, normalize

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """(B, T) token ids -> (B, H) float32 sentence vectors."""
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        hidden = self.bert(input_ids, token_type_ids, attention_mask).last_hidden_state  # (B, T, H)
        return sentence_vectors([hidden], attention_mask, (self.pooling,), self.normalize)


def multiple_negatives_ranking_loss(anchors: torch.Tensor, candidates: torch.Tensor, scale: float) -> torch.Tensor:
    """Cross-entropy of `scale` x cosine(anchor i, every candidate) (B, K*B) with target i: `anchors` (B, H),
    `candidates` (K*B, H), the B positives first (row i matches anchor i), then any hard negatives."""
    scores = scale * F.normalize(anchors, dim=-1) @ F.normalize(candidates, dim=-1).T  # (B, K*B)
    return F.cross_entropy(scores, torch.arange(len(anchors), device=scores.device))


def pair_loss(scale: float) -> Any:
    """The training loop's loss_fn: one forward over every text of a (B, C, T) batch of pairs (C = 2) or
    triplets (C = 3), the mean loss over its B anchors."""
    def loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        ids = batch["input_ids"]
        size, columns, length = ids.shape
        flat = [batch[key].reshape(size * columns, length) for key in ("input_ids", "token_type_ids",
                                                                        "attention_mask")]
        vectors = model(*flat).reshape(size, columns, -1)  # (B, C, H)
        candidates = vectors[:, 1:].transpose(0, 1).reshape(-1, vectors.shape[-1])  # positives, then negatives
        return multiple_negatives_ranking_loss(vectors[:, 0], candidates, scale), {}
    return loss


# --- features and retrieval -----------------------------------------------------------------------------

def _encoded(tokenizer: WordPieceTokenizer, texts: Sequence[str], max_seq_length: int) -> tuple[list[list[int]], int]:
    """([CLS] text [SEP] ids of each text cut to max_seq_length, how many were cut)."""
    encodings = tokenizer.encode_batch(list(texts), max_length=max_seq_length)
    return [e.input_ids for e in encodings], sum(e.truncated for e in encodings)


def pair_features(pairs: Sequence[PairExample], tokenizer: WordPieceTokenizer,
                  max_seq_length: int) -> tuple[list[dict[str, Any]], int]:
    """One feature per pair in the multiple-choice layout (C lists of tokens: anchor, positive[, negative]),
    and the number of texts truncated."""
    columns = [[p.anchor for p in pairs], [p.positive for p in pairs]]
    if pairs and pairs[0].negative is not None:
        columns.append([cast(str, p.negative) for p in pairs])
    encoded = [_encoded(tokenizer, texts, max_seq_length) for texts in columns]
    features = []
    for index in range(len(pairs)):
        ids = [column[index] for column, _ in encoded]
        features.append({"input_ids": ids, "token_type_ids": [[0] * len(i) for i in ids],
                         "attention_mask": [[1] * len(i) for i in ids]})
    return features, sum(cut for _, cut in encoded)


@dataclass
class DevPairs:
    """A --dev set: its anchors, its distinct positive texts (the candidates) and each anchor's one."""

    name: str
    """'' for the first --dev file, else the file's stem (prefix of its metrics)."""
    anchors: list[str]
    candidates: list[str]
    gold: np.ndarray
    """(N,) index into `candidates` of each anchor's positive."""

    @classmethod
    def of(cls, name: str, pairs: Sequence[PairExample]) -> DevPairs:
        index: dict[str, int] = {}
        gold = [index.setdefault(p.positive, len(index)) for p in pairs]
        return cls(name, [p.anchor for p in pairs], list(index), np.array(gold))


def encode_texts(model: nn.Module, tokenizer: WordPieceTokenizer, texts: Sequence[str], max_seq_length: int,
                 batch_size: int, device: torch.device) -> np.ndarray:
    """(N, H) float32 sentence vectors of `texts`, in length-sorted batches, in fp32 with gradients off."""
    ids, _ = _encoded(tokenizer, texts, max_seq_length)
    features = [{"input_ids": i, "token_type_ids": [0] * len(i), "attention_mask": [1] * len(i)} for i in ids]
    was_training = model.training
    model.eval()
    with torch.autocast(device.type, enabled=False):
        rows = run_sorted(features, lambda b: model(b["input_ids"], b["token_type_ids"], b["attention_mask"]),
                          batch_size, tokenizer.pad_token_id, device, grad_free=torch.no_grad)
    model.train(was_training)
    return torch.stack(rows).float().cpu().numpy() if rows else np.zeros((0, 0), np.float32)


def retrieval_metrics(anchors: np.ndarray, candidates: np.ndarray, gold: np.ndarray) -> dict[str, float]:
    """Recall@1/5/10 and MRR@10 of ranking all `candidates` (K, H) for each of `anchors` (N, H) by cosine
    similarity, `gold` (N,) the index of each anchor's positive. A rank is 1 + the candidates scoring strictly
    higher than the positive (a tie counts for the positive)."""
    unit_anchors = anchors / np.maximum(np.linalg.norm(anchors, axis=1, keepdims=True), 1e-12)
    unit_candidates = candidates / np.maximum(np.linalg.norm(candidates, axis=1, keepdims=True), 1e-12)
    ranks = np.empty(len(anchors), dtype=np.int64)
    for start in range(0, len(anchors), ANCHOR_BLOCK):
        scores = unit_anchors[start:start + ANCHOR_BLOCK] @ unit_candidates.T  # (n, K)
        positive = scores[np.arange(len(scores)), gold[start:start + ANCHOR_BLOCK]]
        ranks[start:start + ANCHOR_BLOCK] = 1 + (scores > positive[:, None]).sum(axis=1)
    metrics = {"mrr@10": float(np.where(ranks <= 10, 1.0 / ranks, 0.0).mean())}
    metrics.update({f"recall@{k}": float((ranks <= k).mean()) for k in (1, 5, 10)})
    return metrics


def evaluate_retrieval(model: nn.Module, tokenizer: WordPieceTokenizer, dev_sets: Sequence[DevPairs],
                       settings: EmbeddingSettings, batch_size: int, device: torch.device) -> dict[str, float]:
    """The retrieval metrics of every dev set (those of the second and later prefixed with their name)."""
    metrics = {}
    for dev in dev_sets:
        anchors = encode_texts(model, tokenizer, dev.anchors, settings.max_seq_length, batch_size, device)
        candidates = encode_texts(model, tokenizer, dev.candidates, settings.max_seq_length, batch_size, device)
        for key, value in retrieval_metrics(anchors, candidates, dev.gold).items():
            metrics[f"{dev.name}_{key}" if dev.name else key] = value
    return metrics


# --- the sentence-transformers directory ----------------------------------------------------------------

def save_sentence_transformers(model: SentenceEncoder, tokenizer: WordPieceTokenizer, max_seq_length: int,
                               directory: Path) -> None:
    """Write `directory` (replacing an older one only once complete): the encoder as a Hugging Face BertModel
    checkpoint with its vocabulary, and the module files of sentence-transformers (Transformer, Pooling,
    optionally Normalize) in the layout every version since 2.x reads."""
    staging = directory.with_name(f".{directory.name}.{os.getpid()}.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    model.bert.save_pretrained(staging, tokenizer=tokenizer)
    kinds = [("", "Transformer"), ("1_Pooling", "Pooling")] + [("2_Normalize", "Normalize")] * model.normalize
    modules = [{"idx": i, "name": str(i), "path": path, "type": f"sentence_transformers.models.{kind}"}
               for i, (path, kind) in enumerate(kinds)]
    pooling = {"word_embedding_dimension": model.bert.config.hidden_size, "pooling_mode": model.pooling,
               **{f"pooling_mode_{mode}": model.pooling == name for name, mode in
                  (("cls", "cls_token"), ("mean", "mean_tokens"), ("max", "max_tokens"))},
               "pooling_mode_mean_sqrt_len_tokens": False, "include_prompt": True}
    files: dict[str, Any] = {
        "modules.json": modules, "1_Pooling/config.json": pooling,
        "sentence_bert_config.json": {"max_seq_length": max_seq_length, "do_lower_case": False},
        "config_sentence_transformers.json": {"__version__": {"bertkit": __version__, "pytorch": torch.__version__},
                                              "prompts": {}, "default_prompt_name": None,
                                              "similarity_fn_name": "cosine"}}
    if model.normalize:
        files["2_Normalize/config.json"] = {"module_input_name": "sentence_embedding",
                                            "module_output_name": "sentence_embedding"}
    for name, content in files.items():
        (staging / name).parent.mkdir(exist_ok=True)
        write_text_atomic(staging / name, json.dumps(content, indent=2) + "\n")
    replace_directory(staging, directory)


# --- the run ------------------------------------------------------------------------------------------------

def build_encoder(cfg: FinetuneConfig, settings: EmbeddingSettings, tokenizer: WordPieceTokenizer) -> SentenceEncoder:
    """The encoder to train: a preset (random initialisation) or a checkpoint's BERT, with --dropout."""
    dropout = {"hidden_dropout_prob": cfg.dropout, "attention_probs_dropout_prob": cfg.dropout}
    if cfg.model in PRESETS:
        bert = BertModel(preset(cfg.model, vocab_size=tokenizer.vocab_size, **dropout))
    else:
        bert = BertModel.from_pretrained(check_model_directory(cfg.model, presets=True), **dropout)
    if settings.max_seq_length > bert.config.max_position_embeddings:
        raise BertkitError(f"--max-seq-length {settings.max_seq_length} exceeds the model's max_position_embeddings "
                           f"({bert.config.max_position_embeddings}); lower it")
    model = SentenceEncoder(bert, settings.pooling, settings.normalize)
    if cfg.compile:
        compile_model(model)
    if cfg.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    return model


def check_settings(cfg: FinetuneConfig, train: Sequence[PairExample]) -> None:
    """Refuse what cannot train a sentence encoder: no in-batch negatives, or a head-only setting."""
    if cfg.freeze_encoder or cfg.feature_layers:
        flag = "--freeze-encoder" if cfg.freeze_encoder else "--feature-layers"
        raise BertkitError(f"{flag} trains a task head on a frozen encoder; a sentence encoder has no head, so the "
                           "encoder itself must train: leave it out")
    _, micro, _ = cfg.batch_plan(1)
    if micro < 2:
        given = next((f"--{n.replace('_', '-')} {getattr(cfg, n)}" for n in ("batch_size", "micro_batch_size",
                     "global_batch_size") if getattr(cfg, n) is not None), "the batch flags")
        raise BertkitError(f"{given} gives micro-batches of 1 pair: the loss takes the other pairs of a micro-batch "
                           "as negatives, so it needs at least 2 (32 or more is usual); raise it")
    if len(train) < 2:
        raise BertkitError(f"{train[0].guid.rpartition(':')[0]}: 1 pair; in-batch negatives need at least 2")


class _SeedRun:
    """One seed's evaluation hook and best-evaluation saving (the loop tracks the best and early stopping)."""

    def __init__(self, tokenizer: WordPieceTokenizer, dev_sets: list[DevPairs], settings: EmbeddingSettings,
                 cfg: FinetuneConfig, directory: Path, device: torch.device) -> None:
        self.tokenizer, self.dev_sets, self.settings, self.cfg = tokenizer, dev_sets, settings, cfg
        self.directory, self.device = directory, device

    def evaluate(self, model: nn.Module) -> dict[str, float]:
        fast = accelerate_for_inference(model)  # a copy with this machine's inference kernels, fp32
        return evaluate_retrieval(fast, self.tokenizer, self.dev_sets, self.settings, self.cfg.eval_batch_size,
                                  self.device)

    def on_best(self, model: nn.Module, step: int, metrics: dict[str, float]) -> None:
        save_sentence_transformers(cast(SentenceEncoder, model), self.tokenizer, self.settings.max_seq_length,
                                   self.directory / "best")
        write_results(self.directory / RESULTS_FILE, {**metrics, "step": step})


def _train_seed(cfg: FinetuneConfig, settings: EmbeddingSettings, tokenizer: WordPieceTokenizer,
                features: list[dict[str, Any]], dev_sets: list[DevPairs], seed: int,
                ctx: DistributedContext) -> dict[str, float]:
    """Train one seed (continuing its checkpoint when resuming); its best dev metrics with their step, and the
    metrics of the model before training (before_*)."""
    directory = cfg.output / f"seed-{seed}"
    resuming = cfg.resume and any((directory / "checkpoints").glob("step-*"))
    if not resuming:
        shutil.rmtree(directory, ignore_errors=True)  # a partial seed without a checkpoint starts fresh
    directory.mkdir(parents=True, exist_ok=True)
    seed_everything(seed)
    model = build_encoder(cfg, settings, tokenizer)
    precision = resolve_precision(cfg.precision, ctx.device, model, *step_shape(cfg, features, ctx))
    run = _SeedRun(tokenizer, dev_sets, settings, cfg, directory, ctx.device)
    before = run.evaluate(model.to(ctx.device))
    log.info("seed %d: before training %s; precision %s%s", seed, _shown(before), precision,
             ", resuming" if resuming else "")
    start = time.perf_counter()
    best = fit_seed(model, pair_loss(settings.scale), features, cfg, seed, precision, METRIC_NAMES[0], tokenizer, run,
                    ctx, resuming, f"embedding training seed {seed}")
    return {**best, "train_seconds": time.perf_counter() - start,
            **{f"before_{k}": v for k, v in before.items()}}


def _shown(metrics: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.4f}" for k, v in metrics.items())


def _read(path: str | Path, settings: EmbeddingSettings, negatives: bool, report: dict[str, Any],
          key: str) -> list[PairExample]:
    pairs, skipped = read_pairs(path, settings.anchor_column, settings.positive_column,
                                settings.negative_column if negatives else None, settings.header)
    report[f"skipped_{key}"] = len(skipped)
    warn_skipped(path, pairs, skipped)
    return pairs


def run_embedding_training(train_path: str | Path, dev_paths: Sequence[str | Path], cfg: FinetuneConfig,
                           settings: EmbeddingSettings) -> dict[str, Any]:
    """Read the files, train once per seed, keep the best seed's best evaluation as OUTPUT/best (a
    sentence-transformers directory) and return eval_results.json's content (also written)."""
    if not dev_paths:
        raise BertkitError("no --dev file: training evaluates retrieval on it and keeps the best model")
    tokenizer = load_tokenizer(cfg)
    report: dict[str, Any] = {}
    train = _read(train_path, settings, True, report, "train")
    check_settings(cfg, train)
    dev_sets: list[DevPairs] = []
    for index, path in enumerate(dev_paths):
        name = "" if index == 0 else Path(path).stem
        if name and any(name == other.name for other in dev_sets):
            name = f"{name}{index}"
        pairs = _read(path, settings, False, report, f"dev{'_' + name if name else ''}")  # dev negatives: unused
        dev_sets.append(DevPairs.of(name, pairs))
    report.update(train_pairs=len(train), dev_pairs=len(dev_sets[0].anchors),
                  dev_candidates=len(dev_sets[0].candidates))
    ctx = setup_distributed(cfg.device)
    try:
        if ctx.world_size > 1:
            raise BertkitError(f"embedding training runs in one process (in-batch negatives come from one "
                               f"micro-batch); run it without torchrun (WORLD_SIZE is {ctx.world_size})")
        return _train_seeds(cfg, settings, tokenizer, train, dev_sets, report, ctx)
    finally:
        teardown_distributed()


def _train_seeds(cfg: FinetuneConfig, settings: EmbeddingSettings, tokenizer: WordPieceTokenizer,
                 train: list[PairExample], dev_sets: list[DevPairs], report: dict[str, Any],
                 ctx: DistributedContext) -> dict[str, Any]:
    prepare_output(cfg.output, cfg.resume, cfg.overwrite, {**run_settings(cfg), **dataclasses.asdict(settings)})
    cfg = dataclasses.replace(cfg, learning_rate=resolve_learning_rate(cfg))
    features, report["truncated_train_texts"] = pair_features(train, tokenizer, settings.max_seq_length)
    report.update(learning_rate=cfg.learning_rate, **dataclasses.asdict(settings))
    main = METRIC_NAMES[0]
    per_seed: dict[int, dict[str, float]] = {}
    for seed in cfg.seeds:
        seed_dir = cfg.output / f"seed-{seed}"
        finished = finished_seed(seed_dir) if cfg.resume else None
        if finished is None:
            finished = _train_seed(cfg, settings, tokenizer, features, dev_sets, seed, ctx)
            mark_seed_done(seed_dir, finished)
        log.info("seed %d: best %s = %.4f", seed, main, finished[main])
        per_seed[seed] = finished
        shutil.rmtree(seed_dir / "checkpoints", ignore_errors=True)
        keep_best_seed(cfg.output, per_seed, seed, main)
    best_seed = max(per_seed, key=lambda s: per_seed[s][main])
    results = {**per_seed[best_seed], "best_seed": best_seed, "seeds": {str(s): m for s, m in per_seed.items()},
               "summary": seed_summary(per_seed, METRIC_NAMES), "peak_memory": peak_memory(ctx.device), **report}
    write_results(cfg.output / RESULTS_FILE, results)
    return results
