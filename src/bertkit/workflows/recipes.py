"""Training recipes that follow the budget: the pre-training recipe for a step or time budget, and the
fine-tuning learning rate for a model.

Design decision: both choices are pure functions of a few numbers - the optimizer steps a pre-training
run can take (given by --max-steps, or --max-time times the throughput measured on this machine) and the
model's width; for fine-tuning, whether and how long the model was pre-trained. They are tested with
injected numbers; measuring and printing live with their callers. `auto` keeps Devlin et al.'s schedule
for budgets of at least PAPER_MIN_STEPS steps and takes the short-budget recipe below that: short
sequences, small batches (a few minutes have few updates to give, so each must count), a high peak learning
rate on a one-cycle schedule, 30% dynamic masking, no dropout, masked LM only with the decoder bias starting at the
data's word frequencies; a checkpoint pre-trained elsewhere
(--init-from) is continued at a lower learning rate (`continue_recipe`). The numbers come from the
studies in docs/quickstart.md and docs/pretraining.md; a learning rate found for bert-mini (H=256) is
scaled by sqrt(256 / H) for other widths, the usual width scaling of Adam learning rates.

References: Devlin et al. 2018 (appendix A.2, A.3); Izsak et al. 2021, "How to Train BERT with an
Academic Budget" (arXiv:2104.07705); Geiping & Goldstein 2022, "Cramming" (arXiv:2212.14034); Turc et al.
2019 (arXiv:1908.08962) for the miniatures' fine-tuning learning rates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from bertkit.errors import BertkitError
from bertkit.settings import RECIPES

PAPER_MIN_STEPS = 100_000
"""Steps below which the paper's schedule (lr 1e-4, 1% warmup of 1M steps, dropout 0.1) does not leave the
unigram plateau in time; measured: 600 such steps gave 10% MLM accuracy where the short recipe gave 17%."""
REFERENCE_WIDTH = 256
"""Hidden size (bert-mini) at which the short recipe's learning rates were measured."""


@dataclass(frozen=True)
class PretrainRecipe:
    """What a pre-training run uses besides the model and the data; None leaves the setting to the
    data (sequence length, masking rate) or the model config (dropout)."""

    name: str
    """paper, short or continue."""
    max_seq_length: int | None
    """Instances longer than this are cut at load (Google's pair rule); None: as the data was built."""
    learning_rate: float
    """Peak learning rate."""
    warmup_ratio: float
    """Linear warmup as a fraction of the budget; then linear decay to 0 at its end."""
    dropout: float | None
    """Hidden and attention dropout while pre-training; None: the model config's (0.1 in the presets)."""
    masked_lm_prob: float | None
    """Masking rate of dynamically masked data; None: the data's."""
    nsp: bool
    """Next sentence prediction on."""
    batch_size: int
    """The global batch: sequences per optimizer step, all processes together."""
    micro_batch_size: int | None = None
    """Sequences per forward pass on each process when no batch size is given (the accumulation follows);
    None: the global batch split over the processes."""
    head_warmup_steps: int = 0
    """Steps at the start with the encoder held still while a freshly initialised MLM head learns to read it
    (continuing a checkpoint released without its MLM head); 0: none."""
    full_length_share: float = 0.0
    """Share of the steps trained at the data's full length when `max_seq_length` cuts its instances shorter, so
    every position a user fine-tunes at is trained (`full_length_placement` says where); 0: none."""
    full_length_placement: str = "end"
    """end: the last `full_length_share` of the budget (its steps, or its time under a time budget: the paper's
    two phases, 90% at 128 tokens then 10% at 512); spread: that share of the steps, evenly spaced through the
    run (`full_length_step`)."""
    mlm_bias_init: str = "zeros"
    """How a newly initialised MLM decoder bias starts: zeros (Google's) or unigram (the log word frequencies of
    the training data, `MLM_BIAS_INITS`)."""
    reason: str = ""
    """One line: why this recipe was chosen."""
    budget_steps: float | None = None
    """The optimizer steps the budget was planned at (--max-steps, or --max-time at the measured rate); None:
    unknown (an epoch budget)."""

    def describe(self) -> str:
        parts = [f"{self.max_seq_length}-token sequences" if self.max_seq_length else "the data's sequence length",
                 f"global batch {self.batch_size}"
                 + (f" (micro-batches of {self.micro_batch_size})" if self.micro_batch_size else ""),
                 f"peak lr {self.learning_rate:.2g}",
                 f"warmup {self.warmup_ratio:.0%}",
                 f"dropout {self.dropout:g}" if self.dropout is not None else "the config's dropout",
                 f"masking {self.masked_lm_prob:.0%}" if self.masked_lm_prob else "the data's masking",
                 "MLM + NSP" if self.nsp else "MLM only"]
        if self.full_length_share and self.max_seq_length:
            where = "the last" if self.full_length_placement == "end" else "spread over the run:"
            parts.append(f"{where} {self.full_length_share:.0%} of the steps at the data's full length")
        if self.mlm_bias_init == "unigram":
            parts.append("a fresh MLM decoder bias at the data's log word frequencies")
        if self.head_warmup_steps:
            steps = self.head_warmup_steps
            parts.append(f"the new MLM head trained alone for the first {steps} step{'s' if steps != 1 else ''}")
        return ", ".join(parts)


