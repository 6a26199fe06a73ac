"""`bertkit pretrain`: the data, the model and the training loop wired together.

    pretrain(settings, train) -> FitResult          OUTPUT/checkpoints, metrics, final/ (with its record)
    evaluate_pretraining(model, dataset, batch_size, ..., precision) -> held-out MLM / NSP metrics
    split_held_out(data_dir, eval_examples, seed) -> (train, held-out)
    run_datasets(settings, seed, built_seq_length) -> (train, held-out) as a run reads them
    sampled_words(train, special_token_ids, seed) -> the words of a bounded, seeded sample of instances
    unigram_baseline(train, vocab_size, special_token_ids, seed) -> what mlm_context_gain is measured against
    start_bias_at_frequencies(model, baseline)        the MLM decoder bias at the log word frequencies

Design decision: every decision of the run is made first, once, by `pretrain_plan.plan_pretraining` (threads,
budget, compile, precision, the recipe, the GPU step) and recorded; then, in order: the data and its held-out
split, the vocabulary checked against the data, the model built (or continued from --init-from) and prepared
(`workflows.prepare`: device, DDP), the loop (`bertkit.train.fit` with the task's objective,
`bertkit.tasks.pretraining.PretrainingObjective`), then `final/` with the sentence-transformers files and the
pooler a continued model keeps.

References: Devlin et al. 2018, sections 3.1 and A.2.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import Dataset

from bertkit.config import BertConfig, load_config
from bertkit.data import PretrainingDataset, collate_pretraining, collate_static_buckets
from bertkit.errors import BertkitError
from bertkit.inference.positions import PRETRAINING_FILE, trained_positions
from bertkit.interop.sentence_transformers import copy_module_files
from bertkit.io.atomic import check_writable, write_text_atomic
from bertkit.io.jsonfile import read_json_object
from bertkit.model import (
    BertForMaskedLM,
    BertForPreTraining,
    accelerate_for_inference,
    enable_gradient_checkpointing,
    read_state_dict,
)
from bertkit.model.fused import fuse_for_training
from bertkit.runtime.device import autocast
from bertkit.settings import PretrainSettings, TrainConfig
from bertkit.tasks.pretraining import (
    IGNORE_INDEX,
    PretrainingObjective,
    mlm_logits_and_targets,
    weighted_mlm_loss,
)
from bertkit.tokenizer import WordPieceTokenizer
from bertkit.train import FitResult, Hooks, Resume, TrainingData, fit, setup_distributed
from bertkit.train import checkpoint as ckpt
from bertkit.train.compiled import CompiledObjective
from bertkit.train.distributed import DistributedContext, all_reduce_sum, barrier, rank0_decides
from bertkit.workflows.adapt import carry_pooler
from bertkit.workflows.prepare import StepPlan, prepare_training, training_attention, training_dropout, training_kernels
from bertkit.workflows.pretrain_plan import SETTINGS_FILE, plan_pretraining
from bertkit.workflows.recipe_notes import context_gain, plateau_note
from bertkit.workflows.recipes import PretrainRecipe, full_length_step, pretraining_history

logger = logging.getLogger(__name__)


@torch.no_grad()
def evaluate_pretraining(model: nn.Module, dataset: Dataset, batch_size: int, nsp: bool = True,
                         pad_token_id: int = 0, ctx: DistributedContext | None = None,
                         precision: str = "fp32", baseline: UnigramBaseline | None = None) -> dict[str, float]:
    """Held-out MLM loss/accuracy over all masked tokens and NSP loss/accuracy over all pairs, in the training
    `precision` (fp32, bf16, fp16); under torchrun each process scores its share of the held-out set and the sums
    are added up (on the device). Given a `baseline`, also `mlm_context_gain`: the baseline's cross-entropy at the
    held-out positions whose input is [MASK], less the model's there, in nats per token (none without such a
    position; `recipe_notes.UNIGRAM_PLATEAU_NATS` reads it). Only [MASK] inputs count: a token kept or replaced at
    random can be copied from the input, which is no reading of its context."""
    ctx = ctx or DistributedContext()
    device = next(model.parameters()).device
    model = accelerate_for_inference(model, autocast=precision == "bf16" and device.type == "cpu")
    with autocast(precision, device)():
        return _held_out_metrics(model, dataset, batch_size, nsp, pad_token_id, ctx, device, baseline)


def _held_out_metrics(model: nn.Module, dataset: Dataset, batch_size: int, nsp: bool, pad_token_id: int,
                      ctx: DistributedContext, device: torch.device, baseline: UnigramBaseline | None = None
                      ) -> dict[str, float]:
    """`evaluate_pretraining`'s sums over this process's share, added up over every process."""
    totals = dict(mlm_loss=0.0, mlm_correct=0, mlm_tokens=0, nsp_loss=0.0, nsp_correct=0, pairs=0,
                  mask_loss=0.0, unigram_loss=0.0, mask_tokens=0)
    log_frequency = baseline.log_frequency.to(device) if baseline is not None else None
    size = len(dataset)  # type: ignore[arg-type]  # torch's Dataset declares no __len__ (map-style ones have it)
    first, last = size * ctx.rank // ctx.world_size, size * (ctx.rank + 1) // ctx.world_size
    for start in range(first, last, batch_size):
        items = [dataset[i] for i in range(start, min(start + batch_size, last))]
        batch = {k: v.to(device) for k, v in collate_pretraining(items, pad_token_id).items()}
        mlm_logits, targets, nsp_logits = mlm_logits_and_targets(model, batch, nsp, sparse=True)
        scores = mlm_logits.float()  # argmax too: on a CPU, over bf16 rows it took twice fp32's time
        losses = F.cross_entropy(scores, targets, reduction="none")
        totals["mlm_loss"] += float(losses.sum())
        totals["mlm_correct"] += int((scores.argmax(-1) == targets).sum())
        totals["mlm_tokens"] += len(targets)
        if baseline is not None and log_frequency is not None:
            # the sparse targets are the masked positions in row-major order, as their inputs here
            at_mask = batch["input_ids"][batch["mlm_labels"] != IGNORE_INDEX] == baseline.mask_token_id
            totals["mask_loss"] += float(losses[at_mask].sum())
            totals["unigram_loss"] -= float(log_frequency[targets[at_mask]].sum())
            totals["mask_tokens"] += int(at_mask.sum())
        if nsp_logits is not None:
            labels = batch["nsp_labels"]
            totals["nsp_loss"] += float(F.cross_entropy(nsp_logits.float(), labels, reduction="sum"))
            totals["nsp_correct"] += int((nsp_logits.argmax(-1) == labels).sum())
            totals["pairs"] += len(labels)
    keys = sorted(totals)
    summed = all_reduce_sum(torch.tensor([float(totals[k]) for k in keys], dtype=torch.float64, device=device), ctx)
    totals = dict(zip(keys, summed.tolist()))
    tokens, pairs = max(1.0, totals["mlm_tokens"]), max(1.0, totals["pairs"])
    metrics = {"mlm_loss": totals["mlm_loss"] / tokens, "mlm_accuracy": totals["mlm_correct"] / tokens}
    if totals["mask_tokens"]:
        metrics["mlm_context_gain"] = (totals["unigram_loss"] - totals["mask_loss"]) / totals["mask_tokens"]
    if nsp:
        metrics.update(nsp_loss=totals["nsp_loss"] / pairs, nsp_accuracy=totals["nsp_correct"] / pairs)
    return metrics


UNIGRAM_SAMPLE_INSTANCES = 10_000
"""Training instances whose words `unigram_baseline` counts: at 64 tokens 450,000-570,000 words on the corpora
measured, enough that an 8,000-piece vocabulary's frequencies are estimated to within about 0.01 nats."""


