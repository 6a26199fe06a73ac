"""`bertkit pretrain`'s run plan: every decision of a pre-training run, made once, before a model is built.

    plan_pretraining(settings, train, ctx) -> PretrainPlan     the one resolution step of `pretrain`

Design decision: the run's inputs are read once (`DataFacts`: the data directory's manifest; `InitFacts`: the
--init-from directory's config, lineage, heads), and everything the run decides from them and from this machine
is resolved here, in this order, into one frozen `PretrainPlan` that the run reads and pretrain_settings.json
records: the threads (applied here, so a library call with `threads=1` runs on one thread); the budget (a
checkpoint made elsewhere, continued with no budget given, takes the continue recipe's passes); `--compile`
(on a GPU); the precision (`auto` measured once, at the shape the recipe plans with, and that answer is what
the recipe's throughput measurement and the run both use); the recipe (chosen from the budget and the measured
rate, applied by `recipes.apply_recipe` to every setting left unset); the GPU step (`prepare.plan_step`). Rank 0
reads and measures; every rank applies its answers.

References: Devlin et al. 2018 (appendix A.2); bertkit.workflows.recipes for the recipes themselves.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bertkit.config import BertConfig, load_config
from bertkit.data import PretrainingDataset, collate_pretraining
from bertkit.errors import BertkitError
from bertkit.inference.positions import PRETRAINING_FILE
from bertkit.io.bounded import file_present
from bertkit.io.jsonfile import read_json_object
from bertkit.model import BertForPreTraining, read_state_dict
from bertkit.model.accelerate import cpu_kernels_enabled, train_as_measured
from bertkit.model.pretrained import SAFETENSORS_NAME, safetensors_shapes
from bertkit.runtime import probe
from bertkit.runtime.device import apply_threads, resolve_device, resolve_precision
from bertkit.settings import PretrainSettings, TrainConfig
from bertkit.tasks.pretraining import IGNORE_INDEX, pretraining_loss
from bertkit.train.cadence import NO_BUDGET
from bertkit.train.distributed import DistributedContext, rank0_decides
from bertkit.train.throughput import training_steps_per_second
from bertkit.workflows.prepare import StepPlan, apply_fill_gate, plan_step
from bertkit.workflows.recipe_notes import long_input_note, vocabulary_note
from bertkit.workflows.recipes import (
    CONTINUE_PASSES,
    PAPER_MIN_STEPS,
    DataShape,
    PretrainRecipe,
    apply_recipe,
    budget_steps,
    choose_recipe,
    continue_recipe,
    continue_steps,
    library_defaults,
    pretraining_history,
    short_recipe,
)

logger = logging.getLogger(__name__)
RESUMED_REASON = "as the run being resumed chose"
"""The recipe reason of a resumed run (its recipe read back from pretrain_settings.json)."""
SETTINGS_FILE = "pretrain_settings.json"
"""The run's record in its output directory: settings and TrainConfig as resolved, the recipe, the step plan."""


