"""What the studies measured about the short recipe, said where it decides: the one-line notes `pretrain`, `finetune`
and the quickstart print when a run is where pre-training was measured to gain little or to lose (long inputs at a
short budget, a larger vocabulary than the recipe was measured with, a model still on the unigram plateau), and
`finetune --compare-random-init auto`, resolved from the same figures.

Design decision: each note is a pure function of a few numbers (the recipe, its budget in optimizer steps, the
lengths, the vocabulary size, the held-out context gain) and of the measured rows kept here as constants, so the
figures a user is shown are the ones docs/pretraining.md reports (tests read both) and a new measurement changes
one tuple. The recipe itself is chosen in `recipes`; nothing here changes a setting.
"""

from __future__ import annotations

import math
from typing import Any

from bertkit.workflows.recipes import PretrainRecipe, pretraining_history

LONG_INPUT_STUDY = (
    ("Webster's 1913 entries by subject field", ((2_640, "10 CPU-minutes", 3.7, 0.0028),
                                                 (5_280, "20 CPU-minutes", 9.2, 2.1e-05),
                                                 (10_560, "40 CPU-minutes", 12.4, 0.00012))),
    ("a Bible commentary's sections by part", ((2_640, "10 CPU-minutes", 3.9, 0.32),
                                               (5_280, "20 CPU-minutes", 8.5, 0.1),
                                               (10_560, "40 CPU-minutes", 12.1, 0.054))),
    ("the Treasury of David's paragraphs by book of the Psalter", ((2_640, "10 CPU-minutes", -3.3, 0.06),
                                                                  (5_280, "20 CPU-minutes", -1.6, 0.27),
                                                                  (10_560, "40 CPU-minutes", -1.2, 0.38))),
    ("World English Bible passages by part of the Bible", ((2_640, "10 CPU-minutes", 3.7, 0.05),
                                                           (5_280, "20 CPU-minutes", 6.4, 0.01),
                                                           (10_560, "40 CPU-minutes", 9.2, 0.0044))),
)
"""What the short recipe gained on tasks whose inputs are longer than its 64-token instances, per task: (its name, rows
of (bert-mini steps, the budget they were, test points over random initialisation, Welch's p)), from docs/pretraining.md
("Every position a fine-tuning reads", "The decoder bias at the word frequencies"). Every task: about 1,000 labels,
fine-tuned at 128 tokens for 10 epochs so that random initialisation learns too, pre-trained on the task's own domain
text. The second and third chose none of the short recipe's batch, masking and schedule, though the decoder bias and
masked LM only were chosen over the first three; the fourth was built after every setting was chosen, and chose nothing.
The 10-minute rows are today's recipe (masked LM only, the decoder bias at the word frequencies), the mean over three
pre-training seeds each (+6.2, +2.7, +2.2; +4.3, +4.2, +3.4; -2.4, -1.4, -6.1; +4.8, +4.1, +2.2). The 20-minute rows are
today's recipe too, the mean over two pre-training seeds each (seeds 2 and 3: +10.4, +8.1; +8.9, +8.1; -1.6, -1.6; +6.8,
+5.9; before the bias, masked LM only, seed 2 gave +7.5, +7.6 and -1.9 on the first three tasks). The 40-minute rows are
today's recipe too, one pre-training seed (seed 2) on the first task, two on the others (seeds 2 and 3: +12.1, +12.2;
-1.6, -0.8; +9.6, +8.8); before the bias, with NSP, the first two had given +9.8 and +8.5, and masked LM only the
Treasury -1.5. (The recipe before the bias lost at 10 CPU-minutes on the commentary and the Treasury: -11.0 and -6.1
over 3 pre-training seeds each.) The commentary's task was built twice (two sessions; the builds differ in some texts),
and each pre-trained row is compared with random initialisation fine-tuned on its own build (both builds' together where
a row pools them). A budget is warned about when, on some task, it or a longer budget gained less than LONG_INPUT_PAYS
points: on the Treasury no budget measured did, 40 CPU-minutes included."""
STUDY_STEPS_PER_SECOND = 4.4
"""The rate the study's budgets were counted at (2,640 bert-mini steps of 16 x 64 tokens in 10 CPU-minutes, its 2-core
machine before bmm attention for training): a faster machine or kernel takes more steps in the same minutes."""
LONG_INPUT_PAYS = 5.0
"""Test points over random initialisation that count as pre-training paying on a task (the study's bar)."""
LONG_INPUT_MAJORITY = 0.5
"""Share of a task's inputs past the trained positions from which the long-input measurement applies to it."""