@dataclass(frozen=True, eq=False)  # (a tensor field: compared by identity)
class UnigramBaseline:
    """What `mlm_context_gain` measures a model against: predicting every masked word from its frequency alone."""

    mask_token_id: int
    log_frequency: torch.Tensor
    """(vocabulary,) float64: the log of each id's add-half smoothed frequency among the sampled words."""
    words: int
    """How many words were counted."""


def sampled_words(dataset: Dataset, special_token_ids: Sequence[int], seed: int,
                  instances: int = UNIGRAM_SAMPLE_INSTANCES) -> Iterator[torch.Tensor]:
    """The words of up to `instances` instances of `dataset`, drawn with `seed`, one (words,) id tensor per instance
    in its order: every original word (a masked position's target) except [CLS], [SEP], [MASK] and padding ([UNK] is
    a word here). The same `seed` draws the same instances in every process; the cost is bounded by `instances`."""
    pad, _, cls, sep, mask = special_token_ids  # the tokenizer's order: [PAD], [UNK], [CLS], [SEP], [MASK]
    size = len(dataset)  # type: ignore[arg-type]
    rng = np.random.default_rng([seed, 11])
    chosen = rng.choice(size, size=min(size, instances), replace=False) if size else np.zeros(0, np.int64)
    special = torch.tensor((pad, cls, sep, mask))
    for index in chosen:
        item = dataset[int(index)]
        labels, inputs = item["mlm_labels"], item["input_ids"]
        words = torch.where(labels != IGNORE_INDEX, labels, inputs)[item["attention_mask"].bool()]
        yield words[~torch.isin(words, special)]


