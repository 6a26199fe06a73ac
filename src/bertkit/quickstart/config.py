"""The settings of `bertkit quickstart`: where and how long (`QuickstartSettings`), and how (`Recipe`).

Design decision: these dataclasses are the command's flags (bertkit.cli.options: a field is a flag, its
docstring the help) and what `run_quickstart` takes. The module imports no torch, so `bertkit quickstart
--help` answers at once; it lives here rather than in bertkit.settings because the recipe's defaults are
`bertkit pretrain --recipe short` at bert-mini's width (bertkit.workflows.recipes): one source.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from bertkit.errors import BertkitError
from bertkit.settings import DeviceChoice, sequence_length_field
from bertkit.workflows.recipes import REFERENCE_WIDTH, finetune_learning_rate, short_recipe

MODEL = "bert-mini"
_SHORT = short_recipe(REFERENCE_WIDTH)  # bertkit pretrain --recipe short at bert-mini's width: one source
T = TypeVar("T")


def _set(value: T | None) -> T:
    """A setting the short recipe decides (None would leave it to the data or the model config)."""
    assert value is not None, "the short recipe sets the length, masking rate and dropout"
    return value


@dataclass(frozen=True)
class Recipe:
    """Pre-training and fine-tuning settings; the defaults are the recipe measured in docs/quickstart.md."""

    vocab_size: int = 8000
    """WordPiece vocabulary trained on the corpus (small: fewer embedding rows to learn)."""
    max_seq_length: int = sequence_length_field(_set(_SHORT.max_seq_length), pairs=True)
    """Pre-training instance length in tokens (a verse is about 35; short instances, more steps)."""
    masked_lm_prob: float = _set(_SHORT.masked_lm_prob)
    """Fraction of tokens masked (dynamic masking: new masks every epoch)."""
    max_predictions_per_seq: int | None = None
    """Most masked tokens per instance; None: the masking rate of the longest instance (Google's rule), so a
    Recipe with another rate or length gets its own cap (`prediction_cap`)."""
    nsp: bool = _SHORT.nsp
    """Train next sentence prediction too."""
    dropout: float = _set(_SHORT.dropout)
    """Dropout while pre-training (fine-tuning uses 0.1)."""
    batch_size: int = _SHORT.batch_size
    """Pre-training sequences per optimizer step (small: a short budget needs many updates)."""
    learning_rate: float = _SHORT.learning_rate
    """Peak pre-training learning rate."""
    warmup_ratio: float = _SHORT.warmup_ratio
    """Warmup as a fraction of the budget; then linear decay to 0 at the end of the budget."""
    finetune_learning_rate: float = finetune_learning_rate(REFERENCE_WIDTH, None)[0]
    """Fine-tuning learning rate (both initialisations): `--learning-rate auto`'s for bert-mini."""
    finetune_epochs: float = 5.0
    """Fine-tuning epochs (the best dev epoch is kept)."""
    finetune_batch_size: int = 32
    """Fine-tuning batch size."""
    train_examples: int | None = 1000
    """Labelled training verses used: a seeded subset of the bundled 4,000 (few labels are where
    pre-training pays most, and it keeps fine-tuning short); 0 (None from Python): all of them."""

    @property
    def prediction_cap(self) -> int:
        """max_predictions_per_seq, or the masking rate's share of the sequence length when it is None."""
        if self.max_predictions_per_seq is not None:
            return self.max_predictions_per_seq
        # bertkit.data.masking.prediction_cap's rule, written out: that module imports torch, this one stays free
        return max(1, round(self.masked_lm_prob * self.max_seq_length))


@dataclass
class QuickstartSettings(DeviceChoice):
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
