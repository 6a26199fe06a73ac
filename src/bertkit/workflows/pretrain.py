"""`bertkit pretrain`: the data, the model and the training loop wired together, and the recipe that fills the
settings a budget decides.

    pretrain(settings, train) -> FitResult          OUTPUT/checkpoints, metrics, final/ (with its record)
    plan_recipe(settings, train, ctx) -> (settings, train, recipe)   --recipe applied to what was not given
    evaluate_pretraining(model, dataset, batch_size, ...) -> held-out MLM / NSP metrics
    split_held_out(data_dir, eval_examples, seed) -> (train, held-out)

Design decision: the objective is the task's (`bertkit.tasks.pretraining.PretrainingObjective`), the loop is
`bertkit.train.fit`, and everything between is here, in order: the recipe (rank 0 measures, every rank
follows), the data and its held-out split, the vocabulary checked against the data, the model built (or
continued from --init-from) and prepared (`workflows.prepare`: precision, device, DDP), then `final/` with the
sentence-transformers files and the pooler a continued model keeps.

References: Devlin et al. 2018, sections 3.1 and A.2.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import Dataset

from bertkit.config import BertConfig, load_config
from bertkit.data import PretrainingDataset, collate_pretraining, collate_static
from bertkit.errors import BertkitError
from bertkit.interop.sentence_transformers import copy_module_files
from bertkit.io.atomic import write_text_atomic
from bertkit.io.jsonfile import read_json_object
from bertkit.model import (
    BertForMaskedLM,
    BertForPreTraining,
    accelerate_for_inference,
    enable_gradient_checkpointing,
    read_state_dict,
)
from bertkit.model.fused import fuse_for_training
from bertkit.model.pretrained import SAFETENSORS_NAME, safetensors_shapes
from bertkit.runtime.device import resolve_device
from bertkit.settings import PretrainSettings, TrainConfig
from bertkit.tasks.pretraining import (
    IGNORE_INDEX,
    PretrainingObjective,
    mlm_logits_and_targets,
    pretraining_loss,
    weighted_mlm_loss,
)
from bertkit.tokenizer import WordPieceTokenizer
from bertkit.train import FitResult, Hooks, Resume, TrainingData, fit, setup_distributed
from bertkit.train import checkpoint as ckpt
from bertkit.train.compiled import CompiledObjective
from bertkit.train.distributed import DistributedContext, all_reduce_sum, barrier, rank0_decides
from bertkit.train.throughput import training_steps_per_second
from bertkit.workflows.adapt import carry_pooler
from bertkit.workflows.prepare import StepPlan, plan_step, prepare_training, sample_length
from bertkit.workflows.recipes import (
    CONTINUE_PASSES,
    PAPER_MIN_STEPS,
    PRETRAINING_FILE,
    SHORT_STATIC_WARMUP_RATIO,
    PretrainRecipe,
    budget_steps,
    choose_recipe,
    continue_recipe,
    continue_steps,
    pretraining_history,
    short_recipe,
)

logger = logging.getLogger(__name__)


@torch.no_grad()
def evaluate_pretraining(model: nn.Module, dataset: Dataset, batch_size: int, nsp: bool = True,
                         pad_token_id: int = 0, ctx: DistributedContext | None = None) -> dict[str, float]:
    """Held-out MLM loss/accuracy over all masked tokens and NSP loss/accuracy over all pairs; under torchrun
    each process scores its share of the held-out set and the sums are added up (on the device)."""
    ctx = ctx or DistributedContext()
    device = next(model.parameters()).device
    bf16_autocast = torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
    model = accelerate_for_inference(model, autocast=bf16_autocast and device.type == "cpu")
    totals = dict(mlm_loss=0.0, mlm_correct=0, mlm_tokens=0, nsp_loss=0.0, nsp_correct=0, pairs=0)
    size = len(dataset)  # type: ignore[arg-type]  # torch's Dataset declares no __len__ (map-style ones have it)
    first, last = size * ctx.rank // ctx.world_size, size * (ctx.rank + 1) // ctx.world_size
    for start in range(first, last, batch_size):
        items = [dataset[i] for i in range(start, min(start + batch_size, last))]
        batch = {k: v.to(device) for k, v in collate_pretraining(items, pad_token_id).items()}
        mlm_logits, targets, nsp_logits = mlm_logits_and_targets(model, batch, nsp, sparse=True)
        totals["mlm_loss"] += float(F.cross_entropy(mlm_logits.float(), targets, reduction="sum"))
        totals["mlm_correct"] += int((mlm_logits.argmax(-1) == targets).sum())
        totals["mlm_tokens"] += len(targets)
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
    if nsp:
        metrics.update(nsp_loss=totals["nsp_loss"] / pairs, nsp_accuracy=totals["nsp_correct"] / pairs)
    return metrics


# --- data -----------------------------------------------------------------------------------------

class _Split(Dataset):
    """Some indices of a PretrainingDataset; forwards set_epoch so dynamic masking still varies."""

    def __init__(self, dataset: PretrainingDataset, indices: np.ndarray) -> None:
        self.dataset, self.indices = dataset, indices

    def set_epoch(self, epoch: int) -> None:
        self.dataset.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return self.dataset[int(self.indices[index])]


def split_held_out(data_dir: Path, eval_examples: int, seed: int, **loading: Any) -> tuple[_Split, _Split]:
    """(train, held-out) from one data directory: `eval_examples` random instances (at most a tenth)
    are held out and never trained on; the held-out copy keeps epoch 0's masks so evaluations compare.
    `loading` goes to PretrainingDataset (max_seq_length, masked_lm_prob)."""
    train = PretrainingDataset(data_dir, **loading)
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
        raise BertkitError(f"--tokenizer {source}: its vocab.txt is not the vocabulary {settings.data} was "
                           "made with (sha256 differs); pass the tokenizer directory used for "
                           "`bertkit data pretraining`")
    return tokenizer


def build_model(settings: PretrainSettings, train: TrainConfig, tokenizer: WordPieceTokenizer, max_seq_length: int,
                step: StepPlan | None = None) -> BertForPreTraining | BertForMaskedLM:
    """A fresh model from a preset/config, or the weights of --init-from; checkpointing its layers as `train`
    asks, with the fused kernels `step` chooses (`plan_step`; the step's compilation wraps the objective)."""
    cls = BertForPreTraining if settings.nsp else BertForMaskedLM
    overrides = {}
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


def _compile_by_default(train: TrainConfig, device: torch.device, log_it: bool) -> TrainConfig:
    """--compile unset: compiled on a GPU (it pays there: docs/performance.md, "GPU"), eager on a CPU."""
    if train.compile is not None:
        return train
    if device.type == "cuda" and log_it:
        logger.info("compiling the training step (the default on a GPU; --no-compile runs it eagerly)")
    return dataclasses.replace(train, compile=device.type == "cuda")


def pretrain(settings: PretrainSettings, train: TrainConfig) -> FitResult:
    """Pre-train with MLM (+ NSP) under torchrun or alone; writes `final/` (save_pretrained + vocab, and
    bertkit_pretraining.json: steps, recipe, last held-out metrics)."""
    ctx = setup_distributed(train.device)  # the process's group, kept for whatever trains next
    output = Path(settings.output)
    settings, train, recipe = plan_recipe(settings, train, ctx)
    train_set, eval_set = _datasets(settings, train.seed)
    if settings.nsp and not train_set.dataset.nsp:
        raise BertkitError(f"--data {settings.data}: masked-LM-only data ({train_set.dataset.layout}, made with "
                           "`bertkit data pretraining --no-nsp`) has no sentence pairs to learn next sentence "
                           "prediction from; pass --no-nsp")
    tokenizer = _tokenizer(settings, train_set.dataset.vocab_hash)
    train = _compile_by_default(train, ctx.device, ctx.is_main)
    step = plan_step(train, ctx.device)
    if ctx.is_main:
        logger.info("pre-training step: %s", step.describe())
    torch.manual_seed(train.seed)  # same initial weights on every rank
    model = build_model(settings, train, tokenizer, int(train_set.dataset.options["max_seq_length"]), step)
    fresh = getattr(model, "newly_initialized", [])
    if fresh and ctx.is_main and settings.resume and ckpt.list_checkpoints(output / "checkpoints"):
        logger.info("resuming: the weights --init-from lacked (%s) are restored from the checkpoint, as every other",
                    ", ".join(sorted({name.split(".")[0] + ".*" for name in fresh})))
    micro_batch = train.batch_plan(ctx.world_size)[1]
    prepared, train = prepare_training(model, train, ctx, micro_batch, sample_length(train_set, micro_batch))
    if ctx.is_main:
        output.mkdir(parents=True, exist_ok=True)
        write_text_atomic(output / "pretrain_settings.json", json.dumps(
            {"settings": asdict(settings), "train": asdict(train), "world_size": ctx.world_size,
             "batch": dict(zip(("global", "micro", "accumulation"), train.batch_plan(ctx.world_size))),
             "recipe": asdict(recipe) if recipe else None, "step": asdict(step)},
            indent=2) + "\n")
    pad = tokenizer.pad_token_id
    evaluate = functools.partial(evaluate_pretraining, dataset=eval_set, nsp=settings.nsp, pad_token_id=pad,
                                 batch_size=micro_batch, ctx=ctx)
    hooks = Hooks(evaluate=evaluate if len(eval_set) else None,
                  save_weights=lambda _, d: model.save_pretrained(d, tokenizer=tokenizer),
                  load_weights=lambda _, d: model.load_hf_state_dict(read_state_dict(d), source=str(d)))
    result = fit(prepared, _objective(settings, step), _training_data(train_set, step, pad), train, output,
                 ctx=ctx, hooks=hooks, resume=Resume(settings.resume, settings.overwrite,
                                                     run_identity(settings, train_set.dataset, model)))
    if ctx.is_main and result.stop_reason == "budget":
        _write_final(settings, train, model, tokenizer, output, result.step, recipe)
    barrier(ctx)  # final/ is complete before any rank goes on (a command may fine-tune from it next)
    return result


def _objective(settings: PretrainSettings, step: StepPlan) -> PretrainingObjective | CompiledObjective:
    """MLM (+ NSP) with the MLM loss `step` chooses, compiled whole when it says so."""
    mlm_loss = weighted_mlm_loss
    if step.fused_loss:
        from bertkit.kernels.cross_entropy import masked_lm_loss  # noqa: PLC0415 - only with fused kernels

        mlm_loss = masked_lm_loss
    objective = PretrainingObjective(nsp=settings.nsp, mlm_loss=mlm_loss)
    return CompiledObjective(objective, cuda_graphs=step.cuda_graphs) if step.compile else objective


def _training_data(train_set: _Split, step: StepPlan, pad: int) -> TrainingData:
    """The training split, collated to one static shape when `step` says so (then an epoch's smaller last batch
    is skipped and counted rather than compiled for), else to each batch's longest."""
    if not step.static_shapes:
        return TrainingData(train_set, functools.partial(collate_pretraining, pad_token_id=pad))
    options = train_set.dataset.options
    collate = functools.partial(collate_static, pad_token_id=pad, max_seq_length=int(options["max_seq_length"]),
                                max_predictions=int(options["max_predictions_per_seq"]))
    return TrainingData(train_set, collate, full_batches_only=True)


def _write_final(settings: PretrainSettings, train: TrainConfig, model: BertForPreTraining | BertForMaskedLM,
                 tokenizer: WordPieceTokenizer, output: Path, steps: int, recipe: PretrainRecipe | None) -> None:
    """OUTPUT/final: the model as a Hugging Face directory (never the DDP wrapper), what it keeps of --init-from,
    and bertkit_pretraining.json (the record the fine-tuning learning-rate rule and a later recipe read): this
    run's steps and recipe, and its lineage (`continued_from`: the --init-from directory, whether that was
    released elsewhere, the bertkit steps before; `total_steps` along the chain), so a released checkpoint
    continued for 30 steps is still a released checkpoint to the rules that read it."""
    model.save_pretrained(output / "final", tokenizer=tokenizer)
    if settings.init_from is not None and copy_module_files(settings.init_from, output / "final"):
        logger.info("%s is a sentence-transformers directory: its modules.json and pooling are in final/ too",
                    settings.init_from)
    if settings.init_from is not None and not settings.nsp and carry_pooler(settings.init_from, output / "final"):
        logger.info("final/ keeps the pooler of %s (masked-LM-only training leaves it as it was)", settings.init_from)
    record: dict[str, Any] = {"steps": steps, "recipe": recipe.name if recipe else settings.recipe,
                              "max_seq_length": settings.max_seq_length, "learning_rate": train.learning_rate,
                              "last_eval": _last_eval(output)}
    if settings.init_from is not None:
        before = pretraining_history(read_json_object(Path(settings.init_from) / PRETRAINING_FILE, missing={},
                                                      damaged={}))
        record["continued_from"] = {"directory": str(settings.init_from), "released": not before,
                                    "steps": before.get("steps")}
        record["total_steps"] = None if not before else before["steps"] + steps
    write_text_atomic(output / "final" / PRETRAINING_FILE, json.dumps(record, indent=2) + "\n")


def run_identity(settings: PretrainSettings, data: PretrainingDataset, model: BertForPreTraining | BertForMaskedLM,
                 ) -> dict[str, Any]:
    """What a resumed pre-training run must share with its checkpoint beyond TrainConfig (`fit`'s identity;
    each a name in RESUME_EXACT_SETTINGS): the data (its manifest's sha256, so a moved directory is the same
    data), the vocabulary, the model's shape and the objective."""
    manifest = json.dumps(data.manifest, sort_keys=True).encode()
    config = model.config
    return {"data": f"manifest sha256 {hashlib.sha256(manifest).hexdigest()[:16]}",
            "tokenizer": f"vocab sha256 {data.vocab_hash[:16]}",
            "model": (f"L={config.num_hidden_layers} H={config.hidden_size} A={config.num_attention_heads} "
                      f"I={config.intermediate_size} V={config.vocab_size} P={config.max_position_embeddings}"),
            "max_seq_length": settings.max_seq_length, "masked_lm_prob": settings.masked_lm_prob,
            "nsp": settings.nsp, "dropout": config.hidden_dropout_prob}


def _datasets(settings: PretrainSettings, seed: int) -> tuple[_Split, _Split | PretrainingDataset]:
    loading: dict[str, Any] = {"max_seq_length": settings.max_seq_length, "masked_lm_prob": settings.masked_lm_prob}
    if settings.eval_data is None:
        return split_held_out(Path(settings.data), settings.eval_examples, seed, **loading)
    train = PretrainingDataset(settings.data, **loading)
    return _Split(train, np.arange(len(train))), PretrainingDataset(settings.eval_data, **loading)


def _last_eval(output: Path) -> dict[str, float]:
    from bertkit.train.reporting import read_metrics  # noqa: PLC0415

    evals = [r for r in read_metrics(output / "metrics.jsonl") if r.get("kind") == "eval"]
    return {k: v for k, v in evals[-1].items() if k != "kind"} if evals else {}


# --- the recipe -------------------------------------------------------------------------------------

# Recipe attribute -> (object it sets: settings or train config, field name there).
_RECIPE_TARGETS = {"max_seq_length": ("settings", "max_seq_length"), "dropout": ("settings", "dropout"),
                   "masked_lm_prob": ("settings", "masked_lm_prob"), "nsp": ("settings", "nsp"),
                   "learning_rate": ("train", "learning_rate"), "warmup_ratio": ("train", "warmup_ratio"),
                   "batch_size": ("train", "global_batch_size"), "head_warmup_steps": ("train", "head_warmup_steps")}


def plan_recipe(settings: PretrainSettings, config: TrainConfig, ctx: Any
                ) -> tuple[PretrainSettings, TrainConfig, PretrainRecipe | None]:
    """Apply `settings.recipe` to every recipe setting the user did not give; log the choice in one line.
    A resumed run keeps the recipe it started with (its pretrain_settings.json), so it never changes mid-run."""
    if settings.recipe is None:
        return settings, config, None
    # Rank 0 reads the run's record (which it also writes) and measures; every rank applies its answer.
    recipe = rank0_decides(lambda: (_resumed_recipe(settings) if settings.resume else None)
                           or _choose(settings, config, ctx.world_size), ctx)
    data = PretrainingDataset(settings.data)
    values = {name: getattr(recipe, name) for name in _RECIPE_TARGETS
              if _RECIPE_TARGETS[name][1] not in settings.given}
    notes = []
    if values.get("nsp") and not data.nsp:
        values["nsp"] = False
        notes.append(f"{settings.data} is masked-LM-only data ({data.layout}), so NSP is off")
    if values.get("masked_lm_prob") is not None and not data.dynamic:
        values["masked_lm_prob"] = None
        note = f"{settings.data} is statically masked, so its own masks are used"
        if recipe.name == "short" and "warmup_ratio" in values:
            values["warmup_ratio"] = SHORT_STATIC_WARMUP_RATIO
            note += (f" and the warmup is {SHORT_STATIC_WARMUP_RATIO:.0%} (the one-cycle schedule paid only with the "
                     "recipe's 30% masking); for the whole recipe, build the data with `--masking dynamic`")
        notes.append(note)
    length = values.get("max_seq_length")
    if length is not None and length < data.built_seq_length:
        notes.append(f"instances of {data.built_seq_length} tokens are cut to {length} at load; to use all the "
                     f"text, build the data with `bertkit data pretraining ... --max-seq-length {length} "
                     "--masking dynamic`")
    settings = dataclasses.replace(settings, **{_RECIPE_TARGETS[k][1]: v for k, v in values.items()
                                                if _RECIPE_TARGETS[k][0] == "settings"})
    if config.batch_size is not None:  # the older --batch-size gives the global batch itself
        values.pop("batch_size", None)
    config = dataclasses.replace(config, **{_RECIPE_TARGETS[k][1]: v for k, v in values.items()
                                            if _RECIPE_TARGETS[k][0] == "train"})
    config = _recipe_micro_batch(config, recipe, ctx.world_size)
    if ctx.is_main:
        kept = [name for name in _RECIPE_TARGETS if _RECIPE_TARGETS[name][1] in settings.given]
        logger.info("recipe %s (%s): %s%s%s", recipe.name, recipe.reason, recipe.describe(),
                    f"; your flags kept: {', '.join(kept)}" if kept else "",
                    "".join(f"; {note}" for note in notes))
    return settings, config, recipe


def _recipe_micro_batch(config: TrainConfig, recipe: PretrainRecipe, world_size: int) -> TrainConfig:
    """The recipe's micro-batch when the user gave no batch setting at all and it divides the global batch
    among the processes (the paper's 256 = 32 x 8 on one process, 32 x 1 on eight GPUs)."""
    user_batch = (config.micro_batch_size, config.gradient_accumulation_steps, config.batch_size)
    if recipe.micro_batch_size is None or any(value is not None for value in user_batch):
        return config
    total = config.global_batch_size or recipe.batch_size
    if total % (recipe.micro_batch_size * world_size):
        return config  # split evenly over the processes instead (TrainConfig.batch_plan)
    return dataclasses.replace(config, micro_batch_size=recipe.micro_batch_size)


def _choose(settings: PretrainSettings, config: TrainConfig, world_size: int = 1) -> PretrainRecipe:
    """The recipe for the budget: a time budget is turned into steps at the throughput measured here, a step
    being each of the `world_size` processes' share of the global batch (the all-reduce's cost is not
    measured, so on many processes this is an upper bound on the rate)."""
    model_config = _model_config(settings)
    init = _init_kind(settings.init_from)
    rate = None
    if settings.recipe in ("auto", "continue") and config.max_time_s:
        data = PretrainingDataset(settings.data)
        short = short_recipe(model_config.hidden_size)
        assert short.max_seq_length is not None  # the short recipe fixes it
        continuing = settings.recipe == "continue" or init == "released"  # at the data's length
        length = data.built_seq_length if continuing else min(short.max_seq_length, data.built_seq_length)
        share = -(-short.batch_size // world_size)  # each process's rows of the global batch, rounded up
        # the share of positions the run will predict (the MLM head's cost grows with it): static data's own
        masking = (settings.masked_lm_prob or (continue_recipe(model_config.hidden_size, True, None) if continuing
                                               else short).masked_lm_prob) if data.dynamic else None
        masking = masking or float(data.options["masked_lm_prob"])
        rate = measure_steps_per_second(model_config.replace(vocab_size=int(data.manifest["tokenizer"]["vocab_size"])),
                                        length, share, config.precision, config.device, masked_lm_prob=masking)
    steps = budget_steps(config.max_steps, config.max_time_s, rate)
    assert settings.recipe is not None  # plan_recipe chooses only when one is asked for
    heads = _checkpoint_heads(Path(settings.init_from)) if settings.init_from is not None else {"nsp", "mlm"}
    recipe = choose_recipe(settings.recipe, model_config.hidden_size, steps, init, "nsp" in heads, "mlm" in heads)
    sentence_encoder = settings.init_from is not None and (Path(settings.init_from) / "modules.json").is_file()
    if sentence_encoder and "mlm" not in heads and steps is not None:
        _warn_short_adaptation(settings, steps * (config.global_batch_size or recipe.batch_size))
    if rate is not None:
        shape = f"{length} tokens x {share}" + (f" (each of {world_size} processes' share of {short.batch_size})"
                                                if world_size > 1 else "")
        recipe = dataclasses.replace(recipe, reason=f"{recipe.reason}; {rate:.2f} steps/s measured at {shape} on "
                                                    "this machine")
    return recipe


def _warn_short_adaptation(settings: PretrainSettings, sequences: float) -> None:
    """Warn when a sentence-transformers encoder released without its MLM head is continued for fewer passes
    over the data than the continue recipe's CONTINUE_PASSES: measured on all-MiniLM-L6-v2, 0.4 passes lost
    accuracy where 6 gained (docs/pretraining.md, "Domain adaptation")."""
    passes = sequences / max(len(PretrainingDataset(settings.data)), 1)
    if passes < CONTINUE_PASSES:
        logger.warning("--init-from %s is a sentence-transformers encoder released without its masked-LM head, and "
                       "this run takes %.1f passes over the data: on all-MiniLM-L6-v2, 0.4 passes lowered the "
                       "fine-tuned accuracy (-2.8 points) and %d passes raised it (+4.6), each at its best rate "
                       "(docs/pretraining.md, \"Domain adaptation\"); leave out --max-steps and --max-time for "
                       "%d passes, or fine-tune the encoder directly", settings.init_from, passes, CONTINUE_PASSES,
                       CONTINUE_PASSES)


def continue_budget(settings: PretrainSettings, global_batch_size: int | None) -> int | None:
    """The --max-steps of a run given neither --max-steps nor --max-time: when it continues a checkpoint made
    elsewhere (`--recipe continue`, or `auto` with such an --init-from), the continue recipe's passes over the
    data (`continue_steps`), said in one line; None for any other run (which must give a budget)."""
    if settings.init_from is None or settings.recipe not in ("auto", "continue"):
        return None
    if settings.recipe == "auto" and _init_kind(settings.init_from) != "released":
        return None
    instances = len(PretrainingDataset(settings.data))
    steps, batch = continue_steps(instances, global_batch_size)
    logger.info("no --max-steps or --max-time: continued pre-training takes %d passes over the %s instances of %s "
                "at a global batch of %d: %s steps (give --max-steps or --max-time to choose)",
                round(steps * batch / max(instances, 1)), f"{instances:,}", settings.data, batch, f"{steps:,}")
    return steps


def _init_kind(init_from: str | None) -> str | None:
    """None (no --init-from), "short" (a bertkit run of fewer than PAPER_MIN_STEPS steps, by its
    bertkit_pretraining.json) or "released" (pre-trained elsewhere, or by bertkit to convergence)."""
    if init_from is None:
        return None
    history = pretraining_history(read_json_object(Path(init_from) / PRETRAINING_FILE, missing={}, damaged={}))
    return "short" if history.get("steps", PAPER_MIN_STEPS) < PAPER_MIN_STEPS else "released"


def _checkpoint_heads(directory: Path) -> set[str]:
    """The pre-training heads the checkpoint in `directory` holds: "nsp" (cls.seq_relationship), "mlm"
    (cls.predictions.transform)."""
    single = directory / SAFETENSORS_NAME
    names = safetensors_shapes(single) if single.is_file() else read_state_dict(directory)
    prefixes = {"nsp": "cls.seq_relationship.", "mlm": "cls.predictions.transform."}
    return {head for head, prefix in prefixes.items() if any(name.startswith(prefix) for name in names)}


def _model_config(settings: PretrainSettings) -> BertConfig:
    if settings.init_from is not None:
        return BertConfig.from_json_file(Path(settings.init_from) / "config.json")
    return load_config(settings.model)


def _resumed_recipe(settings: PretrainSettings) -> PretrainRecipe | None:
    """The recipe a run being resumed applied (from its pretrain_settings.json), or None."""
    recipe = read_json_object(Path(settings.output) / "pretrain_settings.json", missing={}, damaged={}).get("recipe")
    fields = dataclasses.fields(PretrainRecipe)
    required = {f.name for f in fields if f.default is dataclasses.MISSING}
    if not isinstance(recipe, dict) or not required <= set(recipe) <= {f.name for f in fields}:
        return None  # (a record from before a field with a default was added still counts)
    return dataclasses.replace(PretrainRecipe(**recipe), reason="as the run being resumed chose")


def measure_steps_per_second(config: BertConfig, seq_len: int, batch_size: int, precision: str, device: str,
                             seconds: float = 1.5, masked_lm_prob: float = 0.15) -> float:
    """Optimizer steps per second of pre-training this model on this machine (MLM + NSP on a random batch of
    (batch_size, seq_len) with `masked_lm_prob` of positions predicted - the MLM head's cost grows with them;
    see bertkit.train.throughput)."""
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(5, config.vocab_size, (batch_size, seq_len), generator=generator)
    labels = torch.where(torch.rand(batch_size, seq_len, generator=generator) < masked_lm_prob, ids, IGNORE_INDEX)
    batch = {"input_ids": ids, "token_type_ids": torch.zeros_like(ids), "attention_mask": torch.ones_like(ids),
             "mlm_labels": labels, "nsp_labels": torch.zeros(batch_size, dtype=torch.int64)}
    config = config.replace(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return training_steps_per_second(lambda: BertForPreTraining(config), pretraining_loss, batch, precision,
                                     resolve_device(device), seconds)