def paper_recipe() -> PretrainRecipe:
    """Devlin et al.'s settings: a global batch of 256 sequences, in micro-batches of 32 on each process
    (accumulation 8 on one process, 1 on eight GPUs)."""
    return PretrainRecipe("paper", None, 1e-4, 0.01, None, None, True, 256, 32)


def short_recipe(hidden_size: int, budget_steps: float | None = None) -> PretrainRecipe:
    """The short-budget recipe for a model of this width and a budget of `budget_steps` optimizer steps (None:
    unknown): 64-token sequences, batch 16, peak lr 5e-4 at H=256
    reached at half the budget and decayed linearly to 0 at its end (one-cycle, as Cramming), 30% dynamic
    masking (Wettig et al. 2022), no dropout, masked LM only (SHORT_NSP) with a new decoder bias at the data's log
    word frequencies (SHORT_MLM_BIAS_INIT), the same at every budget; every step at 64 tokens
    (SHORT_FULL_LENGTH_SHARE: steps at the data's full length were measured and cost more than they gave).

    Chosen by measurement (docs/pretraining.md, "What pays at which budget"): at 10 CPU-minutes on the held-out
    WordNet corpus, bert-mini fine-tuned on its 45-way task scored 48.7 +- 0.8 test accuracy where the recipe
    before (batch 32, 15% masking, 5% warmup; docs/quickstart.md's study) scored 41.3 +- 1.0 and, at 20
    CPU-minutes, 48.1 +- 0.4: the new recipe matches it in half the time (QA F1 falls 0.9 short of it). The
    three changes pay together, not alone: batch 16 alone +0.6, 30% masking alone +2.2, the one-cycle schedule
    alone -1.3; batch 16 with 30% masking +3.1, all three +7.4. On one CPU thread
    batch 16 takes twice the steps of batch 32 in the same time (the same tokens per second); on two threads
    fewer, and the 10-minute quickstart still gained more with it (+20.2 test points against +14.8)."""
    return PretrainRecipe("short", 64, width_scaled(5e-4, hidden_size), 0.5, 0.0, 0.3, SHORT_NSP, 16,
                          full_length_share=SHORT_FULL_LENGTH_SHARE, full_length_placement=SHORT_FULL_LENGTH_PLACEMENT,
                          mlm_bias_init=SHORT_MLM_BIAS_INIT)


SHORT_NSP = False
"""Next sentence prediction in the short recipe: none, at every budget (RoBERTa's finding at full scale, Liu et al.
2019). Measured (docs/pretraining.md, "The decoder bias at the word frequencies"): with the decoder bias at the word
frequencies, 10 CPU-minutes (2,640 steps) of masked LM only scored higher than the recipe before (MLM + NSP, zero
bias, the same pre-training seeds) on the commentary (+11.7 and +14.0 test points, two seeds) and the Treasury of
David (+6.4 and +5.2), and tied it on WordNet glosses (+0.5), KJV verses (+1.6) and the quickstart's task (-1.1, p =
0.36); at 20 CPU-minutes (5,280 steps) masked LM only had scored higher on every family ("Where the loss is: the
encoder layers, and NSP"). Before the bias, NSP was kept below 5,280 steps, where leaving it out cost the two KJV
tasks 2-3 points. `--nsp` / `--no-nsp` decide it for any budget."""
SHORT_FULL_LENGTH_SHARE = 0.0
"""Share of the short recipe's steps at the data's full length: none. 64-token steps alone leave positions 64 and up
untrained, but at 10 CPU-minutes the steps that train them cost more than they gave (docs/pretraining.md, "Every
position a fine-tuning reads": the last 10% at 128 tokens -2.0 points on a short-text task, 25% spread through the
run -4.2, and neither moved a long-input task); `--full-length-share` gives them, and fine-tuning, prediction and
serving say when inputs reach untrained positions."""
SHORT_MLM_BIAS_INIT = "unigram"
"""How the short recipe's fresh MLM decoder bias starts: at the training data's log word frequencies (what the unigram
plateau every pre-training starts on would otherwise spend its first steps learning, partly in the word embeddings).
Measured in docs/pretraining.md, "The decoder bias at the word frequencies"."""
SHORT_FULL_LENGTH_PLACEMENT = "end"
"""Where the short recipe would put full-length steps given a share (the paper's rule: at the end)."""