def long_input_budget(steps: float | None) -> str:
    """'' when a short-recipe budget of `steps` optimizer steps is longer than every budget LONG_INPUT_STUDY
    measured not to pay on long inputs (or is unknown), else what was measured on each task, in words."""
    failed = [count for _, rows in LONG_INPUT_STUDY for count, _, gain, _ in rows if gain < LONG_INPUT_PAYS]
    if steps is None or not failed or steps > max(failed):
        return ""
    tasks = "; ".join(
        f"{task}: " + ", ".join(f"{gain:+.1f} after {budget} (~{count:,} steps, p = {p:.2g})"
                                for count, budget, gain, p in rows)
        for task, rows in LONG_INPUT_STUDY)
    where = "a long-input task" if len(LONG_INPUT_STUDY) == 1 else f"{len(LONG_INPUT_STUDY)} long-input tasks"
    return (f"measured with bert-mini on {where} fine-tuned at 128 tokens, in points over random initialisation "
            f"(steps of 16 x 64 tokens; the minutes are the study's 2-core CPU's, {STUDY_STEPS_PER_SECOND} steps a "
            f"second: compare your budget's steps): {tasks} (docs/pretraining.md, \"Every position a fine-tuning "
            "reads\")")


def long_input_note(recipe: PretrainRecipe, cut: int, data_length: int) -> str:
    """'' or one line for `pretrain`: the short recipe cuts the data's instances to `cut` tokens (built longer, as
    for fine-tuning inputs that long) at a budget measured too short to pay on long inputs (`long_input_budget`);
    full-length steps do not change it (they were measured not to move the long-input task)."""
    measured = long_input_budget(recipe.budget_steps) if recipe.name == "short" else ""
    if not measured or cut >= data_length:
        return ""
    return (f"if the inputs you will fine-tune on are mostly longer than {cut} tokens, expect this budget to gain "
            f"less than {LONG_INPUT_PAYS:g} points over random initialisation on them, or to lose: {measured}; give a "
            "longer budget; on such inputs `bertkit finetune` fine-tunes random initialisation as well and keeps the "
            "better on dev (--compare-random-init auto)")


def long_input_task_note(trained_length: int | None, lengths: list[int], steps: float | None) -> str:
    """'' or one line for a task whose inputs are known (`finetune`, the quickstart): at least LONG_INPUT_MAJORITY
    of `lengths` (tokens with the special ones) reach past the `trained_length` positions of a model pre-trained
    for `steps` optimizer steps of the short recipe, a budget measured too short to pay on long inputs."""
    measured = long_input_budget(steps)
    if trained_length is None or not lengths or not measured:
        return ""
    past = sum(length > trained_length for length in lengths) / len(lengths)
    if past < LONG_INPUT_MAJORITY:
        return ""
    return (f"{past:.0%} of the inputs are longer than the {trained_length} tokens this model was pre-trained on "
            f"for ~{steps:,.0f} steps, a budget measured to gain less than {LONG_INPUT_PAYS:g} points over random "
            f"initialisation on such inputs, or to lose: {measured}; pre-train longer, or fine-tune random "
            "initialisation as well and keep the better (`bertkit finetune --compare-random-init auto` does, for "
            "such a model and such inputs)")


