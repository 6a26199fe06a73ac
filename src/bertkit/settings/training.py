"""The settings of training: the loop's run description (`TrainConfig`), what `bertkit pretrain` trains
(`PretrainSettings`, beside its TrainConfig), how `bertkit finetune` trains (`FinetuneSettings`, which holds a
TrainConfig with fine-tuning's defaults) and what `bertkit glue` sweeps (`GlueSettings`).

Design decision: one description of a training run. Every setting of the loop (budget, optimiser, precision,
cadence, batch sizes) and of where it computes (device, threads, compile) is a field of TrainConfig, once, with
one name and one help text; a command that trains holds a TrainConfig with the defaults of its recipe
(`finetune_training()`: the paper's fine-tuning recipe) rather than re-declaring its fields. What a command
derives from the run description (fine-tuning's evaluation every epoch and its per-seed checkpoints) it derives
with `dataclasses.replace`, never by copying fields one by one.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from bertkit.errors import BertkitError
from bertkit.settings.fields import PRECISIONS, DeviceChoice, Settings, TorchThreads, flag_of, sequence_length_field
from bertkit.settings.rules import PRETRAINING_ONLY, RESUME_EXACT_SETTINGS

OPTIMIZERS = ("adamw", "lamb")
"""The values of --optimizer (bertkit.train.optim.build_optimizer)."""
LR_SCHEDULES = ("linear", "cosine", "constant-with-warmup", "inverse-sqrt")
"""The values of --lr-schedule (bertkit.train.optim.SCHEDULES)."""
FEATURE_COMBINES = ("concat", "sum", "mean")
"""How a feature-based head combines the hidden states of --feature-layers (bertkit.model.feature_based)."""
RANDOM_INIT_COMPARISONS = ("auto", "on", "off")
"""The values of `finetune --compare-random-init` (bertkit.workflows.random_init: auto compares where pre-training was
measured to lose, bertkit.workflows.recipe_notes.random_init_comparison)."""
MLM_BIAS_INITS = ("unigram", "zeros")
"""The values of `pretrain --mlm-bias-init`: how a newly initialised MLM decoder bias starts
(bertkit.workflows.pretrain: unigram the training data's log word frequencies, zeros Google's)."""
RECIPES = ("auto", "paper", "short", "continue")
"""The values of --recipe (bertkit.workflows.recipes: auto picks paper or short from the budget, continue with
--init-from)."""

DEFAULT_GLOBAL_BATCH_SIZE = 32
"""Examples per optimizer step when no batch size is given (the paper's fine-tuning batch)."""


@dataclass(kw_only=True)
class BatchSizes(Settings):
    """One batch vocabulary for every training command (`pretrain`, `finetune`), as litgpt's and the
    Trainer's users know it: the global batch (examples per optimizer step, all processes together) and the
    micro-batch (examples per forward/backward pass on one process); the accumulation follows from them and
    the number of processes: global = micro x accumulation x processes (`batch_plan`)."""

    global_batch_size: int | None = dataclasses.field(default=None, metadata={"min": 1})
    """Examples per optimizer step, all processes and accumulation steps together; unset: 32, or
    micro-batch size x accumulation steps x processes when --micro-batch-size is given."""
    micro_batch_size: int | None = dataclasses.field(default=None, metadata={"min": 1})
    """Examples per forward/backward pass on each process; unset: the global batch / (accumulation steps
    x processes)."""
    gradient_accumulation_steps: int | None = dataclasses.field(default=None, metadata={"min": 1})
    """Micro-batches per optimizer step on each process; unset: the global batch / (micro-batch size x
    processes), or 1 when only one of the two sizes is given."""
    batch_size: int | None = dataclasses.field(default=None, metadata={"min": 1})
    """The older spelling, accepted where the global batch and the micro-batch are the same (one process,
    no accumulation); elsewhere use --global-batch-size or --micro-batch-size."""

    def batch_plan(self, world_size: int) -> tuple[int, int, int]:
        """(global batch, micro-batch, accumulation steps) for `world_size` processes; raises BertkitError
        naming the flags when the sizes given cannot hold together."""
        total, micro, steps = self.global_batch_size, self.micro_batch_size, self.gradient_accumulation_steps
        if self.batch_size is not None:
            total, micro = _legacy_batch_size(self.batch_size, total, micro, steps, world_size)
        if total is None and micro is None:
            total = DEFAULT_GLOBAL_BATCH_SIZE
        if total is None:
            assert micro is not None  # one of the two is set by now
            steps = steps or 1
            return micro * steps * world_size, micro, steps
        if micro is None:
            steps = steps or 1
            if total % (steps * world_size):
                raise BertkitError(
                    f"--global-batch-size {total} does not split evenly into {world_size} process(es) x {steps} "
                    f"accumulation step(s); give a multiple of {steps * world_size}, or --micro-batch-size")
            return total, total // (steps * world_size), steps
        derived, remainder = divmod(total, micro * world_size)
        if remainder or derived == 0:
            raise BertkitError(f"--global-batch-size {total} is not a multiple of --micro-batch-size {micro} x "
                               f"{world_size} process(es); change one of them")
        if steps is not None and steps != derived:
            raise BertkitError(f"--gradient-accumulation-steps {steps} contradicts --global-batch-size {total} = "
                               f"--micro-batch-size {micro} x {world_size} process(es) x {derived}; give two of "
                               "the three")
        return total, micro, derived


def _legacy_batch_size(size: int, total: int | None, micro: int | None, steps: int | None,
                       world_size: int) -> tuple[int, int]:
    """--batch-size as (global, micro), where the two meanings it had (examples per optimizer step in
    `finetune`, per forward pass on each process in `pretrain`) are the same number."""
    if total is not None or micro is not None:
        raise BertkitError("--batch-size is the older spelling of --global-batch-size/--micro-batch-size; "
                           "give those alone")
    if (steps or 1) * world_size != 1:
        raise BertkitError(f"--batch-size {size} is ambiguous with {world_size} process(es) x {steps or 1} "
                           "accumulation step(s): give --global-batch-size (examples per optimizer step, all "
                           "processes) or --micro-batch-size (examples per forward pass on each process)")
    return size, size



@dataclass
class TrainConfig(BatchSizes, DeviceChoice, TorchThreads):
    """Everything that shapes an optimisation run and where it computes (the model and data are given
    separately). The workflow resolves what is decided on the machine (`precision` auto, `learning_rate`
    unset) before `bertkit.train.fit` runs it."""

    max_steps: int | None = None
    """Optimizer steps to train for (with a time or epoch budget too: whichever ends first)."""
    max_time_s: float | None = dataclasses.field(default=None, metadata={"flag": "--max-time"})
    """Training time budget in seconds, counted across resumes (on the command line e.g. 2h, 90m or 1h30m);
    the schedule follows it."""
    num_epochs: float | None = dataclasses.field(default=None, metadata={"flag": "--epochs"})
    """Budget in passes over the training data; converted to steps."""
    learning_rate: float | None = None
    """Peak learning rate, reached at the end of warmup; unset: the command's rule decides and prints it (pre-
    training: the recipe; fine-tuning: the model's width, depth and pre-training). `fit` needs it set."""
    warmup_steps: int | None = None
    """Linear warmup length in optimizer steps; unset: --warmup-ratio of the budget."""
    warmup_ratio: float | None = None
    """Warmup as a fraction of the budget (of the steps, or of the time under a time budget alone); unset: the
    command's (pre-training: the recipe's; fine-tuning: 10%); `fit` alone: none."""
    lr_schedule: str = dataclasses.field(default="linear", metadata={"choices": LR_SCHEDULES})
    """Learning rate after the warmup: linear or cosine decay to 0 at the end of the budget, constant, or
    inverse square root."""
    head_warmup_steps: int | None = None
    """Optimizer steps at the start during which only the heads train (the encoder's learning rate is 0, its
    weights unchanged), then everything: a new head first learns to read the encoder instead of sending its
    noise into it. 0: everything trains from the first step; unset: pre-training's recipe decides (continuing a
    checkpoint released without its MLM head), elsewhere 0."""
    encoder_lr_ratio: float = 1.0
    """The encoder's learning rate as a fraction of the heads' (1: one learning rate for all)."""
    weight_decay: float = 0.01
    """Decoupled weight decay (not on biases and LayerNorm parameters)."""
    betas: tuple[float, float] = (0.9, 0.999)
    """Adam beta1, beta2."""
    adam_epsilon: float = 1e-6
    """AdamW/LAMB epsilon (pre-training: 1e-6 as the original BERT optimizer; fine-tuning: 1e-8 as transformers'
    Trainer, which measured the same on docs/finetuning.md's parity task)."""
    max_grad_norm: float = 1.0
    """Clip the global gradient norm to this; 0 disables clipping (the norm is still checked)."""
    optimizer: str = dataclasses.field(default="adamw", metadata={"choices": OPTIMIZERS})
    """AdamW, or LAMB for very large batches."""
    precision: str = dataclasses.field(default="auto", metadata={"choices": PRECISIONS})
    """auto: the faster of fp32 and bf16 as measured on this machine (`bertkit doctor`; bf16 on GPUs that
    support it); bf16 autocast (CPU or CUDA); fp16 autocast with a grad scaler (CUDA only)."""
    seed: int = 42
    """Seed of initialisation, data order, masking and dropout (each rank adds its rank)."""
    shuffle: bool = True
    """Shuffle the data every epoch (from seed and epoch)."""
    num_workers: int = dataclasses.field(default=0, metadata={"min": 0})
    """DataLoader worker processes per training process."""
    log_every: int | None = 10
    """Refresh the progress bar every this many steps (metrics.jsonl gets every step); unset: ten times per
    epoch or per --eval-every interval, whichever is shorter."""
    read_every: int | None = None
    """Bring the steps' loss and metrics back to the host every this many steps (each read waits for the device;
    in between a GPU runs ahead of the host, a non-finite step is still skipped on the device, and a stop signal
    or a time budget takes effect at the next read); unset: every step on a CPU, every --log-every steps on a
    GPU. Evaluations, saves and the end of a step budget always read first."""
    eval_every: int | None = None
    """Held-out evaluation every this many steps and at the end; unset: only at the end (and each epoch
    with --eval-every-epoch)."""
    eval_every_epoch: bool = False
    """Held-out evaluation at the end of every epoch too (every epoch's worth of optimizer steps)."""
    save_every: int | None = 1000
    """Checkpoint every this many steps (also on SIGTERM/SIGINT and at the end); unset: only then (and at
    evaluations with --save-on-eval)."""
    save_on_eval: bool = False
    """Checkpoint after every evaluation too, so a resumed run continues from its last evaluation."""
    keep_last: int = 3
    """Checkpoints kept on disk (older ones are deleted)."""
    max_nonfinite_steps: int = 10
    """Stop with an error after this many consecutive steps with a non-finite loss or gradient norm."""
    best_metric: str | None = None
    """Eval metric whose improvement calls on_best (e.g. 'accuracy'); None: no best tracking."""
    greater_is_better: bool = True
    """Direction of best_metric."""
    early_stopping_patience: int | None = None
    """Stop after this many evaluations in a row without a new best of best_metric; unset: never."""
    allow_change: tuple[str, ...] = dataclasses.field(default=(), metadata={"choices": RESUME_EXACT_SETTINGS})
    """On resume, accept a new value of this setting although the run is then no longer exact (repeat for
    several); the learning rate, budget, cadence, warmup and schedule may change without it and apply from
    the next step (a fine-tuning's unfinished seeds; bertkit.settings.rules)."""
    compile: bool | None = None
    """torch.compile the training step (a one-off compilation: pre-training compiles its whole step, the
    fine-tuning commands their encoder layers); unset: on a GPU yes, on a CPU no (where it pays:
    docs/performance.md)."""
    cuda_graphs: bool = False
    """Pre-training on a GPU with --compile: replay the compiled step's kernels from a CUDA graph (batches with
    padding run without one). Measured slower so far (docs/performance.md): for measurement."""
    fused_kernels: bool | None = None
    """Pre-training: fused Triton kernels (dropout + residual + LayerNorm with a bf16 residual stream, bias +
    GELU, the MLM loss without an fp32 copy of the logits; on a CPU their PyTorch references); unset: what
    measured faster, the LayerNorm kernel for an eager step on a GPU with Triton, none for a compiled step,
    which fuses that work itself."""
    gradient_checkpointing: bool = False
    """Recompute each encoder layer in the backward instead of keeping its activations: activation memory
    of about one layer instead of L, for more step time (docs/performance.md)."""

    def coerce_types(self) -> None:
        self.betas = tuple(self.betas)  # type: ignore[assignment]  # a list from JSON or a caller
        self.allow_change = tuple(self.allow_change)

    def check(self) -> None:
        """Raise BertkitError naming the first setting that makes no sense."""
        positive = {"max_steps": self.max_steps, "max_time_s": self.max_time_s, "num_epochs": self.num_epochs,
                    "micro_batch_size": self.micro_batch_size, "keep_last": self.keep_last,
                    "gradient_accumulation_steps": self.gradient_accumulation_steps,
                    "global_batch_size": self.global_batch_size, "batch_size": self.batch_size,
                    "learning_rate": self.learning_rate, "log_every": self.log_every, "read_every": self.read_every,
                    "eval_every": self.eval_every, "save_every": self.save_every,
                    "max_nonfinite_steps": self.max_nonfinite_steps,
                    "early_stopping_patience": self.early_stopping_patience}
        for name, value in positive.items():
            if value is not None and not value > 0:  # (also NaN)
                raise BertkitError(f"{flag_of(self, name)} must be positive, got {value!r}")
        if self.warmup_ratio is not None and not 0.0 <= self.warmup_ratio < 1.0:
            raise BertkitError(f"--warmup-ratio must be in [0, 1), got {self.warmup_ratio!r}")
        if self.warmup_steps is not None and self.warmup_steps < 0:
            raise BertkitError(f"--warmup-steps must be >= 0, got {self.warmup_steps!r}")
        if self.head_warmup_steps is not None and self.head_warmup_steps < 0:
            raise BertkitError(f"--head-warmup-steps must be >= 0, got {self.head_warmup_steps!r}")
        if not 0.0 < self.encoder_lr_ratio <= 1.0:  # (also NaN)
            raise BertkitError(f"--encoder-lr-ratio must be in (0, 1], got {self.encoder_lr_ratio!r}")

    @property
    def splits_encoder(self) -> bool:
        """Whether the encoder and the heads get learning rates of their own (separate optimizer groups)."""
        return (self.head_warmup_steps or 0) > 0 or self.encoder_lr_ratio != 1.0


def finetune_training(**changes: object) -> TrainConfig:
    """A TrainConfig with fine-tuning's defaults (the paper's recipe, appendix A.3: 3 epochs, 10% warmup, batch
    32; the learning rate chosen by the model's width and pre-training; AdamW epsilon 1e-8 as transformers'
    Trainer, which measured the same as the original optimizer's 1e-6 on docs/finetuning.md's parity task;
    checkpoints at evaluations; no torch.compile), with `changes` applied."""
    defaults: dict[str, object] = dict(num_epochs=3.0, learning_rate=None, warmup_ratio=0.1, adam_epsilon=1e-8,
                                       save_every=None, log_every=None, compile=False)
    return TrainConfig(**{**defaults, **changes})  # type: ignore[arg-type]


@dataclass
class PretrainSettings(Settings):
    """What `bertkit pretrain` trains; how (budget, optimiser, precision, device) is its TrainConfig."""

    data: str = dataclasses.field(metadata={"path": "dir"})
    """Directory written by `bertkit data pretraining`."""
    model: str
    """Preset name (bert-debug: 2 layers of width 32, for tests; bert-tiny, bert-mini, bert-small, bert-medium,
    bert-base, bert-large) or a config.json; ignored with --init-from."""
    output: str = dataclasses.field(metadata={"path": "dir"})
    """Run directory: checkpoints, metrics.jsonl, tensorboard/, curves.png, final/."""
    tokenizer: str | None = None
    """Directory with the vocab.txt the data was made with; unset: --init-from's."""
    init_from: str | None = dataclasses.field(default=None, metadata={"path": "dir"})
    """Start from the weights, config and vocabulary of this directory (continued pre-training, or phase 2
    at a longer --max-seq-length)."""
    nsp: bool | None = None
    """Next sentence prediction on/off (off: masked LM only, a BertForMaskedLM - the paper's ablation); unset:
    the recipe's (paper: on; short: off; continue: on when the checkpoint has an
    NSP head; masked-LM-only data: off)."""
    dropout: float | None = None
    """Hidden and attention dropout during pre-training; unset: the config's (0.1 in the presets).
    0 is the short-budget recipe (Geiping & Goldstein 2022): a model that sees the data about once
    gains nothing from regularisation. Fine-tuning sets its own dropout."""
    eval_data: str | None = dataclasses.field(default=None, metadata={"path": "dir"})
    """Held-out data directory; unset: hold out --eval-examples of the training data."""
    eval_examples: int = 1000
    """Instances held out of the training data for evaluation when --eval-data is not given (at most a
    tenth)."""
    resume: str | None = None
    """'auto' (newest valid checkpoint in the run directory) or a checkpoint directory."""
    overwrite: bool = False
    """Delete the checkpoints of an earlier run in the run directory and start at step 0."""
    max_seq_length: int | None = sequence_length_field(None, pairs=True)
    """Cut longer instances to this many tokens at load (Google's pair rule); unset: as the data was built."""
    masked_lm_prob: float | None = None
    """Masking rate of dynamically masked data; unset: the data's. A rate above what the data's cap on
    predictions per instance allows (set when it was built) raises that cap to rate x length."""
    full_length_share: float | None = dataclasses.field(default=None, metadata={"min": 0.0, "max": 1.0})
    """Share of the steps trained at the data's full length when --max-seq-length cuts instances shorter (positions
    past the cut are trained only by these steps); unset: the recipe's (none without a recipe)."""
    full_length_placement: str | None = dataclasses.field(default=None, metadata={"choices": ("end", "spread")})
    """Where those steps go: end (the last share of the budget, as the paper's 512-token phase) or spread (evenly
    through the run); unset: the recipe's."""
    mlm_bias_init: str | None = dataclasses.field(default=None, metadata={"choices": MLM_BIAS_INITS})
    """How a newly initialised MLM decoder bias starts (a fresh model, or --init-from without its MLM head):
    unigram - the log frequency of each word among the training data's (the run's unigram baseline), so the
    first step already predicts as word frequency alone does and the embeddings need not learn it - or zeros
    (Google's); unset: the recipe's (short: unigram; paper and continue: zeros; none without a recipe)."""
    recipe: str | None = dataclasses.field(default=None, metadata={"choices": RECIPES})
    """Fills the settings a budget decides (sequence length, learning rate, warmup, dropout, masking rate,
    NSP, batch size) that are not given (None). auto: the paper's settings when the budget allows
    ~100,000 steps, else the short-budget recipe (64 tokens, batch 16, lr 5e-4 at bert-mini's width reached
    at half the budget, no dropout, 30% dynamic masking, masked LM only); the choice and its reason are
    printed (recipes.py); each setting's own flag overrides it. None (library use): the paper's learning rate and
    warmup for those not given (recipes.library_defaults)."""

    def check(self) -> None:
        if self.dropout is not None and not 0.0 <= self.dropout < 1.0:
            raise BertkitError(f"--dropout must be in [0, 1), got {self.dropout}")


@dataclass
class FinetuneSettings(Settings):
    """How to fine-tune: the model, the run directory, the seeds and the model's fine-tuning settings; the
    training run itself is `train` (the paper's recipe as defaults, `finetune_training`)."""

    model: str
    """Checkpoint directory, or a preset name (random initialisation; needs --tokenizer)."""
    output: Path = dataclasses.field(metadata={"path": "dir"})
    """Output directory: best/ (the fine-tuned model), eval_results.json, seed-N/ while a seed trains."""
    tokenizer: str | None = None
    """Directory with vocab.txt; unset: the --model directory."""
    dropout: float = dataclasses.field(default=0.1, metadata={"min": 0.0, "max": 0.999})
    """Dropout in the encoder and before the head."""
    seeds: tuple[int, ...] = (1,)
    """Seeds, comma-separated: one fine-tuning each, reported each, mean ± std and best."""
    freeze_encoder: bool = False
    """Train only the head (feature-based approach)."""
    feature_layers: tuple[int, ...] | None = None
    """Feature-based head on these hidden states of a frozen encoder, e.g. -1,-2,-3,-4 (0 = embeddings,
    -1 = last layer)."""
    feature_combine: str = dataclasses.field(default="concat", metadata={"choices": FEATURE_COMBINES})
    """How --feature-layers are combined."""
    eval_batch_size: int = dataclasses.field(default=64, metadata={"min": 1})
    """Batch size of evaluation."""
    group_by_length: bool = True
    """Batch training examples of similar length together (batch order still shuffled; less padding, same
    recipe)."""
    compare_random_init: str = dataclasses.field(default="auto", metadata={"choices": RANDOM_INIT_COMPARISONS})
    """Also fine-tune the model's architecture from random initialisation, same seeds and settings (in
    OUTPUT/random-init), and keep as OUTPUT/best the initialisation whose seeds score higher on the first dev set
    (mean), with Welch's p. auto: only where pre-training was measured to lose, a bertkit model pre-trained on a
    short budget with most inputs longer than its pre-training's, or one whose pre-training ended on the unigram
    plateau; needs --dev."""
    resume: bool = False
    """Continue the run in the output directory: finished seeds are kept, an interrupted seed resumes from
    its checkpoint (bit-exact on CPU)."""
    overwrite: bool = False
    """Delete an earlier fine-tuning run in the output directory first (otherwise a non-empty output is
    refused)."""
    train: TrainConfig = dataclasses.field(default_factory=finetune_training)
    """The training run of each seed: epochs or steps, learning rate, batch, precision, device, threads;
    --max-steps replaces --epochs (as in transformers' Trainer)."""

    @classmethod
    def of(cls, **values: object) -> FinetuneSettings:
        """Settings from one flat set of keyword values, as the command line gives them: this class's fields,
        and its TrainConfig's (over fine-tuning's defaults, `finetune_training`)."""
        own = {field.name for field in dataclasses.fields(cls)} - {"train"}
        train = finetune_training(**{name: value for name, value in values.items() if name not in own})
        return cls(**{name: value for name, value in values.items() if name in own}, train=train)  # type: ignore[arg-type]

    def check(self) -> None:
        foreign = [name for name in self.train.allow_change if name in PRETRAINING_ONLY]
        if foreign:
            choices = ", ".join(name for name in RESUME_EXACT_SETTINGS if name not in PRETRAINING_ONLY)
            raise BertkitError(f"--allow-change {foreign[0]}: fine-tuning has no such setting (it is pre-training's); "
                               f"fine-tuning's are {choices}")


GLUE_LEARNING_RATES = (5e-5, 4e-5, 3e-5, 2e-5)
"""The paper's fine-tuning learning rates, searched per GLUE task on dev (section 4.1)."""
GLUE_SEEDS = (1, 2, 3)
"""`bertkit glue`'s seeds: three restarts per (task, learning rate), enough for a mean ± std."""


@dataclass
class GlueSettings(Settings):
    """What `bertkit glue` runs beside its FinetuneSettings: the tasks of a GLUE directory and the
    learning-rate grid searched on dev (bertkit.workflows.glue)."""

    data: Path = dataclasses.field(metadata={"path": "dir"})
    """GLUE directory as download_glue_data.py writes it: CoLA/, SST-2/, MRPC/, STS-B/, QQP/, MNLI/, QNLI/,
    RTE/, WNLI/, each with train.tsv and dev.tsv (MNLI: dev_matched.tsv and dev_mismatched.tsv)."""
    tasks: str | None = None
    """Comma-separated tasks to run, e.g. cola,sst-2,mrpc; unset: every task found in --data."""
    learning_rates: tuple[float, ...] = GLUE_LEARNING_RATES
    """Learning rates tried per task, comma-separated; each task keeps the one with the best mean dev score
    over the seeds."""
    max_seq_length: int = sequence_length_field(128, pairs=True)
    """Longest input in tokens, [CLS]/[SEP] included (longer pairs are truncated and counted)."""

    def check(self) -> None:
        if not self.learning_rates or not all(rate > 0 for rate in self.learning_rates):  # (also NaN)
            raise BertkitError(f"--learning-rates must be positive numbers, got {self.learning_rates}")