@dataclass(frozen=True)
class DataFacts:
    """A pre-training data directory, read once."""

    directory: str
    instances: int
    dynamic: bool
    nsp: bool
    layout: str
    built_seq_length: int
    masked_lm_prob: float
    """The rate the data was built with (static data's own; dynamic data's default)."""
    vocab_size: int

    @classmethod
    def read(cls, directory: str) -> DataFacts:
        data = PretrainingDataset(directory)
        return cls(str(directory), len(data), data.dynamic, data.nsp, data.layout, data.built_seq_length,
                   float(data.options["masked_lm_prob"]), int(data.manifest["tokenizer"]["vocab_size"]))

    def shape(self) -> DataShape:
        return DataShape(self.directory, self.dynamic, self.nsp, self.layout, self.built_seq_length)

    def trained(self, settings: PretrainSettings) -> int:
        """Instances trained on: all, less the held-out ones when they come from this data (`split_held_out`)."""
        held_out = 0 if settings.eval_data is not None else min(settings.eval_examples, self.instances // 10)
        return self.instances - held_out


@dataclass(frozen=True)
class InitFacts:
    """An --init-from directory, read once: its config, what bertkit recorded of its pre-training, its heads."""

    directory: str
    config: BertConfig
    kind: str
    """"short" (a bertkit run of fewer than PAPER_MIN_STEPS steps) or "released" (pre-trained elsewhere, or by
    bertkit to convergence)."""
    heads: frozenset[str]
    """The pre-training heads it holds: "nsp" (cls.seq_relationship), "mlm" (cls.predictions.transform)."""
    sentence_encoder: bool
    """A sentence-transformers directory (modules.json)."""

    @classmethod
    def read(cls, directory: str) -> InitFacts:
        path = Path(directory)
        history = pretraining_history(read_json_object(path / PRETRAINING_FILE, missing={}, damaged={}))
        kind = "short" if history.get("steps", PAPER_MIN_STEPS) < PAPER_MIN_STEPS else "released"
        single = path / SAFETENSORS_NAME
        names = safetensors_shapes(single) if file_present(single) else read_state_dict(path)
        prefixes = {"nsp": "cls.seq_relationship.", "mlm": "cls.predictions.transform."}
        heads = frozenset(head for head, prefix in prefixes.items() if any(n.startswith(prefix) for n in names))
        return cls(str(directory), BertConfig.from_json_file(path / "config.json"), kind, heads,
                   file_present(path / "modules.json"))


@dataclass(frozen=True)
class PretrainPlan:
    """Everything a pre-training run decided, resolved (`plan_pretraining`)."""

    settings: PretrainSettings
    train: TrainConfig
    recipe: PretrainRecipe | None
    step: StepPlan
    data: DataFacts
    init: InitFacts | None

    def record(self, world_size: int) -> dict[str, Any]:
        """pretrain_settings.json's content."""
        return {"settings": dataclasses.asdict(self.settings), "train": dataclasses.asdict(self.train),
                "world_size": world_size,
                "batch": dict(zip(("global", "micro", "accumulation"), self.train.batch_plan(world_size))),
                "recipe": dataclasses.asdict(self.recipe) if self.recipe else None,
                "step": dataclasses.asdict(self.step)}


def plan_pretraining(settings: PretrainSettings, train: TrainConfig, ctx: DistributedContext) -> PretrainPlan:
    """The run plan of `pretrain(settings, train)` (module docstring: what is decided, in which order)."""
    apply_threads(train.threads)
    data = rank0_decides(lambda: DataFacts.read(settings.data), ctx)
    init = rank0_decides(lambda: InitFacts.read(settings.init_from) if settings.init_from else None, ctx)
    train = _with_budget(settings, train, data, init, ctx)
    train = _compile_by_default(train, ctx)
    model_config = (init.config if init else load_config(settings.model)).replace(vocab_size=data.vocab_size)
    rows, length = _planning_shape(settings, train, data, init, model_config, ctx.world_size)
    measured_config = _planning_dropout(settings, init, model_config)
    if train.precision == "auto":  # measured once, here; the recipe's rate and the run both use the answer
        precision = rank0_decides(lambda: resolve_precision("auto", ctx.device, _as_run(measured_config, ctx.device),
                                                            rows, length), ctx)
        train = dataclasses.replace(train, precision=precision)
    recipe = None
    if settings.recipe is None:
        settings, train = library_defaults(settings, train)
    else:
        recipe = rank0_decides(lambda: (_resumed_recipe(settings) if settings.resume else None)
                               or _choose(settings, train, data, init, measured_config, (rows, length),
                                          ctx.world_size),
                               ctx)
        settings, train = _applied(recipe, settings, train, data, ctx, continued=init is not None)
    return PretrainPlan(settings, train, recipe, plan_step(train, ctx.device), data, init)


def _applied(recipe: PretrainRecipe, settings: PretrainSettings, train: TrainConfig, data: DataFacts,
             ctx: DistributedContext, continued: bool = False) -> tuple[PretrainSettings, TrainConfig]:
    """The recipe applied to every setting left unset; the choice said in one line."""
    batch = "batch_size" if train.batch_size is not None else "global_batch_size"  # as the user spelled it
    given = [name for name, value in (("max_seq_length", settings.max_seq_length), ("dropout", settings.dropout),
                                      ("masked_lm_prob", settings.masked_lm_prob), ("nsp", settings.nsp),
                                      ("learning_rate", train.learning_rate), ("warmup_ratio", train.warmup_ratio),
                                      (batch, train.global_batch_size or train.batch_size),
                                      ("head_warmup_steps", train.head_warmup_steps),
                                      ("full_length_share", settings.full_length_share),
                                      ("full_length_placement", settings.full_length_placement),
                                      ("mlm_bias_init", settings.mlm_bias_init)) if value is not None]
    settings, train, notes = apply_recipe(recipe, settings, train, data.shape(), ctx.world_size)
    if ctx.is_main:
        logger.info("recipe %s (%s): %s%s%s", recipe.name, recipe.reason, recipe.describe(),
                    f"; your flags kept: {', '.join(given)}" if given else "", "".join(f"; {n}" for n in notes))
        cut = settings.max_seq_length or data.built_seq_length
        warnings = {section: note for section, note in (
            ("Every position a fine-tuning reads", long_input_note(recipe, cut, data.built_seq_length)),
            ("The vocabulary the short recipe was measured with",
             vocabulary_note(recipe, data.vocab_size, cut, data.built_seq_length, continued))) if note}
        if warnings and recipe.reason == RESUMED_REASON:  # said in full when a run starts; a resume names it
            logger.info("a resume does not repeat the warning%s a start with these settings gives about the inputs "
                        "you will fine-tune on (docs/pretraining.md, %s)", "s" if len(warnings) > 1 else "",
                        "; ".join(f'"{section}"' for section in warnings))
        else:
            for note in warnings.values():
                logger.warning("%s", note)
    return settings, train


def _with_budget(settings: PretrainSettings, train: TrainConfig, data: DataFacts, init: InitFacts | None,
                 ctx: DistributedContext) -> TrainConfig:
    """`train`, with --max-steps set when no budget was given and the run continues a checkpoint made elsewhere
    (`--recipe continue`, or `auto` with such an --init-from): the continue recipe's passes over the instances it
    trains on, said in one line. Any other run without a budget is TrainConfig.check's refusal."""
    if train.max_steps is not None or train.max_time_s is not None or train.num_epochs is not None:
        return train
    if init is None or settings.recipe not in ("auto", "continue") or (settings.recipe == "auto"
                                                                      and init.kind != "released"):
        raise BertkitError(NO_BUDGET)  # a run from random weights, or from a short bertkit run: nothing is guessed
    instances = data.trained(settings)
    steps, batch = continue_steps(instances, train.global_batch_size or train.batch_size)
    if ctx.is_main:
        logger.info("no --max-steps or --max-time: continued pre-training takes %d passes over the %s instances of "
                    "%s it trains on (those held out for evaluation left out) at a global batch of %d: %s steps "
                    "(give --max-steps or --max-time to choose)", round(steps * batch / max(instances, 1)),
                    f"{instances:,}", data.directory, batch, f"{steps:,}")
    return dataclasses.replace(train, max_steps=steps)


def _compile_by_default(train: TrainConfig, ctx: DistributedContext) -> TrainConfig:
    """--compile unset: compiled on a GPU (it pays there: docs/performance.md, "The GPU step"), eager on a CPU."""
    if train.compile is not None:
        return train
    if ctx.device.type == "cuda" and ctx.is_main:
        logger.info("compiling the training step (the default on a GPU; --no-compile runs it eagerly)")
    return dataclasses.replace(train, compile=ctx.device.type == "cuda")


def _planning_shape(settings: PretrainSettings, train: TrainConfig, data: DataFacts, init: InitFacts | None,
                    config: BertConfig, world_size: int) -> tuple[int, int]:
    """(rows, tokens) of each process's micro-batch as the run will most likely have it: the shape the precision
    is measured at and a time budget's rate. A checkpoint made elsewhere is continued at the data's length, a
    short budget at the short recipe's 64 tokens; the rows are `_planned_batch`'s."""
    short = short_recipe(config.hidden_size)
    assert short.max_seq_length is not None  # the short recipe fixes it
    length = settings.max_seq_length or (data.built_seq_length if _continuing(settings, init)
                                        else min(short.max_seq_length, data.built_seq_length))
    return _planned_batch(settings, train, init, config, world_size)[0], length


def _continuing(settings: PretrainSettings, init: InitFacts | None) -> bool:
    """Whether the run will most likely take the continue recipe (asked for, or a checkpoint made elsewhere)."""
    return settings.recipe == "continue" or (init is not None and init.kind == "released")


def _planned_batch(settings: PretrainSettings, train: TrainConfig, init: InitFacts | None, config: BertConfig,
                   world_size: int) -> tuple[int, int]:
    """(micro-batch rows of each process, micro-batches an optimizer step) as the run will most likely split its
    global batch: the flags' global batch, else the recipe's (the continue recipe's 32, the short recipe's 16), split
    by the flags' micro-batch or accumulation where given, else one micro-batch a process (rounded up)."""
    recipe = continue_recipe(config.hidden_size, True, None) if _continuing(settings, init) \
        else short_recipe(config.hidden_size)
    if train.micro_batch_size is None and train.gradient_accumulation_steps is None:
        given = train.global_batch_size or train.batch_size
        return -(-(given or recipe.batch_size) // world_size), 1
    if train.global_batch_size is None and train.batch_size is None:
        train = dataclasses.replace(train, global_batch_size=recipe.batch_size)
    _, micro, accumulation = train.batch_plan(world_size)
    return micro, accumulation


def _planning_dropout(settings: PretrainSettings, init: InitFacts | None, config: BertConfig) -> BertConfig:
    """`config` with the dropout the run will most likely train with, for the measurements made before the recipe is
    chosen (attention dropout decides which CPU attention kernel runs): --dropout when given, else the short recipe's
    (none) where the budget will most likely get it (the shape `_planning_shape` assumes), else the config's."""
    continuing = _continuing(settings, init)
    dropout = settings.dropout
    if dropout is None and settings.recipe in ("auto", "short") and not continuing:
        dropout = short_recipe(config.hidden_size).dropout
    if dropout is None:
        return config
    return config.replace(hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)


def _choose(settings: PretrainSettings, train: TrainConfig, data: DataFacts, init: InitFacts | None,
            config: BertConfig, shape: tuple[int, int], world_size: int) -> PretrainRecipe:
    """The recipe for the budget: a time budget is turned into steps at the throughput measured here at `shape`
    in the run's resolved precision (the all-reduce's cost is not measured, so on many processes this is an upper
    bound on the rate)."""
    rate = None
    if settings.recipe in ("auto", "continue", "short") and train.max_time_s:  # short: its objective follows the steps
        rate = measure_steps_per_second(config, shape[1], shape[0], train.precision, train.device, dropout=None,
                                        masked_lm_prob=_masking(settings, data, init, config), data=data)
        rate /= _planned_batch(settings, train, init, config, world_size)[1]  # micro-batches an optimizer step
    steps = budget_steps(train.max_steps, train.max_time_s, rate)
    assert settings.recipe is not None  # plan_pretraining chooses only when one is asked for
    heads = init.heads if init is not None else frozenset({"nsp", "mlm"})
    recipe = choose_recipe(settings.recipe, config.hidden_size, steps, init.kind if init else None, "nsp" in heads,
                           "mlm" in heads)
    if init is not None and init.sentence_encoder and "mlm" not in heads and steps is not None:
        _warn_short_adaptation(settings, data, steps * (train.global_batch_size or recipe.batch_size))
    if rate is not None:
        where = f"{shape[1]} tokens x {shape[0]}" + (f" (each of {world_size} processes' share)" if world_size > 1
                                                     else "")
        on = "the data's instances" if data.instances else "random rows"
        recipe = dataclasses.replace(recipe, reason=f"{recipe.reason}; {rate:.2f} steps/s measured on {on} at {where} "
                                                    "on this machine")
    return recipe


def _masking(settings: PretrainSettings, data: DataFacts, init: InitFacts | None, config: BertConfig) -> float:
    """The share of positions the run will predict (the MLM head's cost grows with it): static data's own."""
    if not data.dynamic:
        return data.masked_lm_prob
    recipe = continue_recipe(config.hidden_size, True, None) if _continuing(settings, init) \
        else short_recipe(config.hidden_size)
    return settings.masked_lm_prob or recipe.masked_lm_prob or data.masked_lm_prob


def _warn_short_adaptation(settings: PretrainSettings, data: DataFacts, sequences: float) -> None:
    """Warn when a sentence-transformers encoder released without its MLM head is continued for fewer passes
    over the data than the continue recipe's CONTINUE_PASSES: measured on all-MiniLM-L6-v2, 0.4 passes lost
    accuracy where 6 gained (docs/pretraining.md, "Domain adaptation")."""
    passes = sequences / max(data.trained(settings), 1)
    if passes < CONTINUE_PASSES:
        logger.warning("--init-from %s is a sentence-transformers encoder released without its masked-LM head, and "
                       "this run takes %.1f passes over the data: on all-MiniLM-L6-v2, 0.4 passes lowered the "
                       "fine-tuned accuracy (-2.8 points) and %d passes raised it (+4.6), each at its best rate "
                       "(docs/pretraining.md, \"Domain adaptation\"); leave out --max-steps and --max-time for "
                       "%d passes, or fine-tune the encoder directly", settings.init_from, passes, CONTINUE_PASSES,
                       CONTINUE_PASSES)


def _resumed_recipe(settings: PretrainSettings) -> PretrainRecipe | None:
    """The recipe a run being resumed applied (from its pretrain_settings.json), or None."""
    recipe = read_json_object(Path(settings.output) / SETTINGS_FILE, missing={}, damaged={}).get("recipe")
    fields = dataclasses.fields(PretrainRecipe)
    required = {f.name for f in fields if f.default is dataclasses.MISSING}
    if not isinstance(recipe, dict) or not required <= set(recipe) <= {f.name for f in fields}:
        return None  # (a record from before a field with a default was added still counts)
    return dataclasses.replace(PretrainRecipe(**recipe), reason=RESUMED_REASON)


def measure_steps_per_second(config: BertConfig, seq_len: int, batch_size: int, precision: str, device: str,
                             seconds: float = 1.5, masked_lm_prob: float = 0.15, dropout: float | None = 0.0,
                             data: DataFacts | None = None) -> float:
    """Optimizer steps per second of pre-training this model on this machine (MLM + NSP) at batches of
    (batch_size, seq_len): with `data`, MEASURED_BATCHES of its own instances cut to seq_len, in turn, each timed
    at least once (their padding changes what a step costs, either way, and which CPU attention kernel runs);
    without, one batch of random full rows. `masked_lm_prob` of positions are predicted (dynamic data and random
    rows; static data keeps its own); `dropout`, the short recipe's none by default, None for the config's, decides
    the CPU attention kernel too (bertkit.train.throughput). One micro-batch a step: the caller divides by the
    accumulation steps."""
    if dropout is not None:
        config = config.replace(hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    where = resolve_device(device)
    batches = (_data_batches(data, seq_len, batch_size, masked_lm_prob) if data is not None and data.instances
               else [_random_batch(config.vocab_size, seq_len, batch_size, masked_lm_prob)])
    return training_steps_per_second(lambda: _as_run(config, where, (precision, batch_size, seq_len)),
                                     pretraining_loss, batches, precision, where, seconds)


MEASURED_BATCHES = 8
"""Batches of the run's own data a throughput measurement cycles through (their fills differ)."""


def _data_batches(data: DataFacts, seq_len: int, batch_size: int, masked_lm_prob: float) -> list[dict]:
    """MEASURED_BATCHES batches of `data`'s instances at `seq_len` tokens, drawn with a fixed seed (the same
    instances every time; nothing of the run's RNG is used), padded to each batch's longest with the data's pad id,
    as a CPU run pads them (a static-shape GPU run pads to the length: the model unpads either way)."""
    loading = {"masked_lm_prob": masked_lm_prob} if data.dynamic else {}
    dataset = PretrainingDataset(data.directory, max_seq_length=seq_len, **loading)
    count = MEASURED_BATCHES * batch_size
    indices = np.random.default_rng(0).choice(len(dataset), count, replace=count > len(dataset))
    items = [dataset[int(index)] for index in indices]
    pad = int(dataset.manifest["tokenizer"]["special_token_ids"]["pad"])
    return [collate_pretraining(items[start:start + batch_size], pad) for start in range(0, count, batch_size)]


def _random_batch(vocab_size: int, seq_len: int, batch_size: int, masked_lm_prob: float) -> dict:
    """One batch of random full rows, `masked_lm_prob` of positions predicted."""
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(5, vocab_size, (batch_size, seq_len), generator=generator)
    labels = torch.where(torch.rand(batch_size, seq_len, generator=generator) < masked_lm_prob, ids, IGNORE_INDEX)
    return {"input_ids": ids, "token_type_ids": torch.zeros_like(ids), "attention_mask": torch.ones_like(ids),
            "mlm_labels": labels, "nsp_labels": torch.zeros(batch_size, dtype=torch.int64)}


def _as_run(config: BertConfig, device: torch.device, step: tuple[str, int, int] | None = None) -> BertForPreTraining:
    """A model of `config` that attends as the run's will on `device` (the CPU's measured attention for training,
    `prepare.use_measured_kernels`; given the run's (precision, rows, length), its measured fill gate too:
    `prepare.apply_fill_gate`), for the measurements the plan makes before the run's model exists."""
    model = BertForPreTraining(config)
    if device.type == "cpu" and cpu_kernels_enabled():
        train_as_measured(model, probe.choices(config.hidden_size))
        if step is not None:
            apply_fill_gate(model, *step)
    return model
