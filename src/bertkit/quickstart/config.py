"""The settings of `bertkit quickstart`: where and how long (`QuickstartSettings`), and how (`Recipe`).

Design decision: these dataclasses are the command's flags (bertkit.cli.options: a field is a flag, its
docstring the help) and what `run_quickstart` takes. The module imports no torch, so `bertkit quickstart
--help` answers at once. The pre-training recipe is not restated here: its unset fields are `bertkit pretrain
--recipe short`'s, filled in by the same planner (bertkit.workflows.pretrain_plan).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from bertkit.config import preset
from bertkit.errors import BertkitError
from bertkit.settings import DeviceChoice, TorchThreads, sequence_length_field
from bertkit.workflows.recipes import finetune_learning_rate, short_recipe

MODEL = "bert-mini"


PRETRAINING_FIELDS = ("max_seq_length", "masked_lm_prob", "nsp", "dropout", "batch_size", "learning_rate",
                      "warmup_ratio")
"""The Recipe fields `bertkit pretrain --recipe short` decides when they are unset (None)."""


@dataclass(frozen=True)
class Recipe:
    """Pre-training and fine-tuning settings. The pre-training ones left None are the short recipe's, filled in by
    the pre-training planner as for `bertkit pretrain --recipe short` (bertkit.workflows.recipes: the recipe
    measured in docs/pretraining.md); `resolved()` says what they come to at bert-mini's width."""

    vocab_size: int = 8000
    """WordPiece vocabulary trained on the corpus (small: fewer embedding rows to learn)."""
    max_seq_length: int | None = sequence_length_field(None, pairs=True)
    """Pre-training instance length in tokens; None: the short recipe's (64; a verse is about 35)."""
    masked_lm_prob: float | None = None
    """Fraction of tokens masked (dynamic masking: new masks every epoch); None: the short recipe's (30%)."""
    max_predictions_per_seq: int | None = None
    """Most masked tokens per instance; None: the masking rate of the longest instance (Google's rule), so a
    Recipe with another rate or length gets its own cap (`prediction_cap`)."""
    nsp: bool | None = None
    """Train next sentence prediction too; None: the short recipe's (no: masked LM only at every budget)."""
    dropout: float | None = None
    """Dropout while pre-training (fine-tuning uses 0.1); None: the short recipe's (0)."""
    batch_size: int | None = None
    """Pre-training sequences per optimizer step; None: the short recipe's (16: a short budget needs many updates)."""
    learning_rate: float | None = None
    """Peak pre-training learning rate; None: the short recipe's at bert-mini's width."""
    warmup_ratio: float | None = None
    """Warmup as a fraction of the budget, then linear decay to 0 at its end; None: the short recipe's."""
    finetune_learning_rate: float = finetune_learning_rate(preset(MODEL).hidden_size, None,
                                                           preset(MODEL).num_hidden_layers)[0]
    """Fine-tuning learning rate (both initialisations): `--learning-rate auto`'s for bert-mini."""
    finetune_epochs: float = 5.0
    """Fine-tuning epochs (the best dev epoch is kept)."""
    finetune_batch_size: int = 32
    """Fine-tuning batch size."""
    train_examples: int | None = 1000
    """Labelled training verses used: a seeded subset of the bundled 4,000 (few labels are where
    pre-training pays most, and it keeps fine-tuning short); 0 (None from Python): all of them."""

    def resolved(self, budget_steps: float | None = None) -> Recipe:
        """This recipe with every unset pre-training field at the short recipe's value for bert-mini and a budget of
        `budget_steps` optimizer steps (None: unknown), as the planner fills it in: what the data is built with, the
        speed is measured at and the report shows."""
        short = short_recipe(preset(MODEL).hidden_size, budget_steps)
        return replace(self, **{name: getattr(short, name) for name in PRETRAINING_FIELDS
                                if getattr(self, name) is None})

    @property
    def prediction_cap(self) -> int:
        """max_predictions_per_seq, or the masking rate's share of the sequence length when it is None."""
        if self.max_predictions_per_seq is not None:
            return self.max_predictions_per_seq
        recipe = self.resolved()
        assert recipe.masked_lm_prob is not None and recipe.max_seq_length is not None  # the short recipe sets both
        # bertkit.data.masking.prediction_cap's rule, written out: that module imports torch, this one stays free
        return max(1, round(recipe.masked_lm_prob * recipe.max_seq_length))


@dataclass
class QuickstartSettings(DeviceChoice, TorchThreads):
    """Where and how long; `recipe` says how."""

    output: Path = field(metadata={"path": "dir"})
    """Directory for every stage's output (vocab/, data/, pretrain/, finetune-*/) and report.md."""
    minutes: float | None = 10.0
    """Time budget of the whole command in minutes (vocabulary, data, pre-training, both fine-tunings,
    report); the split is planned from throughput measured on this machine (plan.py) and printed; ignored
    with --max-steps."""
    max_steps: int | None = None
    """Pre-train for this many steps instead of a time budget (a step budget does not depend on the
    machine's load: deterministic, for comparisons; fine-tuning then runs all its epochs and seeds; see
    docs/quickstart.md)."""
    seeds: tuple[int, ...] = (1, 2, 3)
    """Comma-separated fine-tuning seeds, each run for both initialisations."""
    seeds_fixed: bool = False
    """The user chose the seeds (a time plan keeps them all); else a short budget may use fewer."""
    epochs_fixed: bool = False
    """The user chose the fine-tuning epochs (a time plan keeps them); else a short budget may use fewer."""
    recipe: Recipe = field(default_factory=Recipe)
    eval_every: int = 50
    """Held-out pre-training evaluation every N steps (and at the end)."""
    eval_examples: int = 500
    """Pre-training instances held out for the MLM/NSP curves."""
    random_baseline: bool = field(default=True, metadata={"flag": "--baseline/--no-baseline"})
    """Also fine-tune the same architecture from random initialisation (--no-baseline: skip it)."""
    overwrite: bool = False
    """Delete an earlier quickstart's output in --output first."""
    resume: bool = False
    """Keep the stages already complete in --output and run the rest."""
    seed: int = 42
    """Seed of pre-training (initialisation, data order, masks)."""
    workers: int = 1
    """Processes for data creation."""

    def check(self) -> None:
        if self.minutes is None and self.max_steps is None:
            raise BertkitError("no budget: give --minutes (or --max-steps for pre-training)")
        if self.minutes is not None and not self.minutes > 0:
            raise BertkitError(f"--minutes must be positive, got {self.minutes}")
        if self.max_steps is not None and not self.max_steps > 0:
            raise BertkitError(f"--max-steps must be positive, got {self.max_steps}")
        if not self.seeds:
            raise BertkitError("--seeds: give at least one seed")
        if len(set(self.seeds)) != len(self.seeds):
            raise BertkitError(f"--seeds {','.join(map(str, self.seeds))}: a seed is repeated")
        if self.overwrite and self.resume:
            raise BertkitError("--overwrite and --resume contradict each other; pick one")
        if not self.recipe.finetune_epochs > 0:
            raise BertkitError(f"--finetune-epochs must be positive, got {self.recipe.finetune_epochs}")
        train = self.recipe.train_examples
        if train is not None and train < 6:
            raise BertkitError(f"--train-examples must be at least 6 (one per label), got {train}")