def unigram_baseline(dataset: Dataset, vocab_size: int, special_token_ids: Sequence[int], seed: int,
                     instances: int = UNIGRAM_SAMPLE_INSTANCES) -> UnigramBaseline:
    """The word frequencies of the `sampled_words` of `dataset` (the training split, so the held-out words are
    scored by frequencies counted elsewhere, as the model learned its own). The same `seed` gives every process the
    same baseline without a collective."""
    counts = torch.zeros(vocab_size, dtype=torch.float64)
    for words in sampled_words(dataset, special_token_ids, seed, instances):
        counts += torch.bincount(words, minlength=vocab_size).to(torch.float64)
    mask = special_token_ids[4]  # the tokenizer's order: [PAD], [UNK], [CLS], [SEP], [MASK]
    total = float(counts.sum())
    log_frequency = torch.log((counts + 0.5) / (total + 0.5 * vocab_size))
    return UnigramBaseline(mask, log_frequency, int(total))


def frequency_bias(baseline: UnigramBaseline) -> torch.Tensor:
    """(vocabulary,) fp32: `baseline`'s log word frequencies, centred (a softmax ignores a shift); centred in fp32,
    as the study's models were made. Pieces never counted ([PAD], [CLS], [SEP], [MASK], unseen words) get the
    smoothing's floor."""
    log_frequency = baseline.log_frequency.float()
    return log_frequency - log_frequency.mean()


def start_bias_at_frequencies(model: BertForPreTraining | BertForMaskedLM, baseline: UnigramBaseline) -> None:
    """Set the MLM decoder's bias to `frequency_bias(baseline)`: the model then predicts a masked word from its
    frequency before it has learned anything, as the unigram plateau every pre-training starts on would otherwise
    teach it over its first steps, partly through the word embeddings."""
    with torch.no_grad():
        model.mlm.bias.copy_(frequency_bias(baseline))


# --- data -----------------------------------------------------------------------------------------

class _Split(Dataset):
    """Some indices of a PretrainingDataset; forwards set_epoch so dynamic masking still varies."""

    def __init__(self, dataset: PretrainingDataset, indices: np.ndarray) -> None:
        self.dataset, self.indices = dataset, indices

    def set_epoch(self, epoch: int) -> None:
        self.dataset.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, key: int | tuple[int, int]) -> dict[str, torch.Tensor]:
        """Item `key`, or with a (index, length) key (`TrainingData.phase`) that item cut to that length."""
        index, length = key if isinstance(key, tuple) else (key, None)
        return self.dataset.read(int(self.indices[index]), length)