SHORT_STATIC_WARMUP_RATIO = 0.05
"""The short recipe's warmup on statically masked data, whose own (usually 15%) masks replace the recipe's 30%:
the one-cycle schedule paid only together with 30% masking (alone -1.3 points at 10 CPU-minutes, docs/pretraining.md),
so such data keeps the earlier recipe's 5% warmup, and batch 16 (alone +0.6)."""

HEAD_WARMUP_SHARE = 0.1
"""Share of a continued pre-training budget spent warming up a fresh MLM head with the encoder held still."""
HEAD_WARMUP_MAX_STEPS = 500
"""Cap of that warm-up: the head has a few hundred thousand parameters (plus the tied embeddings, held still)."""


def head_warmup_steps(budget_steps: float | None) -> int:
    """Steps of head warm-up for continuing a checkpoint released without its MLM head: HEAD_WARMUP_SHARE of the
    budget, at most HEAD_WARMUP_MAX_STEPS, at least 1 (an unknown budget: the cap). A first rule: the share is
    not yet tuned by measurement (docs/pretraining.md, "Domain adaptation")."""
    if budget_steps is None:
        return HEAD_WARMUP_MAX_STEPS
    return max(1, min(HEAD_WARMUP_MAX_STEPS, round(HEAD_WARMUP_SHARE * budget_steps)))


def continue_recipe(hidden_size: int, nsp: bool, budget_steps: float | None, mlm_head: bool = True
                    ) -> PretrainRecipe:
    """Continued (domain-adaptive) pre-training of a checkpoint trained to convergence elsewhere: BERT's own
    peak lr 1e-4 at width 768, x sqrt(768 / width) (MiniLM-L6-H384 1.4e-4, bert-mini 1.7e-4; the fine-tuning
    rule's scaling), 6% warmup (Gururangan et al. 2020's DAPT), the model's dropout and the data's sequence
    length, 15% dynamic masking; NSP only when the checkpoint has an NSP head to continue (`nsp`), else
    masked LM only as DAPT - a fresh NSP head has nothing to gain the encoder in a short run. Batch 32 below
    PAPER_MIN_STEPS steps (a CPU budget has few updates to give), else the paper's 256. A checkpoint without
    its MLM head (`mlm_head` False: a sentence encoder, a fine-tuned model) gets a head warm-up first
    (`head_warmup_steps`), so the random head's first updates do not send noise into the encoder."""
    batch, micro = (256, 32) if budget_steps is not None and budget_steps >= PAPER_MIN_STEPS else (32, None)
    return PretrainRecipe("continue", None, 1e-4 * math.sqrt(768 / hidden_size), 0.06, None, 0.15, nsp, batch, micro,
                          0 if mlm_head else head_warmup_steps(budget_steps))


CONTINUE_PASSES = 6
"""Passes over the corpus that continued pre-training takes when no budget is given (`continue_steps`).
Measured (docs/pretraining.md, "A checkpoint with its MLM head"): a general bert-mini continued on the KJV
corpus (1 MB of text) for 2 passes (1,000 steps) gained +0.3 test points at the best fine-tuning rate (within
seed noise), for 6 passes (3,000 steps) +2.7 (p = 0.05), +3.8 at the defaults; all-MiniLM-L6-v2 (released
without its MLM head, so with the head warm-up) for 6 passes +4.6 at the best rate (p = 0.06), +5.3 at the
defaults (p = 0.05), where 0.4 passes had lost 2.8 points. Not measured beyond 6 passes,
nor on corpora much larger than 1 MB, where a pass alone is long: give such runs --max-steps or --max-time."""


