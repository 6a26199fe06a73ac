"""`bertkit distill <kind>`: a smaller student of a fine-tuned teacher, one subcommand per task kind.

Flag parsing only: the flags are fine-tuning's (`FinetuneSettings`, as `bertkit finetune` has them, without --model
and --tokenizer: the student and its vocabulary come from --teacher and --student) plus `DistillSettings`'s;
`bertkit.workflows.distill.run_distillation` runs, imported only when the command does.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import click

from bertkit.cli.finetune import FINETUNE, KEPT_FROM_DIRECTORY, NOT_FLAGS, finetune_flags, print_summary
from bertkit.cli.options import settings_from_flags, settings_options
from bertkit.cli.pretrain import NOT_FLAGS as PRETRAIN_NOT_FLAGS
from bertkit.cli.pretrain import SETTINGS, TRAINING, report_pretraining, with_recipe
from bertkit.settings import (
    DISTILL_KINDS,
    DistillSettings,
    EmbeddingSettings,
    FinetuneSettings,
    PretrainSettings,
    TrainConfig,
)

NOT_DISTILL_FLAGS = ("model", "tokenizer", "freeze_encoder", "feature_layers", "feature_combine", "compare_random_init")
"""Fine-tuning's settings that --teacher and --student decide (the model, its vocabulary), or that a distilled
student does not take (a frozen encoder, a feature-based head, a comparison with random initialisation:
--compare-without-teacher is distillation's)."""
STUDENT_CHOICE = "the student (--student)"
"""What OUTPUT's finetune_run.json records as the model before the workflow names it."""


def _distill_flags(function: Callable) -> Callable:
    function = settings_options(DistillSettings)(function)
    exclude = (*NOT_FLAGS, *NOT_DISTILL_FLAGS)
    function = settings_options(FinetuneSettings, exclude=exclude, overrides=FINETUNE)(function)
    function = click.option("--dev", "dev_files", multiple=True, type=click.Path(),
                            help="Dev file, scored every epoch (the first selects the best epoch), and where the "
                                 "teacher's score and both models' speeds are measured.")(function)
    return click.option("--train", "train_file", required=True, type=click.Path(),
                        help="Labelled training file, in the teacher's task format.")(function)


def _command(kind: str) -> click.Command:
    def command(**flags: Any) -> None:
        from bertkit.workflows.distill import run_distillation  # torch: only when the command runs

        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
        settings = settings_from_flags(FinetuneSettings, flags, model=STUDENT_CHOICE)
        distill = settings_from_flags(DistillSettings, flags)
        results = run_distillation(kind, flags.pop("train_file"), list(flags.pop("dev_files")), settings, distill)
        print_summary(results, settings.output)
        _print_distillation(results["distillation"])

    command.__doc__ = (f"Distil a fine-tuned {kind} teacher into a smaller student: soft targets at a temperature, "
                       "the gold labels, optionally hidden states; OUTPUT/best is an ordinary fine-tuned directory.")
    return distill.command(name=kind)(_distill_flags(command))


def _print_distillation(report: dict[str, Any]) -> None:
    click.echo(f"student: {report['student_layers']} layers, {report['student_parameters']:,} parameters; teacher: "
               f"{report['teacher_layers']} layers, {report['teacher_parameters']:,}")
    if "teacher_score" in report:
        kept = f" ({100 * report['kept']:.1f}% kept)" if report["kept"] is not None else ""
        click.echo(f"{report['metric']}: student mean {report['student_mean']:.4f}, teacher "
                   f"{report['teacher_score']:.4f}{kept}")
        click.echo(f"speed on this machine: student {report['student_examples_per_s']:,.1f} examples/s, teacher "
                   f"{report['teacher_examples_per_s']:,.1f} ({report['speedup']:.2f}x)")
    if "without_teacher" in report:
        other = report["without_teacher"]
        click.echo(f"without the teacher: mean {other['mean']:.4f}; with it {other['difference']:+.4f} "
                   f"({other['note']})")


@click.group(context_settings={"show_default": True})
def distill() -> None:
    """Distil a fine-tuned model into a smaller, faster student (DistilBERT, TinyBERT-style)."""


for _kind in DISTILL_KINDS:
    _command(_kind)


KEPT_FROM_TEACHER = {name: {"default": None, "default_text": text.replace("starting sentence-transformers directory",
                                                                           "teacher")}
                     for name, text in KEPT_FROM_DIRECTORY.items()}
"""`distill embedding` settings the teacher decides unless their flag is given."""
EMBEDDING = ("teacher", "student", "unlabeled", "max_unlabeled", "compare_without_teacher")
"""The DistillSettings embedding distillation takes (its loss is the vectors' mean squared error, no weights)."""


@distill.command()
@settings_options(DistillSettings, only=EMBEDDING, overrides={"teacher": {
    "help": "The teacher: a sentence-transformers directory (`bertkit finetune embedding`'s OUTPUT/best); its "
            "pooling, normalisation and length are the student's unless a flag says otherwise."},
    "unlabeled": {"help": "Unlabelled texts whose teacher vectors the student learns too, one a line; unset: none."},
    "compare_without_teacher": {"help": "Also train the same student on the pairs alone (in-batch negatives, same "
                                        "seeds, OUTPUT/without-teacher) and report the difference with Welch's p."}})
@finetune_flags(EmbeddingSettings, ("given",), run_exclude=NOT_DISTILL_FLAGS, overrides=KEPT_FROM_TEACHER)
def embedding(**flags: Any) -> None:
    """A smaller sentence encoder that gives a teacher's sentence vectors (mean squared error on the training pairs'
    texts and --unlabeled's), scored by retrieval on --dev; OUTPUT/best is a sentence-transformers directory."""
    from bertkit.workflows.distill_embedding import run_embedding_distillation  # torch: only when the command runs

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    settings = settings_from_flags(FinetuneSettings, flags, model=STUDENT_CHOICE)
    given = tuple(name for name in KEPT_FROM_DIRECTORY if flags[name] is not None)
    embedding_settings = settings_from_flags(EmbeddingSettings, flags, drop_none=KEPT_FROM_DIRECTORY, given=given)
    distill_settings = DistillSettings(**{name: flags.pop(name) for name in EMBEDDING})
    results = run_embedding_distillation(flags.pop("train_file"), list(flags.pop("dev_files")), settings,
                                         embedding_settings, distill_settings)
    print_summary(results, settings.output)
    _print_distillation(results["distillation"])


GENERAL = ("teacher", "student", "temperature", "soft_weight", "hard_weight", "hidden_weight")
"""The DistillSettings general distillation takes (the extra text and the comparison are task distillation's)."""
GENERAL_DEFAULTS: dict[str, dict[str, Any]] = {
    "soft_weight": {"default": 5.0, "help": "Weight of the soft targets: KL divergence to the teacher's masked-LM "
                                            "distribution at the masked positions."},
    "hard_weight": {"default": 2.0,
                                                     "help": "Weight of the masked-LM loss on the original tokens."},
    "hidden_weight": {"default": 1.0, "help": "Weight of the cosine distance between the student's and the "
                                              "teacher's last hidden states (the student at the teacher's width)."},
    "teacher": {"help": "The teacher: a pre-trained checkpoint directory with its masked-LM head (`bertkit "
                        "pretrain`'s final/, bert-base-uncased)."}}
"""DistilBERT's weights (5 soft targets, 2 masked LM, 1 cosine; Sanh et al. 2019) as the command's defaults."""
NOT_GENERAL_FLAGS = ("model", "init_from", "nsp", "tokenizer")
"""Pre-training's settings --teacher and --student decide (masked LM only, as DistilBERT)."""


@distill.command()
@settings_options(DistillSettings, only=GENERAL, overrides=GENERAL_DEFAULTS)
@settings_options(PretrainSettings, exclude=NOT_GENERAL_FLAGS, overrides=with_recipe(PretrainSettings, SETTINGS))
@settings_options(TrainConfig, exclude=PRETRAIN_NOT_FLAGS, overrides=with_recipe(TrainConfig, TRAINING))
def pretraining(**flags: Any) -> None:
    """General distillation: pre-train a student on a teacher's masked-LM outputs (DistilBERT) from a `bertkit
    data pretraining` directory; OUTPUT/final is a checkpoint that finetune and distill take."""
    from bertkit.workflows.distill_pretraining import distill_pretraining  # torch: only when the command runs

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    settings = settings_from_flags(PretrainSettings, flags, model="bert-base")
    distill_settings = DistillSettings(**{name: flags.pop(name) for name in GENERAL})
    report_pretraining(distill_pretraining(settings, settings_from_flags(TrainConfig, flags), distill_settings),
                       settings)