def split_held_out(data_dir: Path, eval_examples: int, seed: int, train_length: int | None = None, **loading: Any
                   ) -> tuple[_Split, _Split]:
    """(train, held-out) from one data directory: `eval_examples` random instances (at most a tenth)
    are held out and never trained on; the held-out copy keeps epoch 0's masks so evaluations compare.
    `loading` goes to PretrainingDataset (max_seq_length, masked_lm_prob); `train_length` replaces its
    max_seq_length for the training copy (a run with full-length steps reads it at full length)."""
    train = PretrainingDataset(data_dir, **{**loading, "max_seq_length": train_length or loading.get("max_seq_length")})
    count = min(eval_examples, len(train) // 10)
    order = np.random.default_rng([seed, 7]).permutation(len(train))
    held_out = np.sort(order[:count])
    keep = np.sort(order[count:])
    logger.info("holding out %d of %d instances of %s for evaluation", count, len(train), data_dir)
    return _Split(train, keep), _Split(PretrainingDataset(data_dir, **loading), held_out)


# --- the run --------------------------------------------------------------------------------------

def _tokenizer(settings: PretrainSettings, dataset_hash: str) -> WordPieceTokenizer:
    source = settings.tokenizer or settings.init_from
    if source is None:
        raise BertkitError("--tokenizer DIR is required (the vocabulary the data was made with) unless "
                           "--init-from gives a directory with vocab.txt")
    tokenizer = WordPieceTokenizer.from_pretrained(source)
    if tokenizer.vocab_hash != dataset_hash:
        if settings.tokenizer is None:  # the vocabulary is --init-from's: the data must be made with it
            raise BertkitError(f"--init-from {source}: its vocabulary is not the one --data {settings.data} was made "
                               f"with (sha256 differs); build the data with `bertkit data pretraining --tokenizer "
                               f"{source}`")
        raise BertkitError(f"--tokenizer {source}: its vocab.txt is not the vocabulary {settings.data} was "
                           "made with (sha256 differs); pass the tokenizer directory used for "
                           "`bertkit data pretraining`")
    return tokenizer


def build_model(settings: PretrainSettings, train: TrainConfig, tokenizer: WordPieceTokenizer, max_seq_length: int,
                step: StepPlan | None = None) -> BertForPreTraining | BertForMaskedLM:
    """A fresh model from a preset/config, or the weights of --init-from; checkpointing its layers as `train`
    asks, with the fused kernels `step` chooses (`plan_step`; the step's compilation wraps the objective)."""
    cls = BertForPreTraining if settings.nsp else BertForMaskedLM
    overrides: dict[str, Any] = {}
    if settings.dropout is not None:
        overrides = {"hidden_dropout_prob": settings.dropout, "attention_probs_dropout_prob": settings.dropout}
    if settings.init_from is not None:
        model = cls.from_pretrained(settings.init_from, **overrides)
        config: BertConfig = model.config
    else:
        config = load_config(settings.model, **overrides)
        if config.vocab_size != tokenizer.vocab_size:
            config = config.replace(vocab_size=tokenizer.vocab_size)
        model = cls(config)
    if step is not None and (step.fused_norm or step.fused_gelu):
        fuse_for_training(model, norm=step.fused_norm, gelu=step.fused_gelu)
    if train.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    if config.vocab_size < tokenizer.vocab_size:
        raise BertkitError(f"--init-from {settings.init_from}: vocab_size {config.vocab_size} is smaller than "
                           f"the tokenizer's {tokenizer.vocab_size}")
    if max_seq_length > config.max_position_embeddings:
        raise BertkitError(f"{settings.data}: sequences of up to {max_seq_length} tokens, but the model has "
                           f"max_position_embeddings {config.max_position_embeddings}; use a model with more "
                           "positions or re-create the data with a smaller --max-seq-length")
    return model


def pretrain(settings: PretrainSettings, train: TrainConfig, objective: ObjectiveFactory | None = None,
             identity: dict[str, Any] | None = None) -> FitResult:
    """Pre-train with MLM (+ NSP) under torchrun or alone; writes `final/` (save_pretrained + vocab, and
    bertkit_pretraining.json: steps, recipe, last held-out metrics). Every decision is made first, once
    (`pretrain_plan.plan_pretraining`), and recorded in pretrain_settings.json. `objective(ctx)` replaces the
    MLM (+ NSP) objective (general distillation's, run eagerly: `bertkit.workflows.distill_pretraining`), and
    `identity` is what a resumed run must share beyond pre-training's own (`run_identity`)."""
    ctx = setup_distributed(train.device)  # the process's group, kept for whatever trains next
    rank0_decides(lambda: _preflight(settings), ctx)  # a refusal reaches every rank: none waits in a collective
    plan = plan_pretraining(settings, train, ctx)
    settings, train = plan.settings, plan.train
    assert settings.nsp is not None  # the plan decides it
    output = Path(settings.output)
    if settings.nsp and not plan.data.nsp:
        raise BertkitError(f"--data {settings.data}: masked-LM-only data ({plan.data.layout}, made with "
                           "`bertkit data pretraining --no-nsp`) has no sentence pairs to learn next sentence "
                           "prediction from; pass --no-nsp")
    train_set, eval_set = run_datasets(settings, train.seed, plan.data.built_seq_length)
    if ctx.is_main and plan.recipe is None:  # (a recipe's line says it)
        _warn_untrained_positions(settings, plan.data.built_seq_length)
    tokenizer = _tokenizer(settings, train_set.dataset.vocab_hash)
    if ctx.is_main:
        logger.info("pre-training step: %s", plan.step.describe())
    torch.manual_seed(train.seed)  # same initial weights on every rank
    model = build_model(settings, train, tokenizer, int(train_set.dataset.options["max_seq_length"]), plan.step)
    fresh = getattr(model, "newly_initialized", [])
    if fresh and ctx.is_main and settings.resume and ckpt.list_checkpoints(output / "checkpoints"):
        logger.info("resuming: the weights --init-from lacked (%s) are restored from the checkpoint, as every other",
                    ", ".join(sorted({name.split(".")[0] + ".*" for name in fresh})))
    baseline = _unigram_start(settings, model, train_set, len(eval_set) > 0, tokenizer, train.seed, ctx)
    # the precision is the plan's (nothing measured again); the attention's fill gate is measured at the run's shape
    short_length = settings.max_seq_length or plan.data.built_seq_length
    prepared, train = prepare_training(model, train, ctx, train.batch_plan(ctx.world_size)[1], short_length)
    if ctx.is_main:
        output.mkdir(parents=True, exist_ok=True)
        record = {**plan.record(ctx.world_size), "attention": training_attention(model, ctx.device),
                  "dropout": training_dropout(model, ctx.device)}  # as resolved here
        write_text_atomic(output / SETTINGS_FILE, json.dumps(record, indent=2) + "\n")
    pad = tokenizer.pad_token_id
    micro_batch = train.batch_plan(ctx.world_size)[1]
    evaluate = functools.partial(evaluate_pretraining, dataset=eval_set, nsp=settings.nsp, pad_token_id=pad,
                                 batch_size=micro_batch, ctx=ctx, precision=train.precision, baseline=baseline)
    hooks = Hooks(evaluate=evaluate if len(eval_set) else None,
                  save_weights=lambda _, d: model.save_pretrained(d, tokenizer=tokenizer),
                  load_weights=lambda _, d: model.load_hf_state_dict(read_state_dict(d), source=str(d)))
    training_data = _training_data(train_set, plan.step, pad, _phase(settings, plan.data.built_seq_length))
    loss = _objective(settings, plan.step) if objective is None else objective(ctx)
    kernels = training_kernels(model, ctx.device, train.precision, train.compile or plan.step.compile)
    last_layer = getattr(getattr(loss, "objective", loss), "last_layer", None)  # (a compiled objective wraps one)
    if last_layer is not None:  # e.g. at the masked positions alone: fewer rows, other sums, fewer dropout masks
        kernels["last_layer"] = last_layer
    result = fit(prepared, loss, training_data, train, output, ctx=ctx, hooks=hooks,
                 resume=Resume(settings.resume, settings.overwrite,
                               {**run_identity(settings, train_set.dataset, model, eval_set), **(identity or {})},
                               {"kernels": kernels}))
    if ctx.is_main and result.stop_reason == "budget":
        length = int(train_set.dataset.options["max_seq_length"])  # the full length when some steps read it
        record = _write_final(settings, train, model, tokenizer, output, result.step, plan.recipe, length)
        plateau = plateau_note(context_gain(record))
        if plateau:
            logger.warning("%s", plateau)
    barrier(ctx)  # final/ is complete before any rank goes on (a command may fine-tune from it next)
    return result


ObjectiveFactory = Callable[[DistributedContext], Any]
"""The objective of a pre-training run that trains on something else than MLM (+ NSP), made on the run's device."""


def _unigram_start(settings: PretrainSettings, model: BertForPreTraining | BertForMaskedLM, train_set: _Split,
                   evaluated: bool, tokenizer: WordPieceTokenizer, seed: int, ctx: DistributedContext
                   ) -> UnigramBaseline | None:
    """The run's unigram baseline (when it is evaluated, or its decoder bias starts at the frequencies), with the
    MLM decoder's bias set to it where --mlm-bias-init unigram and the bias is new (not an --init-from's own);
    before any wrapping, so every rank computes the same values from the same seed."""
    fresh = settings.init_from is None or "mlm.bias" in getattr(model, "newly_initialized", [])
    start = fresh and settings.mlm_bias_init == "unigram"
    if not (evaluated or start):
        return None
    baseline = unigram_baseline(train_set, model.config.vocab_size, tokenizer.special_token_ids, seed)
    if start:
        start_bias_at_frequencies(model, baseline)
        if ctx.is_main:
            logger.info("the MLM decoder's bias starts at the log frequencies of %s words of the training data "
                        "(--mlm-bias-init unigram)", f"{baseline.words:,}")
    return baseline


def _objective(settings: PretrainSettings, step: StepPlan) -> PretrainingObjective | CompiledObjective:
    """MLM (+ NSP) with the MLM loss `step` chooses, compiled whole when it says so."""
    mlm_loss = weighted_mlm_loss
    if step.fused_loss:
        from bertkit.kernels.cross_entropy import masked_lm_loss  # noqa: PLC0415 - only with fused kernels

        mlm_loss = masked_lm_loss
    objective = PretrainingObjective(nsp=bool(settings.nsp), mlm_loss=mlm_loss)  # (the plan has decided it)
    return CompiledObjective(objective, cuda_graphs=step.cuda_graphs) if step.compile else objective


def _warn_untrained_positions(settings: PretrainSettings, built_seq_length: int) -> None:
    """Say up front, with the fix, when --max-seq-length cuts the data's instances and no step reads them whole:
    the positions past the cut stay untrained, and a fine-tuning at the data's length reads them untrained."""
    cut = settings.max_seq_length or built_seq_length
    if cut < built_seq_length and not _full_length_steps(settings, built_seq_length):
        logger.warning("positions %d-%d stay untrained (instances of %d tokens are cut to %d and no step reads them "
                       "whole): fine-tuning inputs longer than %d tokens will read them untrained; "
                       "--full-length-share 0.1 ends the run at the full length", cut, built_seq_length - 1,
                       built_seq_length, cut, cut)


def _full_length_steps(settings: PretrainSettings, built_seq_length: int) -> bool:
    """Whether some steps read the data at its full length: a share is set and --max-seq-length cuts shorter."""
    return bool(settings.full_length_share) and (settings.max_seq_length or built_seq_length) < built_seq_length


def _phase(settings: PretrainSettings, built_seq_length: int) -> Callable[[int, float], int] | None:
    """`TrainingData.phase`: the length each step reads its instances at (`recipes.full_length_step`), or None
    when every step reads them at --max-seq-length."""
    if not _full_length_steps(settings, built_seq_length):
        return None
    short, share = settings.max_seq_length or built_seq_length, float(settings.full_length_share or 0.0)
    placement = settings.full_length_placement or "end"
    return lambda step, progress: (built_seq_length if full_length_step(step, progress, share, placement)
                                   else short)


def _training_data(train_set: _Split, step: StepPlan, pad: int, phase: Callable[[int, float], int] | None
                   ) -> TrainingData:
    """The training split, read at the lengths `phase` gives each step, collated to one static shape per length
    when `step` says so (then an epoch's smaller last batch is skipped and counted rather than compiled for), else
    to each batch's longest."""
    if not step.static_shapes:
        return TrainingData(train_set, functools.partial(collate_pretraining, pad_token_id=pad), phase=phase)
    options = train_set.dataset.options
    full = int(options["max_seq_length"])
    lengths = (full,) if phase is None else (int(phase(0, 0.0)), full)
    collate = functools.partial(collate_static_buckets, pad_token_id=pad, lengths=lengths,
                                max_predictions=int(options["max_predictions_per_seq"]))
    return TrainingData(train_set, collate, full_batches_only=True, phase=phase)


def _write_final(settings: PretrainSettings, train: TrainConfig, model: BertForPreTraining | BertForMaskedLM,
                 tokenizer: WordPieceTokenizer, output: Path, steps: int, recipe: PretrainRecipe | None,
                 length: int) -> dict[str, Any]:
    """OUTPUT/final, and its record returned: the model as a Hugging Face directory (never the DDP wrapper), what it
    keeps of --init-from, and bertkit_pretraining.json (the record the fine-tuning learning-rate rule and a later
    recipe read): this run's steps and recipe, and its lineage (`continued_from`: the --init-from directory, whether
    that was released elsewhere, the bertkit steps before; `total_steps` along the chain), so a released checkpoint
    continued for 30 steps is still a released checkpoint to the rules that read it; and `trained_positions`, the
    leading positions some instance of this run or of a bertkit run before it reached (`length` tokens here), so
    fine-tuning can say when its inputs reach positions pre-training never trained (None: a checkpoint made
    elsewhere is in the chain, assumed trained at every position)."""
    model.save_pretrained(output / "final", tokenizer=tokenizer)
    if settings.init_from is not None and copy_module_files(settings.init_from, output / "final"):
        logger.info("%s is a sentence-transformers directory: its modules.json and pooling are in final/ too",
                    settings.init_from)
    if settings.init_from is not None and not settings.nsp and carry_pooler(settings.init_from, output / "final"):
        logger.info("final/ keeps the pooler of %s (masked-LM-only training leaves it as it was)", settings.init_from)
    record: dict[str, Any] = {"steps": steps, "recipe": recipe.name if recipe else settings.recipe,
                              "max_seq_length": settings.max_seq_length, "learning_rate": train.learning_rate,
                              "trained_positions": length, "last_eval": _last_eval(output)}
    if settings.init_from is not None:
        earlier = read_json_object(Path(settings.init_from) / PRETRAINING_FILE, missing={}, damaged={})
        before = pretraining_history(earlier)
        record["continued_from"] = {"directory": str(settings.init_from), "released": not before,
                                    "steps": before.get("steps")}
        record["total_steps"] = None if not before else before["steps"] + steps
        covered = trained_positions(earlier)
        record["trained_positions"] = None if not before or covered is None else max(covered, length)
    write_text_atomic(output / "final" / PRETRAINING_FILE, json.dumps(record, indent=2) + "\n")
    return record


def _preflight(settings: PretrainSettings) -> None:
    """What refuses the run before its probes and plan: an --output it cannot write, or a fresh start (no --resume,
    no --overwrite) over the checkpoints of an earlier run there."""
    check_writable(settings.output, "--output")
    ckpt.refuse_fresh_start_over(Path(settings.output) / "checkpoints", settings.resume, settings.overwrite)


def run_identity(settings: PretrainSettings, data: PretrainingDataset, model: BertForPreTraining | BertForMaskedLM,
                 held_out: Dataset) -> dict[str, Any]:
    """What a resumed pre-training run must share with its checkpoint beyond TrainConfig (`fit`'s identity;
    each exact in the rulebook, bertkit.settings.rules): the data (its manifest's sha256, so a moved directory is
    the same data), which of it is held out, the vocabulary, the model's shape and the objective."""
    config = model.config
    held = (f"{len(held_out)} instances of the training data" if settings.eval_data is None  # type: ignore[arg-type]
            else f"--eval-data with manifest sha256 {_manifest_hash(held_out.manifest)}")  # type: ignore[attr-defined]
    return {"data": f"manifest sha256 {_manifest_hash(data.manifest)}", "held_out": held,
            "tokenizer": f"vocab sha256 {data.vocab_hash[:16]}",
            "model": (f"L={config.num_hidden_layers} H={config.hidden_size} A={config.num_attention_heads} "
                      f"I={config.intermediate_size} V={config.vocab_size} P={config.max_position_embeddings}"),
            "max_seq_length": settings.max_seq_length, "masked_lm_prob": settings.masked_lm_prob,
            "full_length_share": settings.full_length_share, "full_length_placement": settings.full_length_placement,
            "nsp": settings.nsp, "dropout": config.hidden_dropout_prob}


def _manifest_hash(manifest: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()[:16]


def run_datasets(settings: PretrainSettings, seed: int, built_seq_length: int
              ) -> tuple[_Split, _Split | PretrainingDataset]:
    """(train, held-out); the held-out instances are cut to --max-seq-length, the training ones too unless the run
    has full-length steps (then read at the data's length: `_phase` cuts the others as each step asks)."""
    loading: dict[str, Any] = {"max_seq_length": settings.max_seq_length, "masked_lm_prob": settings.masked_lm_prob}
    train_length = built_seq_length if _full_length_steps(settings, built_seq_length) else None
    if settings.eval_data is None:
        return split_held_out(Path(settings.data), settings.eval_examples, seed, train_length, **loading)
    train = PretrainingDataset(settings.data, **{**loading, "max_seq_length": train_length or settings.max_seq_length})
    return _Split(train, np.arange(len(train))), PretrainingDataset(settings.eval_data, **loading)


def _last_eval(output: Path) -> dict[str, float]:
    from bertkit.train.reporting import read_metrics  # noqa: PLC0415

    evals = [r for r in read_metrics(output / "metrics.jsonl") if r.get("kind") == "eval"]
    return {k: v for k, v in evals[-1].items() if k != "kind"} if evals else {}