def continue_steps(num_instances: int, global_batch_size: int | None = None) -> tuple[int, int]:
    """(steps, global batch) of continued pre-training given no --max-steps or --max-time: CONTINUE_PASSES
    passes over `num_instances` at the given global batch, else at the continue recipe's (32, or the paper's
    256 where that many steps reach PAPER_MIN_STEPS); at least 1 step."""
    batch = global_batch_size or 32
    steps = math.ceil(CONTINUE_PASSES * num_instances / batch)
    if global_batch_size is None and steps >= PAPER_MIN_STEPS:
        batch = 256
        steps = math.ceil(CONTINUE_PASSES * num_instances / batch)
    return max(1, steps), batch


def width_scaled(learning_rate: float, hidden_size: int) -> float:
    """A learning rate measured at REFERENCE_WIDTH, scaled by sqrt(REFERENCE_WIDTH / hidden_size)."""
    return learning_rate * math.sqrt(REFERENCE_WIDTH / hidden_size)


def choose_recipe(name: str, hidden_size: int, budget_steps: float | None, init: str | None = None,
                  nsp_head: bool = True, mlm_head: bool = True) -> PretrainRecipe:
    """The recipe `name` (auto, paper, short, continue) for a budget of `budget_steps` optimizer steps (None:
    unknown, e.g. an epoch budget), with the reason in one line and the budget kept. `init` describes the
    --init-from checkpoint: None (random initialisation), "released" (trained elsewhere: auto continues it) or
    "short" (a bertkit run on a short budget: auto goes on with the budget's recipe); `nsp_head` / `mlm_head`:
    whether it has an NSP / MLM head."""
    if name not in RECIPES:
        raise BertkitError(f"--recipe {name!r}: use one of {', '.join(RECIPES)}")
    return replace(_recipe_for(name, hidden_size, budget_steps, init, nsp_head, mlm_head), budget_steps=budget_steps)


def _recipe_for(name: str, hidden_size: int, budget_steps: float | None, init: str | None, nsp_head: bool,
                mlm_head: bool) -> PretrainRecipe:
    steps = f"~{budget_steps:,.0f} steps" if budget_steps is not None else "an unknown number of steps"
    if name == "continue" or (name == "auto" and init == "released"):
        head = "its NSP head kept" if nsp_head else "no NSP head in the checkpoint, so MLM only"
        head += "" if mlm_head else "; no MLM head in the checkpoint, so a new one is warmed up first"
        why = "--recipe continue" if name == "continue" else "--init-from a checkpoint pre-trained elsewhere"
        return replace(continue_recipe(hidden_size, nsp_head, budget_steps, mlm_head),
                       reason=f"{why}, {steps}: continued pre-training at a lower learning rate, {head}")
    if name == "paper":
        return replace(paper_recipe(), reason="--recipe paper")
    if name == "short":
        return _short(hidden_size, budget_steps, "--recipe short")
    # a bertkit short-budget run given to --init-from goes on as a fresh run of its budget would (not continued)
    goes_on = "--init-from a bertkit short-budget run, so the budget's recipe: " if init == "short" else ""
    if budget_steps is None or budget_steps >= PAPER_MIN_STEPS:
        return replace(paper_recipe(),
                       reason=f"{goes_on}{steps}: enough for the paper's schedule (>= {PAPER_MIN_STEPS:,})")
    return _short(hidden_size, budget_steps, f"{goes_on}{steps}: too few for the paper's schedule "
                                             f"(< {PAPER_MIN_STEPS:,}), so the short-budget one")


def _short(hidden_size: int, budget_steps: float | None, why: str) -> PretrainRecipe:
    """The short recipe for the budget; `why` + the objective's reason."""
    return replace(short_recipe(hidden_size, budget_steps), reason=why + SHORT_OBJECTIVE)


SHORT_OBJECTIVE = ", masked LM only (NSP measured to cost or tie at every budget tried)"
"""What the short recipe's reason says of its objective (SHORT_NSP)."""


FULL_LENGTH_PLACEMENTS = ("end", "spread")


def full_length_step(step: int, progress: float, share: float, placement: str) -> bool:
    """Whether the optimizer step after `step` steps, at `progress` (the budget's share spent, in [0, 1]), trains at
    the data's full length: `placement` end - once progress reaches 1 - `share`; spread - `share` of the steps,
    evenly spaced (step k when floor((k + 1) x share) > floor(k x share)). A pure function of the step and the
    budget, so a resumed run continues the same sequence of lengths."""
    if share <= 0.0:
        return False
    if placement == "end":
        return progress >= 1.0 - share
    return math.floor((step + 1) * share) > math.floor(step * share)