SHORT_RECIPE_VOCABULARY = 8_000
"""The vocabulary size of every task the short recipe was chosen and measured on (the quickstart trains one too)."""
VOCABULARY_STUDY = (
    ("the Treasury of David's paragraphs by book of the Psalter", 29_867,
     ((1_785, "10 CPU-minutes", 37.8, 44.4, 46.5), (3_570, "20 CPU-minutes", 39.5, 44.7, 46.5))),
    ("Webster's 1913 entries by subject field", 30_522, ((1_768, "10 CPU-minutes", 29.6, 34.5, 27.4),)),
    ("World English Bible passages by part of the Bible", 12_205, ((2_495, "10 CPU-minutes", 71.1, 71.0, 66.1),)),
)
"""The short recipe on long-input tasks with `bertkit tokenizer train`'s default vocabulary (--vocab-size 30522):
(task, pieces reached, rows of (steps in the budget's CPU time, the budget, test accuracy, with 8,000 pieces, random
initialisation with these pieces)); docs/pretraining.md, "The vocabulary the short recipe was measured with"."""
VOCABULARY_LOSS = 2.0
"""Test points below the 8,000-piece vocabulary's from which a larger vocabulary counts as losing."""
VOCABULARY_SHORT_TEXTS = (("WordNet glosses by lexicographer file", 30_522,
                           ((1_768, "10 CPU-minutes", 49.3, 49.2, 42.6),)),)
"""The same on a short-text task (glosses under 64 tokens; pre-training seed 42): the larger vocabulary tied."""


def _vocabulary_rows(study: tuple[Any, ...]) -> str:
    return "; ".join(f"{task} with {pieces:,} pieces: " + ", ".join(
        f"{large:.1f} after {budget} (~{steps:,} steps) against {small:.1f} (random initialisation with these "
        f"pieces {random:.1f})"
        for steps, budget, large, small, random in rows) for task, pieces, rows in study)


def vocabulary_note(recipe: PretrainRecipe, vocab_size: int, cut: int, data_length: int, continued: bool = False
                    ) -> str:
    """'' or one line for `pretrain`: the short recipe cuts the data (built longer, as for long inputs) at a budget
    no longer than one where a larger vocabulary lost on long inputs, with one larger than every one that did not
    lose; never for a run `continued` from a checkpoint (its vocabulary; measured from random weights only)."""
    if recipe.name != "short" or recipe.budget_steps is None or cut >= data_length or continued:
        return ""
    rows = [(pieces, steps, large <= small - VOCABULARY_LOSS + 1e-9) for _, pieces, task_rows in VOCABULARY_STUDY
            for steps, _, large, small, _ in task_rows]
    lost = [steps for _, steps, loss in rows if loss and steps >= recipe.budget_steps]
    held = [pieces for pieces, _, loss in rows if not loss]
    if not lost or vocab_size <= max([SHORT_RECIPE_VOCABULARY, *held]):
        return ""
    return (f"if the inputs you will fine-tune on are mostly longer than {cut} tokens, this vocabulary of "
            f"{vocab_size:,} pieces may cost points: the short recipe was chosen and measured with "
            f"{SHORT_RECIPE_VOCABULARY:,}, and larger vocabularies (the default of `bertkit tokenizer train`, "
            f"--vocab-size 30522, on each task's corpus) scored, fine-tuned with bert-mini in the same CPU time, test "
            f"accuracy against {SHORT_RECIPE_VOCABULARY:,} pieces: {_vocabulary_rows(VOCABULARY_STUDY)}; on short "
            f"texts: {_vocabulary_rows(VOCABULARY_SHORT_TEXTS)} (docs/pretraining.md, \"The vocabulary the short "
            f"recipe was measured with\"); for such inputs and a budget this short, train the vocabulary with "
            f"`bertkit tokenizer train --vocab-size {SHORT_RECIPE_VOCABULARY}` and build the data again with it")


