"""The settings of every run: one dataclass per thing a command configures, and the values they accept.

- `TrainConfig`: an optimisation run of the training loop (`bertkit.train.fit`).
- `PretrainSettings`: what `bertkit pretrain` trains, beside its TrainConfig.
- `FinetuneConfig`: how `bertkit finetune` trains, for every task; `GlueSettings`: what `bertkit glue`
  runs with it.
- `ClassificationSettings`, `TaggingSettings`, `SquadSettings`, `MultipleChoiceSettings`: a task's own
  settings, saved in a fine-tuned directory's bertkit_task.json so predict/evaluate/serve read inputs the
  same way.
- `PretrainingDataOptions` (what changes the data) and `PretrainingDataJob` (its files and workers):
  `bertkit data pretraining`.
- `TokenizerTrainSettings`, `TokenizerEncodeSettings`: `bertkit tokenizer train` / `encode`.
- `ExtractSettings`, `ExportSettings`, `PredictSettings`: `bertkit extract`, `export onnx`, `predict` and
  `evaluate` (bertkit.features.extract_features, bertkit.export.export_onnx,
  bertkit.tasks.evaluate.predict_file take them).
- `Limits`, `ServerSettings` (the app: bertkit.serve.app.create_app) and `ServeSettings` (model, address,
  threads): `bertkit serve`.

(`bertkit quickstart`'s QuickstartConfig and Recipe live in bertkit.quickstart.config: their defaults come
from bertkit.tasks.recipes.)

Design decision: these dataclasses are the one source of each setting. The command line is generated from
them (`bertkit.cli.options`: a field is a flag, its docstring the help, its `choices` metadata the accepted
values, `min`/`max` its bounds, checked by `check_bounds` for Python callers too), the library functions
take them, and the choices below are what the implementing modules check against (a test asserts that
each implements exactly these: bertkit.runtime, bertkit.train.optim, bertkit.model.feature_based,
bertkit.tasks.metrics, bertkit.inference.pooling). The module imports neither torch nor numpy (nor
starlette), so every command's `--help` answers at once.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertkit.errors import BertkitError

DEVICES = ("auto", "cpu", "cuda")
"""The values of --device: auto is the local CUDA device when there is one, else the CPU."""
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
"""The values of --precision for training (pre-training, fine-tuning)."""
INFERENCE_PRECISIONS = ("auto", "fp32", "bf16", "int8")
"""The values of --precision for inference (predict, evaluate, extract, serve)."""
OPTIMIZERS = ("adamw", "lamb")
"""The values of --optimizer (bertkit.train.optim.build_optimizer)."""
LR_SCHEDULES = ("linear", "cosine", "constant-with-warmup", "inverse-sqrt")
"""The values of --lr-schedule (bertkit.train.optim.SCHEDULES)."""
FEATURE_COMBINES = ("concat", "sum", "mean")
"""How a feature-based head combines the hidden states of --feature-layers (bertkit.model.feature_based)."""
RECIPES = ("auto", "paper", "short", "continue")
"""The values of --recipe (bertkit.tasks.recipes: auto picks paper or short from the budget, continue with
--init-from)."""
TAG_SCHEMES = ("BIO", "IOB1", "BIOES")
"""Tagging schemes whose entities the tagging metrics read (bertkit.tasks.metrics.entity_scores)."""
LONG_DOCUMENTS = ("truncate", "windows")
"""How classification reads an input longer than --max-seq-length (bertkit.tasks.long_documents)."""
WINDOW_AGGREGATIONS = ("mean", "max")
"""How the window scores of a long document become its score (bertkit.tasks.long_documents.aggregate_logits)."""


# --- training ------------------------------------------------------------------------------------------

DEFAULT_GLOBAL_BATCH_SIZE = 32
"""Examples per optimizer step when no batch size is given (the paper's fine-tuning batch)."""


@dataclass(kw_only=True)
class BatchSizes:
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


RESUME_EXACT_SETTINGS = ("seed", "shuffle", "optimizer", "global_batch_size", "data", "model", "tokenizer",
                         "max_seq_length", "masked_lm_prob", "nsp", "dropout")
"""Settings a resumed run must share with its checkpoint (a change breaks its exactness: another data order,
another model or objective) unless --allow-change names them; the last seven are pre-training's (`fit`'s
`identity`)."""


@dataclass
class TrainConfig(BatchSizes):
    """Everything that shapes an optimisation run (the model and data are given separately)."""

    max_steps: int | None = None
    """Optimizer steps to train for (with a time or epoch budget too: whichever ends first)."""
    max_time_s: float | None = dataclasses.field(default=None, metadata={"flag": "--max-time"})
    """Training time budget in seconds, counted across resumes (on the command line e.g. 2h, 90m or 1h30m);
    the schedule follows it."""
    num_epochs: float | None = dataclasses.field(default=None, metadata={"flag": "--epochs"})
    """Budget in passes over the training data (fine-tuning); converted to steps."""
    learning_rate: float = 1e-4
    """Peak learning rate, reached at the end of warmup."""
    warmup_steps: int | None = None
    """Linear warmup length in optimizer steps; unset: --warmup-ratio of the budget."""
    warmup_ratio: float = 0.01
    """Warmup as a fraction of the budget (of the steps, or of the time under a time budget alone)."""
    lr_schedule: str = dataclasses.field(default="linear", metadata={"choices": LR_SCHEDULES})
    """Learning rate after the warmup: linear or cosine decay to 0 at the end of the budget, constant, or
    inverse square root."""
    weight_decay: float = 0.01
    """Decoupled weight decay (not on biases and LayerNorm parameters)."""
    betas: tuple[float, float] = (0.9, 0.999)
    """Adam beta1, beta2."""
    eps: float = dataclasses.field(default=1e-6, metadata={"flag": "--adam-epsilon"})
    """AdamW/LAMB epsilon (1e-6 as the original BERT optimizer)."""
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
    num_workers: int = 0
    """DataLoader worker processes per training process."""
    log_every: int | None = 10
    """Refresh the progress bar every this many steps (metrics.jsonl gets every step); unset: ten times per
    epoch or per --eval-every interval, whichever is shorter."""
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
    """Stop after this many evaluations in a row without a new best of best_metric; None: never."""
    allow_change: tuple[str, ...] = dataclasses.field(default=(), metadata={"choices": RESUME_EXACT_SETTINGS})
    """On resume, accept a new value of this setting although the run is then no longer exact (repeat for
    several); other settings (learning rate, budget, cadence) may change without it."""
    threads: int | None = dataclasses.field(default=None, metadata={"min": 1})
    """torch CPU threads; unset: torch's."""

    def __post_init__(self) -> None:
        self.betas = tuple(self.betas)  # type: ignore[assignment]
        self.allow_change = tuple(self.allow_change)
        self.validate()

    def validate(self) -> None:
        """Raise BertkitError naming the first setting that makes no sense."""
        if self.max_steps is None and self.max_time_s is None and self.num_epochs is None:
            raise BertkitError("no training budget: give --max-steps, --max-time or --epochs")
        positive = {"max_steps": self.max_steps, "max_time_s": self.max_time_s, "num_epochs": self.num_epochs,
                    "micro_batch_size": self.micro_batch_size, "keep_last": self.keep_last,
                    "gradient_accumulation_steps": self.gradient_accumulation_steps,
                    "global_batch_size": self.global_batch_size, "batch_size": self.batch_size,
                    "learning_rate": self.learning_rate, "log_every": self.log_every,
                    "eval_every": self.eval_every, "save_every": self.save_every,
                    "max_nonfinite_steps": self.max_nonfinite_steps,
                    "early_stopping_patience": self.early_stopping_patience, "threads": self.threads}
        for name, value in positive.items():
            if value is not None and not value > 0:
                raise BertkitError(f"{flag_of(self, name)} must be positive, got {value!r}")
        if self.optimizer not in OPTIMIZERS:
            raise BertkitError(f"--optimizer {self.optimizer!r}: use one of {', '.join(OPTIMIZERS)}")
        if self.precision not in PRECISIONS:
            raise BertkitError(f"--precision {self.precision!r}: use one of {', '.join(PRECISIONS)}")
        if self.lr_schedule not in LR_SCHEDULES:
            raise BertkitError(f"--lr-schedule {self.lr_schedule!r}: use one of {', '.join(LR_SCHEDULES)}")
        unknown = [name for name in self.allow_change if name not in RESUME_EXACT_SETTINGS]
        if unknown:
            raise BertkitError(f"--allow-change {unknown[0]!r}: name one of {', '.join(RESUME_EXACT_SETTINGS)} "
                               "(other settings may change on resume without it)")
        if self.early_stopping_patience is not None and self.best_metric is None:
            raise BertkitError("--early-stopping-patience needs an evaluation metric to watch")
        if not 0.0 <= self.warmup_ratio < 1.0:
            raise BertkitError(f"--warmup-ratio must be in [0, 1), got {self.warmup_ratio!r}")
        if self.warmup_steps is not None and self.warmup_steps < 0:
            raise BertkitError(f"--warmup-steps must be >= 0, got {self.warmup_steps!r}")


@dataclass
class PretrainSettings:
    """What `bertkit pretrain` trains, beyond the optimisation settings in TrainConfig."""

    data: str = dataclasses.field(metadata={"path": "dir"})
    """Directory written by `bertkit data pretraining`."""
    model: str
    """Preset name (bert-tiny, bert-mini, bert-small, bert-medium, bert-base, bert-large) or a config.json;
    ignored with --init-from."""
    output: str = dataclasses.field(metadata={"path": "dir"})
    """Run directory: checkpoints, metrics.jsonl, tensorboard/, curves.png, final/."""
    tokenizer: str | None = None
    """Directory with the vocab.txt the data was made with; unset: --init-from's."""
    init_from: str | None = dataclasses.field(default=None, metadata={"path": "dir"})
    """Start from the weights, config and vocabulary of this directory (continued pre-training, or phase 2
    at a longer --max-seq-length)."""
    nsp: bool = True
    """Next sentence prediction on/off (off: masked LM only, a BertForMaskedLM - the paper's ablation)."""
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
    device: str = dataclasses.field(default="auto", metadata={"choices": DEVICES})
    """auto (CUDA when there is a GPU), cpu or cuda."""
    compile: bool | None = None
    """torch.compile the encoder layers (one-off compilation ~1 min; bertkit.model.compile_model); unset: on
    a GPU yes (bert-base phase 1 on an H100: 1.25x the eager step), on CPU no (faster only on shared CPU
    cores; docs/performance.md)."""
    gradient_checkpointing: bool = False
    """Recompute each encoder layer in the backward instead of keeping its activations: activation memory
    of about one layer instead of L, for about a third more step time (docs/performance.md)."""
    max_seq_length: int | None = None
    """Cut longer instances to this many tokens at load (Google's pair rule); unset: as the data was built."""
    masked_lm_prob: float | None = None
    """Masking rate of dynamically masked data; unset: the data's."""
    recipe: str | None = dataclasses.field(default=None, metadata={"choices": RECIPES})
    """Fills the settings a budget decides (sequence length, learning rate, warmup, dropout, masking rate,
    NSP, batch size) that were not given. auto: the paper's settings when the budget allows
    ~100,000 steps, else the short-budget recipe (64 tokens, lr 5e-4 at bert-mini's width, 5% warmup, no
    dropout, 15% dynamic masking, NSP, batch 32); the choice and its reason are printed (recipes.py);
    each setting's own flag overrides it. None (library use): exactly the settings given."""
    given: tuple[str, ...] = ()
    """Settings the user chose explicitly (by flag), which a recipe leaves alone: names of fields here or
    in TrainConfig (learning_rate, warmup_ratio, global_batch_size)."""


@dataclass
class FinetuneConfig(BatchSizes):
    """How to fine-tune (the paper's recipe as defaults)."""

    model: str
    """Checkpoint directory, or a preset name (random initialisation; needs --tokenizer)."""
    output: Path = dataclasses.field(metadata={"path": "dir"})
    """Output directory: best/ (the fine-tuned model), eval_results.json, seed-N/ while a seed trains."""
    tokenizer: str | None = None
    """Directory with vocab.txt; unset: the --model directory."""
    epochs: float = 3.0
    """Passes over the training data."""
    max_steps: int | None = None
    """Optimizer steps per seed instead of --epochs (it overrides them, as in transformers' Trainer); unset:
    off."""
    eval_every: int | None = None
    """Evaluate on dev every this many optimizer steps; unset: at the end of every epoch."""
    save_every: int | None = None
    """Write a resumable checkpoint every this many steps; unset: at every evaluation."""
    learning_rate: float | None = None
    """Peak AdamW learning rate, or auto (None): from the model's width and pre-training (5e-5 for
    BERT-Base pre-trained elsewhere, as the paper; more for smaller and briefly pre-trained models;
    `bertkit.tasks.recipes.finetune_learning_rate`); the choice is printed and kept in eval_results.json."""
    warmup_ratio: float = 0.1
    """Fraction of steps of linear warmup before the decay."""
    lr_schedule: str = dataclasses.field(default="linear", metadata={"choices": LR_SCHEDULES})
    """Learning rate after the warmup: linear or cosine decay to 0, constant, or inverse square root."""
    weight_decay: float = 0.01
    """AdamW weight decay (not on biases and LayerNorm)."""
    adam_epsilon: float = 1e-8
    """AdamW epsilon: 1e-8 as transformers' Trainer (the original BERT optimizer's 1e-6 measured the same on
    docs/finetuning.md's parity task; pre-training keeps 1e-6)."""
    dropout: float = 0.1
    """Dropout in the encoder and before the head."""
    precision: str = dataclasses.field(default="auto", metadata={"choices": PRECISIONS})
    """auto: the faster of fp32 and bf16 as measured on this machine (`bertkit doctor`; bf16 on GPUs that
    support it); bf16 autocast; fp16 autocast with a grad scaler (CUDA only)."""
    seeds: tuple[int, ...] = (1,)
    """Seeds, comma-separated: one fine-tuning each, reported each, mean ± std and best."""
    early_stopping_patience: int | None = None
    """Stop a seed after this many evaluations without dev improvement; unset: train all epochs."""
    freeze_encoder: bool = False
    """Train only the head (feature-based approach)."""
    feature_layers: tuple[int, ...] | None = None
    """Feature-based head on these hidden states of a frozen encoder, e.g. -1,-2,-3,-4 (0 = embeddings,
    -1 = last layer)."""
    feature_combine: str = dataclasses.field(default="concat", metadata={"choices": FEATURE_COMBINES})
    """How --feature-layers are combined."""
    eval_batch_size: int = dataclasses.field(default=64, metadata={"min": 1})
    """Batch size of evaluation."""
    device: str = dataclasses.field(default="auto", metadata={"choices": DEVICES})
    """auto (CUDA when there is a GPU), cpu or cuda."""
    group_by_length: bool = True
    """Batch training examples of similar length together (batch order still shuffled; less padding, same
    recipe)."""
    compile: bool = False
    """torch.compile the encoder layers (~30-60 s of compilation per seed); measured faster on shared CPU
    cores, no gain on idle ones (docs/performance.md)."""
    gradient_checkpointing: bool = False
    """Recompute each encoder layer in the backward instead of keeping its activations: activation memory
    of about one layer instead of L, for about a third more step time (docs/performance.md)."""
    resume: bool = False
    """Continue the run in the output directory: finished seeds are kept, an interrupted seed resumes from
    its checkpoint (bit-exact on CPU)."""
    overwrite: bool = False
    """Delete an earlier fine-tuning run in the output directory first (otherwise a non-empty output is
    refused)."""
    threads: int | None = dataclasses.field(default=None, metadata={"min": 1})
    """torch CPU threads; unset: torch's."""

    def __post_init__(self) -> None:
        check_bounds(self)
        if not self.epochs > 0:  # (also NaN)
            raise BertkitError(f"--epochs must be positive, got {self.epochs}")
        if self.max_steps is not None and self.max_steps < 1:
            raise BertkitError(f"--max-steps must be positive, got {self.max_steps}")


GLUE_LEARNING_RATES = (5e-5, 4e-5, 3e-5, 2e-5)
"""The paper's fine-tuning learning rates, searched per GLUE task on dev (section 4.1)."""
GLUE_SEEDS = (1, 2, 3)
"""`bertkit glue`'s seeds: three restarts per (task, learning rate), enough for a mean ± std."""


@dataclass
class GlueSettings:
    """What `bertkit glue` runs beside its FinetuneConfig: the tasks of a GLUE directory and the
    learning-rate grid searched on dev (bertkit.tasks.glue_suite)."""

    data: Path = dataclasses.field(metadata={"path": "dir"})
    """GLUE directory as download_glue_data.py writes it: CoLA/, SST-2/, MRPC/, STS-B/, QQP/, MNLI/, QNLI/,
    RTE/, WNLI/, each with train.tsv and dev.tsv (MNLI: dev_matched.tsv and dev_mismatched.tsv)."""
    tasks: str | None = None
    """Comma-separated tasks to run, e.g. cola,sst-2,mrpc; unset: every task found in --data."""
    learning_rates: tuple[float, ...] = GLUE_LEARNING_RATES
    """Learning rates tried per task, comma-separated; each task keeps the one with the best mean dev score
    over the seeds."""
    max_seq_length: int = dataclasses.field(default=128, metadata={"min": 8})
    """Longest input in tokens, [CLS]/[SEP] included (longer pairs are truncated and counted)."""

    def __post_init__(self) -> None:
        check_bounds(self)
        if not self.learning_rates or not all(rate > 0 for rate in self.learning_rates):  # (also NaN)
            raise BertkitError(f"--learning-rates must be positive numbers, got {self.learning_rates}")


# --- tasks (saved in bertkit_task.json) ----------------------------------------------------------------

@dataclass
class ClassificationSettings:
    """Everything needed to read, encode and label inputs again (saved in bertkit_task.json)."""

    labels: list[str] | None
    """Label names by output index; None for regression."""
    max_seq_length: int = 128
    """Longest input in tokens, [CLS]/[SEP] included."""
    glue_task: str | None = None
    """GLUE task whose TSV layout and metrics to use: cola, sst2, mrpc, stsb, qqp, mnli, qnli, rte, wnli;
    unset: a generic table (CSV/TSV/JSONL by column)."""
    text_column: str = "text"
    """Column/key of the text (generic files)."""
    text_pair_column: str | None = None
    """Column/key of the second text of a pair (generic files)."""
    label_column: str = "label"
    """Column/key of the label (generic files)."""
    header: bool = True
    """CSV/TSV: the first row names the columns; --no-header: it is data, and --text-column,
    --text-pair-column and --label-column are column numbers (0 the first, -1 the last)."""
    long_documents: str = dataclasses.field(default="truncate", metadata={"choices": LONG_DOCUMENTS})
    """An input longer than --max-seq-length: truncate (longest-first, counted), or windows: cut into
    overlapping windows of --max-seq-length tokens (a pair keeps its first text and windows the second),
    each window trained with the input's label, scored, and the scores aggregated per input
    (docs/finetuning.md, "Documents longer than the model")."""
    doc_stride: int | None = dataclasses.field(default=None, metadata={"min": 1})
    """With --long-documents windows: tokens between the starts of consecutive windows; unset: half a
    window."""
    window_aggregation: str = dataclasses.field(default="mean", metadata={"choices": WINDOW_AGGREGATIONS})
    """With --long-documents windows: an input's logits are the mean of its windows' logits, or their
    maximum per label."""
    max_windows: int = dataclasses.field(default=16, metadata={"min": 1})
    """With --long-documents windows: most windows per input; a longer input keeps its first windows and its
    last one, and is counted as truncated."""

    def __post_init__(self) -> None:
        check_bounds(self)
        if self.long_documents not in LONG_DOCUMENTS:
            raise BertkitError(f"--long-documents {self.long_documents!r}: use one of {', '.join(LONG_DOCUMENTS)}")
        if self.window_aggregation not in WINDOW_AGGREGATIONS:
            raise BertkitError(f"--window-aggregation {self.window_aggregation!r}: use one of "
                               f"{', '.join(WINDOW_AGGREGATIONS)}")
        if self.long_documents == "truncate" and self.doc_stride is not None:
            raise BertkitError("--doc-stride applies to --long-documents windows; add that flag or drop --doc-stride")
        if self.long_documents == "windows" and self.max_seq_length < 4:
            raise BertkitError(f"--long-documents windows needs --max-seq-length of at least 4, got "
                               f"{self.max_seq_length}")
        if self.doc_stride is not None and self.doc_stride > self.max_seq_length - 2:
            raise BertkitError(f"--doc-stride {self.doc_stride} is longer than a window's {self.max_seq_length - 2} "
                               "text tokens (--max-seq-length minus [CLS] and [SEP]), so windows would skip tokens; "
                               "give at most that (half of it is the default)")


@dataclass
class TaggingSettings:
    """Label names and window settings (saved in bertkit_task.json)."""

    labels: list[str]
    max_seq_length: int = 128
    """Longest input in tokens, [CLS]/[SEP] included."""
    doc_stride: int = 64
    """Sub-tokens between the starts of consecutive windows of a long sentence."""
    tag_scheme: str = dataclasses.field(default="BIO", metadata={"choices": TAG_SCHEMES})
    """Tagging scheme of the labels (entity scores follow conlleval's rules, which read all three)."""
    tokens_column: str = "tokens"
    """JSONL/Parquet/`datasets` input: column/key of each sentence's tokens, a list of strings."""
    tags_column: str = "ner_tags"
    """JSONL/Parquet/`datasets` input: column/key of each sentence's tags, a list of strings (or a `datasets`
    list of ClassLabel, read as its names)."""


@dataclass
class SquadSettings:
    """Window and decoding settings (saved in bertkit_task.json)."""

    max_seq_length: int = 384
    """Longest input in tokens, [CLS]/[SEP] included."""
    doc_stride: int = 128
    """Tokens between the starts of context windows."""
    max_query_length: int = 64
    """Question tokens kept."""
    version_2_with_negative: bool = False
    """SQuAD 2.0: questions may have no answer."""
    n_best_size: int = 20
    """Candidate starts/ends per window."""
    max_answer_length: int = 30
    """Longest answer in tokens."""
    null_score_diff_threshold: float = 0.0
    """SQuAD 2.0: answer "no answer" when its score beats the best span's by more than this (chosen on dev)."""


@dataclass
class MultipleChoiceSettings:
    """Saved in bertkit_task.json."""

    max_seq_length: int = 128
    """Longest input in tokens, [CLS]/[SEP] included."""


EMBEDDING_POOLINGS = ("mean", "cls", "max")
"""The values of `bertkit finetune embedding --pooling` (sentence-transformers' Pooling modes of those names)."""


@dataclass
class EmbeddingSettings:
    """How `bertkit finetune embedding` reads pairs and makes sentence vectors (the pooling, normalisation
    and length are saved as the sentence-transformers files of OUTPUT/best; bertkit.tasks.embedding)."""

    max_seq_length: int = dataclasses.field(default=128, metadata={"min": 3})
    """Longest text in tokens, [CLS]/[SEP] included (each text is encoded alone; longer ones are cut)."""
    pooling: str = dataclasses.field(default="mean", metadata={"choices": EMBEDDING_POOLINGS})
    """Sentence vector from the last layer: the mean of the real tokens' vectors, the [CLS] vector, or their
    maximum per dimension."""
    normalize: bool = False
    """Scale every sentence vector to unit length (a Normalize module in the saved directory), so that a dot
    product is the cosine; the loss and the evaluation use the cosine either way."""
    scale: float = 20.0
    """Multiple negatives ranking loss: the cosine similarities are multiplied by this before the softmax
    (20 = temperature 0.05, sentence-transformers' default)."""
    anchor_column: str = "anchor"
    """Column/key of the anchor (query) text."""
    positive_column: str = "positive"
    """Column/key of the text that matches the anchor."""
    negative_column: str | None = None
    """Column/key of a hard negative of the anchor in the training file (it joins the in-batch candidates);
    unset: in-batch negatives only."""
    header: bool = True
    """CSV/TSV: the first row names the columns; --no-header: it is data, and the column flags are column
    numbers (0 the first, -1 the last)."""

    def __post_init__(self) -> None:
        check_bounds(self)
        if not 0 < self.scale < float("inf"):  # (also NaN)
            raise BertkitError(f"--scale must be a positive number, got {self.scale}")


def flag_of(settings: object, name: str) -> str:
    """The command-line flag of the field `name` of the dataclass (or class) `settings`, for messages: its
    `flag` metadata (the first name of an on/off pair), else --name-in-kebab-case."""
    field = next(f for f in dataclasses.fields(settings) if f.name == name)  # type: ignore[arg-type]
    return field_flag(field).split("/")[0]


def field_flag(field: dataclasses.Field) -> str:
    """The flag of a dataclass field: its `flag` metadata, else the field's name in kebab case."""
    return field.metadata.get("flag", "--" + field.name.replace("_", "-"))


def check_bounds(settings: object) -> None:
    """Raise BertkitError naming the flag of the first field of the dataclass `settings` outside its
    `min`/`max` metadata (the bounds the command line enforces too, as a click range)."""
    for field in dataclasses.fields(settings):  # type: ignore[arg-type]
        value, low, high = getattr(settings, field.name), field.metadata.get("min"), field.metadata.get("max")
        if value is None or ((low is None or value >= low) and (high is None or value <= high)):
            continue
        flag = field_flag(field).split("/")[0]
        bounds = f"in [{low}, {high}]" if low is not None and high is not None else (
            f">= {low}" if low is not None else f"<= {high}")
        raise BertkitError(f"{flag} must be {bounds}, got {value!r}")


# --- pre-training data (bertkit data pretraining) ------------------------------------------------------

MASKINGS = ("static", "dynamic")
"""The values of --masking: masks stored in the shards, or drawn by the training loader."""
DATA_RNGS = ("numpy", "python")
"""The values of `bertkit data pretraining --rng`."""
PACKINGS = ("full-sentences", "doc-sentences", "contiguous")
"""The values of `bertkit data pretraining --packing` (bertkit.data.packing), for --no-nsp data."""


@dataclass(frozen=True)
class PretrainingDataOptions:
    """Every setting that changes the produced data (all recorded in the manifest;
    bertkit.data.pretraining.build_pretraining_data)."""

    max_seq_length: int = 128
    """Longest instance in tokens, [CLS] and [SEP]s included."""
    masked_lm_prob: float = 0.15
    """Fraction of each instance's tokens to predict."""
    max_predictions_per_seq: int = 20
    """Most predicted tokens per instance."""
    dupe_factor: int = 10
    """Passes over the corpus with different pairs and masks."""
    short_seq_prob: float = 0.1
    """Probability of a shorter target length for a document."""
    nsp: bool = True
    """Next-sentence pairs [CLS] A [SEP] B [SEP] (Google's rules, half with a random B); --no-nsp: one-segment
    masked-LM instances packed by --packing, for `bertkit pretrain --no-nsp` (--short-seq-prob is unused)."""
    packing: str | None = dataclasses.field(default=None, metadata={"choices": PACKINGS})
    """How --no-nsp instances are filled up to --max-seq-length: full-sentences (RoBERTa's: whole sentences,
    crossing documents with a [SEP] between them), doc-sentences (whole sentences of one document),
    contiguous (the token stream cut at the length, splitting sentences); a sentence longer than an
    instance is split, never dropped; unset: full-sentences."""
    whole_word_masking: bool = False
    """Mask all WordPiece pieces of a word together."""
    masking: str = dataclasses.field(default="static", metadata={"choices": MASKINGS})
    """static: masks stored in the shards; dynamic: unmasked instances stored once, masked by the training
    loader from (seed, epoch, index)."""
    seed: int = dataclasses.field(default=12345, metadata={"min": 0})
    """Random seed; same seed and inputs give byte-identical shards."""
    split_sentences: bool = False
    """Split each line into sentences (pysbd) first."""
    rng: str = dataclasses.field(default="numpy", metadata={"choices": DATA_RNGS})
    """numpy: pair rules and masking vectorised per block (fast); python: the original script's
    per-document draws and order (about 10x slower)."""
    shuffle_buffer_mb: float = 4.0
    """MiB of text per block: the pool random-next sentences come from, and the shuffle window."""

    def validate(self) -> None:
        check_bounds(self)
        if not 5 <= self.max_seq_length <= 65535:
            raise BertkitError(f"--max-seq-length must be in [5, 65535], got {self.max_seq_length}")
        if not 0.0 < self.masked_lm_prob < 1.0:
            raise BertkitError(f"--masked-lm-prob must be in (0, 1), got {self.masked_lm_prob}")
        if self.max_predictions_per_seq < 1:
            raise BertkitError(f"--max-predictions-per-seq must be at least 1, got {self.max_predictions_per_seq}")
        if self.dupe_factor < 1:
            raise BertkitError(f"--dupe-factor must be at least 1, got {self.dupe_factor}")
        if not 0.0 <= self.short_seq_prob <= 1.0:
            raise BertkitError(f"--short-seq-prob must be in [0, 1], got {self.short_seq_prob}")
        if self.masking not in MASKINGS:
            raise BertkitError(f"--masking must be 'static' or 'dynamic', got {self.masking!r}")
        if self.rng not in DATA_RNGS:
            raise BertkitError(f"--rng must be 'numpy' or 'python', got {self.rng!r}")
        if self.packing is not None and self.packing not in PACKINGS:
            raise BertkitError(f"--packing {self.packing!r}: use one of {', '.join(PACKINGS)}")
        if self.nsp and self.packing is not None:
            raise BertkitError("--packing applies to --no-nsp data only (NSP data is Google's sentence pairs); "
                               "add --no-nsp or drop --packing")
        if not self.nsp and self.rng == "python":
            raise BertkitError("--rng python reproduces Google's NSP pairs; --no-nsp data is packed by one "
                               "deterministic rule and masked by the numpy rules, so drop --rng python")
        if not self.shuffle_buffer_mb > 0:
            raise BertkitError(f"--shuffle-buffer-mb must be positive, got {self.shuffle_buffer_mb}")


@dataclass(frozen=True)
class PretrainingDataJob:
    """How `bertkit data pretraining` runs: its files and the settings that do not change the data."""

    inputs: tuple[str, ...] = dataclasses.field(metadata={"flag": "--input"})
    """Text file(s) (one sentence per line, blank line between documents), .jsonl (a document per line), either
    with .gz or .zst, Parquet or a `datasets` save_to_disk directory (a document per row), or a directory of
    them; repeat the flag or use glob patterns (quote them)."""
    tokenizer: str
    """Tokenizer directory (vocab.txt) from `bertkit tokenizer train`."""
    output: str
    """Output directory for shards and manifest.json."""
    workers: int | None = dataclasses.field(default=None, metadata={"min": 1})
    """Worker processes; unset: all cores."""
    strict: bool = False
    """Fail on invalid UTF-8, binary or corrupt files, bad JSONL lines or rows without a text instead of
    replacing/skipping and counting them."""
    text_column: str = "text"
    """Field of a JSONL record and column of a Parquet/`datasets` table that holds a document."""
    shard_size_mb: float = dataclasses.field(default=64.0, metadata={"min": 0.01})
    """Approximate size of each shard's token ids (MiB)."""
    overwrite: bool = False
    """Replace existing data in --output."""
    quiet: bool = False
    """No progress bar."""

    def __post_init__(self) -> None:
        check_bounds(self)


# --- tokenizer (bertkit tokenizer train / encode) ------------------------------------------------------

@dataclass(frozen=True)
class TokenizerTrainSettings:
    """What `bertkit tokenizer train` learns a WordPiece vocabulary from, and how
    (bertkit.tokenizer.WordPieceTokenizer.train)."""

    output: Path = dataclasses.field(metadata={"path": "dir"})
    """Directory to write vocab.txt and tokenizer_config.json to."""
    inputs: tuple[Path, ...] = dataclasses.field(default=(), metadata={"flag": "--input", "path": "any"})
    """Corpus file(s) to learn from, read as `data pretraining` reads them: text (one sentence a line), JSONL
    (the --text-column field of each line), either plain, .gz or .zst, Parquet or a `datasets` save_to_disk
    directory (the --text-column column), or a directory of them; several may follow one --input."""
    text_column: str = "text"
    """Field of a JSONL record and column of a Parquet/`datasets` table that holds a document."""
    vocab_size: int = dataclasses.field(default=30522, metadata={"min": 7})
    """Target vocabulary size, specials included."""
    cased: bool = False
    """Keep case and accents (default: lower-case and strip accents, like BERT uncased)."""
    min_frequency: int = dataclasses.field(default=2, metadata={"min": 1})
    """Least count for a merged piece to enter the vocabulary."""
    limit_alphabet: int = dataclasses.field(default=1000, metadata={"min": 1})
    """Most distinct characters kept as base pieces (at most (--vocab-size - 5) / 2)."""
    progress: bool = True
    """Show the trainer's progress bar."""
    strict: bool = False
    """Fail on invalid UTF-8, binary or corrupt files, bad JSONL lines or rows without a text instead of
    replacing/skipping and counting them."""
    threads: int | None = dataclasses.field(default=None, metadata={"min": 1})
    """Threads of the trainer (the tokenizers library's pool, RAYON_NUM_THREADS); unset: one per core."""

    def __post_init__(self) -> None:
        check_bounds(self)


@dataclass(frozen=True)
class TokenizerExtendSettings:
    """What `bertkit tokenizer extend` adds to a model's vocabulary, and from which text
    (bertkit.tasks.adapt.extend_model)."""

    model: Path = dataclasses.field(metadata={"path": "dir", "exists": True})
    """BERT model directory (config.json, weights, vocab.txt; a sentence-transformers directory too)."""
    output: Path = dataclasses.field(metadata={"path": "dir"})
    """New directory for the extended model (the original is never changed)."""
    add: int = dataclasses.field(metadata={"min": 1})
    """Pieces to add: the ones that save the most tokens on the corpus."""
    corpus: tuple[Path, ...] = dataclasses.field(default=(), metadata={"flag": "--corpus", "path": "any"})
    """Domain text, read as `data pretraining` reads it (text, JSONL, .gz/.zst, Parquet, directories); several
    may follow one --corpus."""
    init: str = dataclasses.field(default="mean", metadata={"choices": ("mean", "random")})
    """New embedding rows: mean of the rows of the pieces the old vocabulary splits the new piece into, or
    random (normal, std initializer_range, as the paper initialises embeddings)."""
    min_count: int = dataclasses.field(default=2, metadata={"min": 1})
    """Least count of a word (or trained piece) in the corpus to be a candidate."""
    seed: int = 0
    """Seed of random rows (--init random, and pieces whose old split is [UNK])."""
    text_column: str = "text"
    """Field of a JSONL record and column of a Parquet/`datasets` table that holds a document."""
    strict: bool = False
    """Fail on invalid UTF-8, binary or corrupt files instead of replacing/skipping and counting them."""

    def __post_init__(self) -> None:
        check_bounds(self)


@dataclass(frozen=True)
class TokenizerEncodeSettings:
    """How `bertkit tokenizer encode` encodes its TEXT (WordPieceTokenizer.from_pretrained, .encode)."""

    tokenizer: Path = dataclasses.field(metadata={"path": "any", "exists": True})
    """Directory holding vocab.txt (or the vocab.txt file)."""
    pair: str | None = None
    """Second text of a pair (segment B)."""
    max_length: int | None = dataclasses.field(default=None, metadata={"min": 3})
    """Truncate to this many tokens, specials included."""
    do_lower_case: bool | None = dataclasses.field(default=None, metadata={"flag": "--lower-case/--cased"})
    """Override do_lower_case (default: from tokenizer_config.json, else lower-case)."""


# --- inference (bertkit extract, export onnx, predict, evaluate) ---------------------------------------

POOLINGS = ("auto", "cls", "mean", "max", "mean_sqrt_len_tokens")
"""How `bertkit extract` pools .npy vectors: auto, or a mode of bertkit.inference.pooling.POOLINGS."""
QUANTIZATIONS = ("int8",)
"""The values of `bertkit export onnx --quantize` (onnxruntime dynamic quantization)."""


@dataclass
class ExtractSettings:
    """What `bertkit extract` reads and writes, and how (bertkit.features.extract_features)."""

    model: Path = dataclasses.field(metadata={"path": "any"})  # checked by check_model_directory
    """Checkpoint directory (config.json, model.safetensors, vocab.txt); any head; a sentence-transformers
    directory brings its own pooling."""
    input: Path = dataclasses.field(metadata={"path": "any"})
    """UTF-8 text, one input per line ('text_a ||| text_b' for a pair), or a Parquet file or `datasets`
    save_to_disk directory, one input per row (--text-column, --text-pair-column)."""
    output: Path = dataclasses.field(metadata={"path": "file"})
    """*.jsonl: per-token layer values; *.npy: one pooled vector per line (the extension picks the format)."""
    tokenizer: Path | None = dataclasses.field(default=None, metadata={"path": "any", "exists": True})
    """Directory with vocab.txt (or the file); unset: the --model directory."""
    layers: str | None = None
    """Encoder layers to output, comma-separated, -1 = last (as extract_features.py); unset: -1,-2,-3,-4 for
    .jsonl, -1 for .npy."""
    pooling: str | None = dataclasses.field(default=None, metadata={"choices": POOLINGS})
    """How .npy vectors pool the tokens (layers concatenated); auto (unset): a sentence-transformers
    directory's pooling, else [CLS]."""
    normalize: bool | None = None
    """Unit-length .npy vectors; unset: as the sentence-transformers directory says, else no."""
    max_seq_length: int | None = dataclasses.field(default=None, metadata={"min": 3})
    """Longest input in tokens, specials included; longer lines are truncated (counted); at most the model's
    max_position_embeddings (more is refused); unset: the sentence-transformers directory's, else 128."""
    batch_size: int = dataclasses.field(default=32, metadata={"min": 1})
    """Lines per forward pass."""
    text_column: str = "text"
    """Parquet/`datasets` input: the column of the text."""
    text_pair_column: str | None = None
    """Parquet/`datasets` input: the column of the second text of a pair; unset: single texts."""
    precision: str = dataclasses.field(default="fp32", metadata={"choices": INFERENCE_PRECISIONS})
    """auto: the faster of fp32 and bf16 as measured on this machine (`bertkit doctor`); bf16 values are
    within bf16 rounding; int8: encoder layers quantized, CPU only."""
    threads: int | None = dataclasses.field(default=None, metadata={"min": 1})
    """torch CPU threads; unset: torch's."""

    def __post_init__(self) -> None:
        check_bounds(self)


@dataclass
class ExportSettings:
    """What `bertkit export onnx` exports and checks (bertkit.export.export_onnx)."""

    model: Path = dataclasses.field(metadata={"path": "any"})  # checked by check_model_directory
    """Checkpoint directory; its config.json architectures entry picks the head and outputs."""
    output: Path = dataclasses.field(metadata={"path": "any"})
    """A directory to write model.onnx, config.json (with the label map), the tokenizer files and
    bertkit_task.json into (what onnxruntime, optimum and transformers' AutoTokenizer load); a path ending
    in .onnx: that file alone."""
    quantize: str | None = dataclasses.field(default=None, metadata={"choices": QUANTIZATIONS})
    """Dynamic int8 quantization (onnxruntime); prints the measured output change."""
    sample: Path | None = dataclasses.field(default=None, metadata={"path": "file", "exists": True})
    """Text file (one input per line) to check outputs on; unset: built-in sentences."""
    opset: int = dataclasses.field(default=17, metadata={"min": 14})
    """ONNX opset version."""
    optimize: bool = False
    """Write ONNX Runtime's fused BERT graph (Attention, SkipLayerNormalization, ...; runs in onnxruntime
    only), checked against PyTorch; prints the fused-operator counts."""

    def __post_init__(self) -> None:
        check_bounds(self)


@dataclass(kw_only=True)
class LongDocumentChoices:
    """How `bertkit predict`, `evaluate` and `serve` read classification inputs longer than the model;
    unset fields keep what the fine-tuned directory recorded (ClassificationSettings, bertkit_task.json)."""

    long_documents: str | None = dataclasses.field(default=None, metadata={"choices": LONG_DOCUMENTS})
    """Classification: truncate an input longer than the model's fine-tuned max_seq_length, or score it in
    overlapping windows and aggregate; unset: as fine-tuned."""
    doc_stride: int | None = dataclasses.field(default=None, metadata={"min": 1})
    """Classification with windows: tokens between the starts of consecutive windows; unset: as fine-tuned."""
    window_aggregation: str | None = dataclasses.field(default=None, metadata={"choices": WINDOW_AGGREGATIONS})
    """Classification with windows: mean of the windows' logits, or their maximum per label; unset: as
    fine-tuned."""
    max_windows: int | None = dataclasses.field(default=None, metadata={"min": 1})
    """Classification with windows: most windows per input (then its first windows and its last); unset: as
    fine-tuned."""

    def long_document_choices(self) -> dict[str, Any]:
        """The choices given (not None)."""
        names = ("long_documents", "doc_stride", "window_aggregation", "max_windows")
        return {name: getattr(self, name) for name in names if getattr(self, name) is not None}


@dataclass
class PredictSettings(LongDocumentChoices):
    """A fine-tuned directory on a file: `bertkit predict` / `bertkit evaluate`
    (bertkit.tasks.evaluate.predict_file)."""

    model: str = dataclasses.field(metadata={"path": "dir"})
    """Fine-tuned directory (OUTPUT/best of `bertkit finetune`)."""
    input: str = dataclasses.field(metadata={"path": "any"})
    """Classification: CSV/TSV with a header row, JSONL, Parquet or a `datasets` save_to_disk directory (or
    the GLUE layout it was trained on); tagging: CoNLL, or JSONL/Parquet/`datasets` with token and tag lists;
    SQuAD JSON, or the `datasets` squad layout as JSONL/Parquet/`datasets`; SWAG CSV, JSONL, or either
    layout as Parquet/`datasets` (multiple choice)."""
    output: str = dataclasses.field(metadata={"path": "dir"})
    """Directory for the results."""
    text_column: str | None = None
    """Classification: column/key of the text; unset: the one the model was fine-tuned with."""
    text_pair_column: str | None = None
    """Classification of pairs: column/key of the second text; unset: as fine-tuned."""
    id_column: str | None = None
    """Classification: column/key whose value identifies each row in the predictions; unset: a column named
    id if there is one, else file:line."""
    label_column: str | None = None
    """Classification: column/key of the gold label; unset: the one the model was fine-tuned with."""
    batch_size: int = dataclasses.field(default=64, metadata={"min": 1})
    """Inference batch size."""
    device: str = dataclasses.field(default="auto", metadata={"choices": DEVICES})
    """auto (CUDA when there is a GPU), cpu or cuda."""
    precision: str = dataclasses.field(default="fp32", metadata={"choices": INFERENCE_PRECISIONS})
    """fp32 reproduces the dev scores of fine-tuning exactly; auto: the faster of fp32 and bf16 as measured
    on this machine (`bertkit doctor`); bf16, or int8 (encoder layers quantized, CPU only), score the faster
    model."""
    evaluate: bool = False
    """Score the predictions against the file's labels too (eval_results.json)."""
    header: bool | None = None
    """Classification, CSV/TSV: whether the first row names the columns (--no-header: the column flags are
    numbers, 0 the first); unset: as the model was fine-tuned."""
    tokens_column: str | None = None
    """Tagging, JSONL/Parquet/`datasets` input: column/key of the tokens; unset: as fine-tuned."""
    tags_column: str | None = None
    """Tagging, JSONL/Parquet/`datasets` input: column/key of the gold tags; unset: as fine-tuned."""
    threads: int | None = dataclasses.field(default=None, metadata={"min": 1})
    """torch CPU threads; unset: torch's."""

    def __post_init__(self) -> None:
        check_bounds(self)

    def columns(self) -> dict[str, Any]:
        """The reading settings given for this file (they override the fine-tuned model's saved ones)."""
        names = ("text_column", "text_pair_column", "label_column", "id_column", "header", "tokens_column",
                 "tags_column")
        return {**{name: getattr(self, name) for name in names if getattr(self, name) is not None},
                **self.long_document_choices()}


# --- serving (bertkit serve) ---------------------------------------------------------------------------

LOG_LEVELS = ("debug", "info", "warning", "error")
"""The values of `bertkit serve --log-level`."""


@dataclass(frozen=True)
class Limits:
    """Per-connection and per-request limits of the server (each one is a `bertkit serve` flag;
    enforced by bertkit.serve.limits and bertkit.serve.connections)."""

    max_body_bytes: int = dataclasses.field(default=1_048_576, metadata={"min": 64})
    """Largest request body accepted (413 above it)."""
    max_inputs: int = dataclasses.field(default=64, metadata={"min": 1})
    """Most texts (or question/context pairs) in one request (422 above it)."""
    max_input_chars: int = dataclasses.field(default=20_000, metadata={"min": 1})
    """Most characters in one text, question or context (422 above it)."""
    max_connections: int = dataclasses.field(default=1000, metadata={"min": 1})
    """Most open connections; past it a new one replaces the slowest unfinished request, else gets 503."""
    header_timeout_s: float = dataclasses.field(default=10.0, metadata={"min": 0.01, "flag": "--header-timeout"})
    """Seconds a client has to send a request's headers, from connecting or from its previous response (408
    past it)."""
    body_timeout_s: float = dataclasses.field(default=30.0, metadata={"min": 0.01, "flag": "--body-timeout"})
    """Seconds a client has to send a request's body once its headers are in (408 past it)."""
    keep_alive_timeout_s: float = dataclasses.field(default=5.0, metadata={"min": 0.01,
                                                                           "flag": "--keep-alive-timeout"})
    """Seconds an idle keep-alive connection stays open between requests."""
    max_header_bytes: int = dataclasses.field(default=16_384, metadata={"min": 1024})
    """Largest request line + headers (431 above it)."""

    def __post_init__(self) -> None:
        check_bounds(self)


@dataclass(frozen=True)
class ServerSettings:
    """How the server batches, queues and limits requests (each field is a `bertkit serve` flag;
    bertkit.serve.app.create_app)."""

    limits: Limits = dataclasses.field(default_factory=Limits)
    max_batch_size: int = dataclasses.field(default=32, metadata={"min": 1})
    """Most inputs in one predictor call."""
    max_wait_ms: float = dataclasses.field(default=5.0, metadata={"min": 0})
    """How long the worker waits for more requests to gather into one batch."""
    max_queue: int = dataclasses.field(default=256, metadata={"min": 1})
    """Most requests waiting for the model; more are answered 429."""
    timeout_s: float = dataclasses.field(default=30.0, metadata={"min": 0.01, "flag": "--timeout"})
    """Per-request time limit in seconds, from arrival to result (504 past it)."""
    api_key: str | None = None
    """Require this key (X-API-Key or Authorization: Bearer) on task endpoints (else 401)."""
    max_batch_tokens: int = dataclasses.field(default=16_384, metadata={"min": 1})
    """Most tokens in one predictor call, the sum of its inputs' tokens (an input over it runs alone)."""
    json_access_log: bool = False
    """Log one JSON object per request on the `bertkit.access` logger (to stdout unless that logger has
    handlers of its own)."""

    def __post_init__(self) -> None:
        check_bounds(self)
        if self.api_key is not None and not self.api_key.strip():
            # An empty key would match requests that send none: authentication silently off.
            raise BertkitError("--api-key (or BERTKIT_API_KEY) is empty; give a non-empty key, or leave it "
                               "unset to serve without one")


@dataclass(frozen=True)
class ServeSettings:
    """What `bertkit serve` serves and where, beside the ServerSettings of the app
    (bertkit.serve.predictor.load_predictor, bertkit.serve.app.run_server)."""

    model: Path = dataclasses.field(metadata={"path": "any"})  # checked by check_model_directory
    """Checkpoint directory; endpoints follow from bertkit_task.json / config.json."""
    tokenizer: Path | None = dataclasses.field(default=None, metadata={"path": "dir", "exists": True})
    """Tokenizer directory to use instead of the model's (the model's own vocabulary, no more tokens than
    its vocab_size)."""
    host: str = "127.0.0.1"
    """Interface to bind; 0.0.0.0 exposes the server to the network."""
    port: int = dataclasses.field(default=8000, metadata={"min": 0, "max": 65535})
    """TCP port."""
    drain_timeout_s: float = dataclasses.field(default=30.0, metadata={"min": 0, "flag": "--drain-timeout"})
    """Seconds to finish in-flight requests after SIGTERM/SIGINT."""
    threads: int | None = dataclasses.field(default=None, metadata={"min": 1})
    """torch CPU threads; unset: torch's."""
    precision: str = dataclasses.field(default="auto", metadata={"choices": INFERENCE_PRECISIONS})
    """auto: the faster of fp32 and bf16 as measured on this machine (`bertkit doctor`); bf16 scores are
    within bf16 rounding; int8: encoder layers quantized, CPU only."""
    log_level: str = dataclasses.field(default="info", metadata={"choices": LOG_LEVELS})
    """Server log level."""

    def __post_init__(self) -> None:
        check_bounds(self)