RECIPE_FIELDS = {"max_seq_length": ("settings", "max_seq_length"), "dropout": ("settings", "dropout"),
                 "masked_lm_prob": ("settings", "masked_lm_prob"), "nsp": ("settings", "nsp"),
                 "learning_rate": ("train", "learning_rate"), "warmup_ratio": ("train", "warmup_ratio"),
                 "batch_size": ("train", "global_batch_size"), "head_warmup_steps": ("train", "head_warmup_steps"),
                 "full_length_share": ("settings", "full_length_share"),
                 "full_length_placement": ("settings", "full_length_placement"),
                 "mlm_bias_init": ("settings", "mlm_bias_init")}
"""Recipe attribute -> (where it lands: the pre-training settings or the TrainConfig, the field there). A field that
is None (unset) takes the recipe's value; a set one is the user's and stays."""


@dataclass(frozen=True)
class DataShape:
    """What the recipe needs to know of the pre-training data (`bertkit.workflows.pretrain_plan.DataFacts`)."""

    directory: str
    dynamic: bool
    """Masked at load (a masking rate can be chosen), not in the shards."""
    nsp: bool
    """Sentence pairs with NSP labels (not --no-nsp packed data)."""
    layout: str
    built_seq_length: int


def apply_recipe(recipe: PretrainRecipe, settings: Any, train: Any, data: DataShape, world_size: int
                 ) -> tuple[Any, Any, list[str]]:
    """(settings, train, notes): every recipe field left unset (None) in the pre-training settings or the
    TrainConfig filled from `recipe`, with the data's own rules - masked-LM-only data turns NSP off, statically
    masked data keeps its masks (and, under the short recipe, the warmup that paid without 30% masking), a
    recipe length shorter than the data's cuts instances at load - and the recipe's micro-batch where the user
    gave no batch setting at all. A pure function: the one planner of `bertkit pretrain` and the quickstart."""
    values = {name: getattr(recipe, name) for name, (where, field) in RECIPE_FIELDS.items()
              if getattr(settings if where == "settings" else train, field) is None}
    notes = []
    if values.get("nsp") and not data.nsp:
        values["nsp"] = False
        notes.append(f"{data.directory} is masked-LM-only data ({data.layout}), so NSP is off")
    if values.get("masked_lm_prob") is not None and not data.dynamic:
        values["masked_lm_prob"] = None
        note = f"{data.directory} is statically masked, so its own masks are used"
        if recipe.name == "short" and "warmup_ratio" in values:
            values["warmup_ratio"] = SHORT_STATIC_WARMUP_RATIO
            note += (f" and the warmup is {SHORT_STATIC_WARMUP_RATIO:.0%} (the one-cycle schedule paid only with the "
                     "recipe's 30% masking); for the whole recipe, build the data with `--masking dynamic`")
        notes.append(note)
    length = values.get("max_seq_length", settings.max_seq_length)  # the recipe's or the user's
    if length is not None and length < data.built_seq_length:
        share = values.get("full_length_share", settings.full_length_share) or 0.0
        notes.append(f"instances of {data.built_seq_length} tokens are cut to {length} at load"
                     + (f" except in {share:.0%} of the steps, which train positions {length}-"
                        f"{data.built_seq_length - 1} too" if share else
                        f", so positions {length}-{data.built_seq_length - 1} stay untrained (--full-length-share "
                        "trains them; fine-tuning says when its inputs reach them)"))
    if train.batch_size is not None:  # the older --batch-size gives the global batch itself
        values.pop("batch_size", None)
    user_batch = (train.global_batch_size, train.micro_batch_size, train.gradient_accumulation_steps,
                  train.batch_size)
    settings = replace(settings, **{RECIPE_FIELDS[k][1]: v for k, v in values.items()
                                    if RECIPE_FIELDS[k][0] == "settings"})
    train = replace(train, **{RECIPE_FIELDS[k][1]: v for k, v in values.items() if RECIPE_FIELDS[k][0] == "train"})
    total = recipe.batch_size
    if (recipe.micro_batch_size is not None and all(value is None for value in user_batch)
            and total % (recipe.micro_batch_size * world_size) == 0):  # else: split evenly over the processes
        train = replace(train, micro_batch_size=recipe.micro_batch_size)
    return settings, train, notes