UNIGRAM_PLATEAU_NATS = 0.5
"""Held-out context gain (`mlm_context_gain`: nats per [MASK] token by which the model beats word frequencies counted
on its training split, `pretrain.unigram_baseline`) below which a pre-trained model is taken to be still on the
unigram plateau, where it predicts a masked word mostly from how common it is. Measured (docs/pretraining.md, "The
unigram plateau"): the models pre-trained 10 CPU-minutes on the Treasury of David read 0.22 and 0.28 (bertkit's,
pre-training seeds 2 and 3; seed 3's warning was given before its fine-tuning ran) and 0.14 (transformers', the same
CPU time) and fine-tuned 8.8, 6.6 and 7.3 points below random initialisation; the commentary's 10-minute models read
1.09 and 1.20, and every model measured to gain read more than 1. Past the plateau a model can still lose: the
Treasury's 15-minute model read 1.02 and fine-tuned to the majority class (8.4 points below)."""
PLATEAU_MEASURED = ("the Treasury of David's 10-minute models, at 0.14-0.28 nats, fine-tuned 6.6-8.8 points below "
                    "random initialisation (3 models)")
"""What UNIGRAM_PLATEAU_NATS rests on, in the words the notes use."""


def context_gain(record: dict[str, Any]) -> float | None:
    """The held-out `mlm_context_gain` of a bertkit_pretraining.json's last evaluation: None for a model pre-trained
    elsewhere (`pretraining_history`: assumed to convergence), a record without it, or a damaged value."""
    last = record.get("last_eval")
    gain = last.get("mlm_context_gain") if isinstance(last, dict) and pretraining_history(record) else None
    if not isinstance(gain, (int, float)) or isinstance(gain, bool) or not math.isfinite(gain):
        return None
    return float(gain)


def plateau_note(gain: float | None) -> str:
    """'' or one line for the end of a pre-training (`pretrain`, the quickstart's): the final model's held-out
    context gain is below UNIGRAM_PLATEAU_NATS."""
    if gain is None or gain >= UNIGRAM_PLATEAU_NATS:
        return ""
    where = ("it has not yet learned even how common they are, let alone their context" if gain < 0 else
             "it has barely begun to read their context")
    return (f"the model predicts held-out masked words {_against_frequency(gain)} "
            f"(mlm_context_gain < {UNIGRAM_PLATEAU_NATS:g}): {where}, on or before the unigram plateau every "
            f"pre-training starts on; measured: {PLATEAU_MEASURED}; give it a longer budget (`bertkit "
            "pretrain`: the same command with a larger --max-steps or --max-time and --resume auto; the quickstart: "
            "a larger --minutes or --max-steps); `bertkit finetune` fine-tunes random initialisation beside such a "
            "model and keeps the better on dev (--compare-random-init auto)")


def _against_frequency(gain: float) -> str:
    """A context gain in words, to 3 decimals (0.497 is not 'only 0.50 ... < 0.5'): 'only 0.217 nats better than
    their frequency alone', or '0.724 nats worse than ...'."""
    return (f"only {gain:.3f} nats better than" if gain >= 0 else f"{-gain:.3f} nats worse than") + \
        " their frequency alone"


def random_init_comparison(choice: str, trained_length: int | None, lengths: list[int], steps: float | None,
                           gain: float | None = None) -> tuple[bool, str]:
    """`finetune --compare-random-init`, resolved: (whether to fine-tune random initialisation as well, why). auto
    compares where pre-training was measured to lose: a model whose held-out context `gain` says it is still on
    the unigram plateau (`plateau_note`), and where `long_input_task_note` speaks, the budgets and lengths at which
    pre-training was measured to gain less than LONG_INPUT_PAYS points or to lose (a commentary task: -11.0 at 10
    CPU-minutes over three pre-training seeds); elsewhere pre-training paid, and a comparison would
    double the run for nothing."""
    if choice != "auto":
        return choice == "on", f"--compare-random-init {choice}"
    if gain is not None and gain < UNIGRAM_PLATEAU_NATS:
        return True, (f"auto: the model predicts held-out masked words {_against_frequency(gain)} (the "
                      "unigram plateau), where pre-training was measured to lose to random "
                      "initialisation")
    if long_input_task_note(trained_length, lengths, steps):
        return True, (f"auto: most inputs are longer than the {trained_length} tokens of a {steps:,.0f}-step "
                      "pre-training, where pre-training was measured to lose to random initialisation")
    return False, "auto: pre-training was not measured to lose on these inputs at this budget"