def library_defaults(settings: Any, train: Any) -> tuple[Any, Any]:
    """What a run with no recipe (`--recipe` unset, library use) takes for the settings a recipe would decide and
    the user left unset: the paper's learning rate and 1% warmup, NSP when the data has pairs, no head warm-up, no
    full-length steps, a zero MLM decoder bias (Google's); the others (length, masking, dropout) are the data's and
    the model's own."""
    paper = paper_recipe()
    settings = replace(settings, nsp=True if settings.nsp is None else settings.nsp,
                       full_length_share=settings.full_length_share or 0.0,
                       full_length_placement=settings.full_length_placement or paper.full_length_placement,
                       mlm_bias_init=settings.mlm_bias_init or paper.mlm_bias_init)
    return settings, replace(train, learning_rate=train.learning_rate or paper.learning_rate,
                             warmup_ratio=paper.warmup_ratio if train.warmup_ratio is None else train.warmup_ratio,
                             head_warmup_steps=train.head_warmup_steps or 0)


def budget_steps(max_steps: int | None, max_time_s: float | None, steps_per_second: float | None) -> float | None:
    """Optimizer steps a run can take: the step budget, the time budget at the measured rate, or the
    smaller of the two (None when neither is known)."""
    candidates = [float(max_steps)] if max_steps else []
    if max_time_s and steps_per_second:
        candidates.append(max_time_s * steps_per_second)
    return min(candidates) if candidates else None


# --- fine-tuning ----------------------------------------------------------------------------------

def pretraining_history(record: dict[str, Any]) -> dict[str, Any]:
    """What a model's bertkit_pretraining.json says of its whole pre-training, for the fine-tuning rule and the
    next recipe: {} when it began from a checkpoint made elsewhere (released: assumed to convergence, however
    few steps bertkit added), else {"steps": N} with every bertkit step along its chain of --init-from runs;
    {} too for an empty or unknown record."""
    origin = record.get("continued_from")
    if isinstance(origin, dict) and origin.get("released"):
        return {}
    steps = record.get("total_steps", record.get("steps"))
    return {"steps": steps} if isinstance(steps, int) and not isinstance(steps, bool) and steps >= 0 else {}


RELEASED_MAX_RATE = 3e-4
"""The largest `--learning-rate auto` for a converged checkpoint: the top of Google's grid for its miniatures."""


def finetune_learning_rate(hidden_size: int, pretraining: dict[str, Any] | None, num_layers: int = 12
                           ) -> tuple[float, str]:
    """`--learning-rate auto`: (peak learning rate, the reason) for fine-tuning a model of this width and depth.

    `pretraining` is None for random initialisation, else what is known of its pre-training:
    {"steps": N} for a bertkit run (bertkit_pretraining.json), {} for a checkpoint made elsewhere
    (assumed pre-trained to convergence, as released models are).

    - pre-trained to convergence: the paper's 5e-5 for BERT-Base (12 layers, width 768), x sqrt(768 / width)
      x 12 / layers, at most 3e-4 (the largest rate of Google's grid for its miniatures): a shallower encoder
      takes larger steps. Measured (docs/pretraining.md, "Domain adaptation"): all-MiniLM-L6-v2 on the KJV
      task scored 50.0 at the width rule alone (7.1e-5), 54.3 at this rule's 1.4e-4, 55.8 at 2e-4 and 55.6
      at 4e-4 (3 seeds each); BERT-Base is unchanged, BERT-Large gets 2.2e-5;
    - pre-trained on a short budget (< PAPER_MIN_STEPS steps), or not at all: 3e-4 at H=256 scaled by
      width - such models are far from a good optimum and fine-tune like fresh ones (docs/quickstart.md:
      random initialisation does not learn at 1e-4, both learn at 3e-4).
    """
    if pretraining is not None and pretraining.get("steps", math.inf) >= PAPER_MIN_STEPS:
        origin = (f"pre-trained {pretraining['steps']:,} steps" if "steps" in pretraining
                  else "pre-trained elsewhere (assumed to convergence)")
        rate = min(5e-5 * math.sqrt(768 / hidden_size) * 12 / num_layers, RELEASED_MAX_RATE)
        return rate, (f"{origin}, width {hidden_size}, {num_layers} layers: the paper's 5e-5 at width 768 and 12 "
                      f"layers, x sqrt(768 / width) x 12 / layers, at most {RELEASED_MAX_RATE:g}")
    origin = ("random initialisation" if pretraining is None
              else f"pre-trained only {pretraining['steps']:,} steps (< {PAPER_MIN_STEPS:,})")
    rate = width_scaled(3e-4, hidden_size)
    return rate, (f"{origin}, width {hidden_size}: 3e-4 at width {REFERENCE_WIDTH}, "
                  f"scaled by sqrt({REFERENCE_WIDTH} / width)")
