"""Task distillation: a smaller student trained on a fine-tuned teacher's outputs, one run per seed, reported
against the teacher (accuracy kept, speed on this machine) and, if asked, against the same student trained on the
labels alone.

    run_distillation(kind, train_path, dev_paths, settings, distill) -> results     files in, OUTPUT/best out
    student_source(distill, teacher, tokenizer, teacher_dir) -> StudentPlan          --student, read once
    measure_speed(models, features, ...) -> {name: examples/s}                        same process, alternating

The run, in order: the teacher (`load_finetuned`: its task is the student's), the student (`StudentPlan`: a copy of
teacher layers, a preset or a checkpoint with the teacher's vocabulary), the training file and dev files read with
the teacher's task, the extra inputs (--unlabeled, --augment), the teacher's outputs on every training input
(`bertkit.workflows.teacher_outputs`: once, kept in OUTPUT/teacher-outputs), then fine-tuning's seeds
(`bertkit.workflows.finetune.finetune`) with the distillation objective (`bertkit.tasks.distillation`); with
--compare-without-teacher the same student is fine-tuned on the labels alone in OUTPUT/without-teacher; last the
teacher is scored on the first dev set and both models' inference rates measured in this process.

Design decision: distillation is fine-tuning with another `SeedRecipe`, so seeds, evaluation, the best kept as
OUTPUT/best, exact resume, torchrun and precision are fine-tuning's, and OUTPUT/best is an ordinary fine-tuned
directory (plus distillation.json, its lineage). Whatever the student starts from, every seed starts from the same
weights (a preset: the seed's random ones), and so does the comparison without a teacher.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import random
import re
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from bertkit.config import PRESETS, BertConfig, check_model_directory, preset
from bertkit.data.augment import augmented_features
from bertkit.data.conll import TaggedSentence
from bertkit.data.glue import TextExample
from bertkit.data.text_inputs import iter_lines
from bertkit.errors import BertkitError
from bertkit.inference.batching import model_outputs
from bertkit.inference.positions import PRETRAINING_FILE, trained_positions
from bertkit.io.atomic import check_outside, write_text_atomic
from bertkit.io.bounded import file_present
from bertkit.io.columnar import is_table_input
from bertkit.io.jsonfile import read_json_object
from bertkit.io.textfile import format_suffix
from bertkit.model import accelerate_for_inference
from bertkit.model.feature_based import FeatureBasedModel
from bertkit.model.student import student_from_teacher, uniform_layer_map, width_projection
from bertkit.runtime.device import apply_threads
from bertkit.settings import (
    UNLABELED_KINDS,
    DistillSettings,
    FinetuneSettings,
    every_other_layer,
    student_layers,
)
from bertkit.tasks.distillation import (
    LABELLED_KEY,
    SOFT_MASK_KEY,
    TEACHER_KEY,
    DistillationLoss,
    DistillationModel,
    LossWeights,
    collate_distillation,
)
from bertkit.tasks.finetuned import load_finetuned, read_task_file
from bertkit.tasks.task import Task, warn_skipped
from bertkit.tokenizer import WordPieceTokenizer
from bertkit.train.distributed import DistributedContext, barrier, setup_distributed
from bertkit.workflows.finetune import (
    ModelSource,
    SeedRecipe,
    finetune,
    model_source,
    read_files,
    warn_at_majority,
)
from bertkit.workflows.predict import RESULTS_FILE, predict_features, write_results
from bertkit.workflows.recipes import pretraining_history
from bertkit.workflows.run_output import DISTILLATION_PATHS, data_fingerprint, data_record, stops_between_loops
from bertkit.workflows.seeds import check_without_dev
from bertkit.workflows.significance import compare_seeds
from bertkit.workflows.teacher_outputs import teacher_outputs, weights_sha256

log = logging.getLogger(__name__)

LINEAGE_FILE = "distillation.json"
"""Beside the student's weights in OUTPUT/best: its teacher, starting point, objective, data and report."""
TEACHER_OUTPUTS, WITHOUT_TEACHER = DISTILLATION_PATHS
SPEED_FEATURES = 256
"""Dev inputs the speed comparison runs (the first ones)."""
SPEED_ROUNDS = 5
"""Timed rounds per model, taking turns; the median counts."""
ROUND_S = 0.5
"""A round lasts at least this long (passes repeated), so timer and scheduler noise stay small beside it."""


@dataclass(frozen=True)
class StudentPlan:
    """Where the student starts: the model source fine-tuning reads, the weights every seed starts from (None: the
    source's own, or a preset's random ones), and what the run records of it."""

    source: ModelSource
    weights: dict[str, torch.Tensor] | None
    description: str
    layers: tuple[int, ...] | None = None
    """The teacher layers the student copies, for a student made from the teacher."""


@stops_between_loops("distillation")
def run_distillation(kind: str, train_path: str | Path, dev_paths: Sequence[str | Path], settings: FinetuneSettings,
                     distill: DistillSettings) -> dict[str, Any]:
    """Distil the teacher into the student (see the module docstring); eval_results.json's content, with the
    distillation report under "distillation"."""
    check_run(settings, distill, bool(dev_paths))
    apply_threads(settings.train.threads)
    ctx = setup_distributed(settings.train.device)
    # the teacher's path is recorded resolved: the same run from any working directory
    distill = dataclasses.replace(distill, teacher=check_teacher(distill.teacher, settings.output))
    check_outside(settings.output, "--student", distill.student)
    task, teacher, tokenizer = _teacher(kind, distill.teacher)
    teacher = teacher.to(ctx.device)
    plan = student_source(distill, teacher, tokenizer, distill.teacher)
    settings = dataclasses.replace(settings, model=plan.description, tokenizer=None)
    report: dict[str, Any] = {}
    train, dev_sets = _read_files(task, train_path, dev_paths, report)
    unlabeled = _read_unlabeled(task, distill)
    report["unlabeled_examples"] = len(unlabeled)
    inputs, labels = data_record(train_path, dev_paths)
    weights = LossWeights(distill.soft_weight, distill.hard_weight, distill.hidden_weight, distill.temperature,
                          distill.attention_weight)
    _check_attention(weights, teacher, plan)
    warn_not_smaller(teacher, plan.source.config)
    recipe = _recipe(task, teacher, tokenizer, plan, weights, distill, unlabeled, settings, ctx, report)
    log.info("distilling %s into %s: soft targets x %g at temperature %g, labels x %g, hidden states x %g, "
             "attention x %g", distill.teacher, plan.description, weights.soft, weights.temperature, weights.hard,
             weights.hidden, weights.attention)
    results = finetune(task, settings, tokenizer, train, dev_sets, report, inputs, labels, plan.source, recipe)
    baseline = None
    if distill.compare_without_teacher:
        baseline = finetune(task, dataclasses.replace(settings, output=settings.output / WITHOUT_TEACHER), tokenizer,
                            train, dev_sets, {}, inputs, labels, plan.source, SeedRecipe(wrap=_starting(plan)))
    results["distillation"] = distillation_report(task, teacher, tokenizer, dev_sets, settings, results, baseline,
                                                  plan, distill, ctx)
    if ctx.is_main:
        warn_at_majority(results)
        write_results(settings.output / RESULTS_FILE, results)
        lineage = {**recipe.record["distillation"], "unlabeled_file": str(distill.unlabeled or "") or None,
                   "report": results["distillation"]}
        write_text_atomic(settings.output / "best" / LINEAGE_FILE, json.dumps(lineage, indent=2) + "\n")
    return results


def check_run(settings: FinetuneSettings, distill: DistillSettings, dev: bool) -> None:
    """Refuse, before anything is read, what a distillation cannot do: a student that is not fully trained (a
    frozen encoder, a feature-based head), or what only a dev set can do."""
    if settings.freeze_encoder or settings.feature_layers:
        raise BertkitError("a distilled student trains its whole encoder: leave --freeze-encoder and "
                           "--feature-layers out")
    if settings.train.head_warmup_steps or settings.train.encoder_lr_ratio != 1.0:
        raise BertkitError("--head-warmup-steps and --encoder-lr-ratio are fine-tuning's; a distilled student trains "
                           "all its weights at one rate: leave them out")
    if not dev:
        if distill.compare_without_teacher:
            raise BertkitError("--compare-without-teacher compares dev scores: give --dev")
        check_without_dev(settings)


def _read_files(task: Task, train_path: str | Path, dev_paths: Sequence[str | Path], report: dict[str, Any]
                ) -> tuple[list[Any], list[tuple[str, Sequence[Any]]]]:
    """Fine-tuning's `read_files` with the teacher's task; a refusal says that the columns are the teacher's (the
    column flags a reader's message may name are `finetune`'s, not distill's)."""
    try:
        return read_files(task, train_path, dev_paths, report)
    except BertkitError as exc:
        raise _in_distills_terms(task, exc) from None


_FINETUNE_HINTS = re.compile(r"; (is --task right for this training file\?|choose with --text-column/[^;(]*)")
"""The fixes a reader's message offers in `finetune`'s flags, which distill does not have."""


def _in_distills_terms(task: Task, exc: BertkitError) -> BertkitError:
    """A reader's refusal with its `finetune` flags left out and what distill reads said instead: the teacher's
    columns and labels (a distilled student's files are read as the teacher's were)."""
    found = task.to_json()
    columns = {k: v for k, v in found.items() if k.endswith("_column") and v is not None}
    named = ", ".join(f"{k.replace('_', ' ')} {v!r}" for k, v in columns.items())
    labels = found.get("labels")
    said = "; ".join(part for part in (
        f"the teacher's columns: {named}" if named else "",
        f"its labels: {', '.join(map(str, labels[:10]))}{', ...' if len(labels) > 10 else ''}" if labels else ""
    ) if part)
    message = _FINETUNE_HINTS.sub("", str(exc))
    return BertkitError(f"{message} (distill reads files as its teacher was trained on them: {said})" if said else
                        message)


def check_teacher(teacher: Path, output: Path) -> Path:
    """The teacher's model directory (named by --teacher in every message), refusing a preset name and an --output
    that holds it (--overwrite would delete the teacher, and the student would name itself as its teacher)."""
    if not teacher.exists() and str(teacher) in PRESETS:
        raise BertkitError(f"--teacher {teacher} is a preset (random weights): a teacher is a trained model "
                           "directory (`bertkit finetune`'s OUTPUT/best, `bertkit pretrain`'s final/)")
    directory = check_model_directory(teacher, "--teacher").resolve()
    out = output.resolve()
    if out == directory or out in directory.parents:
        raise BertkitError(f"--output {output} holds the teacher ({directory}); write the student elsewhere")
    return directory


def _teacher(kind: str, directory: Path) -> tuple[Task, nn.Module, WordPieceTokenizer]:
    """The teacher's task, model (eval mode) and vocabulary; a model of another kind, or feature-based, is refused."""
    if read_task_file(directory) is None and file_present(directory / "modules.json"):
        raise BertkitError(f"--teacher {directory} is a sentence-embedding model; distil it with `bertkit distill "
                           "embedding`")
    task, model, tokenizer = load_finetuned(directory)
    if task.kind != kind:
        raise BertkitError(f"--teacher {directory} is a {task.kind} model; run `bertkit distill {task.kind}`")
    if isinstance(model, FeatureBasedModel):
        raise BertkitError(f"--teacher {directory} is feature-based (a frozen encoder and a head over its layers); "
                           "distil a fully fine-tuned model")
    return task, model, tokenizer


def student_source(distill: DistillSettings, teacher: nn.Module, tokenizer: WordPieceTokenizer,
                   teacher_dir: Path) -> StudentPlan:
    """The student `--student` names: teacher layers (`layers:...`, or every other one when unset), a preset, or a
    checkpoint directory whose vocabulary is the teacher's (the soft targets of tagging and SQuAD are per token)."""
    config: BertConfig = teacher.config  # type: ignore[assignment]
    spec = distill.student
    kept = read_json_object(teacher_dir / PRETRAINING_FILE, missing={}, damaged={})
    if spec is None or spec.startswith("layers:"):
        layers = every_other_layer(config.num_hidden_layers) if spec is None else student_layers(
            spec, config.num_hidden_layers)
        student = student_from_teacher(teacher, layers)
        source = ModelSource(None, cast(BertConfig, student.config), tokenizer, pretraining_history(kept),
                             trained_positions(kept))
        return StudentPlan(source, student.state_dict(), f"teacher layers {','.join(map(str, layers))}", layers)
    if spec in PRESETS:
        return StudentPlan(ModelSource(None, preset(spec), tokenizer, None), None, spec)
    directory = check_model_directory(spec, "--student", presets=True)
    source = model_source(FinetuneSettings(model=str(directory), output=Path(".")))
    if source.tokenizer.vocab_hash != tokenizer.vocab_hash:
        raise BertkitError(f"--student {directory}: its vocabulary is not the teacher's ({teacher_dir}); a student "
                           "reads the teacher's token ids: start it from the teacher (--student layers:...), a "
                           "preset, or a checkpoint with the teacher's vocab.txt")
    return StudentPlan(source, None, str(directory))


def warn_not_smaller(teacher: nn.Module, student: BertConfig) -> None:
    """Say so when the student is no smaller than its teacher (no faster to run: a layer list of every teacher
    layer, a larger preset)."""
    config = cast(BertConfig, teacher.config)
    # an encoder layer's cost grows with its width squared (the dense layers)
    if student.num_hidden_layers * student.hidden_size ** 2 >= config.num_hidden_layers * config.hidden_size ** 2:
        log.warning("the student (%d layers, width %d) is no smaller than the teacher (%d layers, width %d): it will "
                    "not run faster; --student layers:0,2,... or a smaller preset makes a cheaper one",
                    student.num_hidden_layers, student.hidden_size, config.num_hidden_layers, config.hidden_size)


def _check_attention(weights: LossWeights, teacher: nn.Module, plan: StudentPlan) -> None:
    """Attention distributions compare head by head: the student needs the teacher's number of heads."""
    config = cast(BertConfig, teacher.config)
    if (weights.hidden or weights.attention) and plan.source.config.num_hidden_layers > config.num_hidden_layers:
        raise BertkitError(f"--hidden-weight/--attention-weight: the student ({plan.description}) has more layers "
                           f"({plan.source.config.num_hidden_layers}) than the teacher ({config.num_hidden_layers}); "
                           "the layer map matches each student layer to a deeper teacher layer: give a shallower "
                           "student, or leave both weights at 0")
    heads = config.num_attention_heads
    if weights.attention > 0 and plan.source.config.num_attention_heads != heads:
        raise BertkitError(f"--attention-weight {weights.attention:g}: the student ({plan.description}) has "
                           f"{plan.source.config.num_attention_heads} attention heads and the teacher {heads}; "
                           "attention distributions compare head by head: give a student with the teacher's heads, "
                           "or --attention-weight 0")


def _starting(plan: StudentPlan) -> Callable[[nn.Module], nn.Module]:
    """The seed's task model with the plan's starting weights (the head's too, for a copy of the teacher)."""
    def wrap(model: nn.Module) -> nn.Module:
        if plan.weights is not None:
            model.load_state_dict(plan.weights)
        return model
    return wrap


def _recipe(task: Task, teacher: nn.Module, tokenizer: WordPieceTokenizer, plan: StudentPlan, weights: LossWeights,
            distill: DistillSettings, unlabeled: list[Any], settings: FinetuneSettings, ctx: DistributedContext,
            report: dict[str, Any]) -> SeedRecipe:
    """Fine-tuning's seeds with the distillation objective: the student (and a width projection) trains on the
    training features, the extra ones, and the teacher's outputs on all of them."""
    teacher_config: BertConfig = teacher.config  # type: ignore[assignment]
    student_config = plan.source.config
    layer_map = uniform_layer_map(student_config.num_hidden_layers, teacher_config.num_hidden_layers)
    start = _starting(plan)

    def wrap(model: nn.Module) -> nn.Module:
        # a projection only where the hidden-state term reads it (DDP refuses a parameter that gets no gradient)
        projection = width_projection(student_config.hidden_size, teacher_config.hidden_size) if weights.hidden \
            else nn.Identity()
        return DistillationModel(start(model), projection)

    def extend(features: list[dict]) -> list[dict]:
        augmented = augmented_features(features, distill.augment, random.Random(settings.seeds[0]),
                                       tokenizer.mask_token_id, tokenizer.special_token_ids,
                                       ngrams=task.kind == "classification") if distill.augment else []
        report["augmented_examples"] = len(augmented)
        extra = augmented + (task.features(unlabeled, tokenizer) if unlabeled else [])
        everything = [{**f, LABELLED_KEY: True} for f in features] + [_unlabelled(f, features[0]) for f in extra]
        if task.kind == "tagging":  # the teacher's tags are targets at first sub-tokens only, as its labels were
            everything = [{**f, SOFT_MASK_KEY: [int(w is not None) for w in f["word_positions"]]}
                          for f in everything]
        if weights.soft == 0:
            return everything
        outputs = teacher_outputs(teacher, task, everything, settings.output / TEACHER_OUTPUTS,
                                  tokenizer.pad_token_id, settings.eval_batch_size, ctx.device, str(distill.teacher),
                                  ctx)
        return [{**f, TEACHER_KEY: o} for f, o in zip(everything, outputs)]

    record = {"teacher": str(distill.teacher), "teacher_weights": weights_sha256(teacher),
              "student": plan.description, "layers": plan.layers,
              "layer_map": layer_map if weights.hidden or weights.attention else None, **dataclasses.asdict(weights),
              "unlabeled": data_fingerprint(distill.unlabeled) if distill.unlabeled else None,
              "max_unlabeled": distill.max_unlabeled, "augment": distill.augment}
    return SeedRecipe(wrap=wrap, export=_student_of,
                      loss=lambda task: DistillationLoss(
                          task, weights, teacher if weights.hidden or weights.attention else None, layer_map),
                      extend=extend, collate=collate_distillation, record={"distillation": record})


def _student_of(model: nn.Module) -> nn.Module:
    """The student inside the DistillationModel that trains: what is evaluated and saved."""
    assert isinstance(model, DistillationModel)  # what `_recipe`'s wrap made
    return model.student


def _unlabelled(feature: dict[str, Any], template: dict[str, Any]) -> dict[str, Any]:
    """A feature without gold labels: the label fields a labelled feature has, as placeholders the hard loss skips
    (-100 per token, 0 per example), and `labelled` False."""
    out = {**feature, LABELLED_KEY: False}
    for key in ("labels", "start_positions", "end_positions"):
        if key in template:
            out[key] = [-100] * len(feature["input_ids"]) if isinstance(template[key], list) else 0
    return out


TABLE_SUFFIXES = (".jsonl", ".json", ".csv", ".tsv")
"""--unlabeled files read by the teacher's columns (as the training file is), not as lines of text."""


def _read_unlabeled(task: Task, distill: DistillSettings) -> list[Any]:
    """--unlabeled as the task's examples without labels, the first --max-unlabeled of them: a table (JSONL, CSV,
    TSV, Parquet, `datasets`) by the teacher's columns; for tagging a CoNLL file (one word a line, with or without
    tags) or one sentence a line; else one text (or 'a ||| b' pair) a line. Blank lines are skipped and counted."""
    if distill.unlabeled is None:
        if distill.augment and task.kind not in UNLABELED_KINDS:
            raise BertkitError(f"--augment: {task.kind} inputs cannot be augmented (a question and its context); "
                               f"it extends {' and '.join(UNLABELED_KINDS)}")
        return []
    if task.kind not in UNLABELED_KINDS:
        raise BertkitError(f"--unlabeled: a {task.kind} input is not a line of text; --unlabeled extends "
                           f"{' and '.join(UNLABELED_KINDS)} tasks")
    path = distill.unlabeled
    if is_table_input(path) or format_suffix(path) in TABLE_SUFFIXES:
        try:
            examples, skipped = task.read(path, labelled=False)
        except BertkitError as exc:
            raise _in_distills_terms(task, exc) from None
        warn_skipped(path, examples, skipped)
    elif task.kind == "tagging":
        examples = _tagging_lines(task, path)
    else:
        examples = _text_lines(task, path, distill.max_unlabeled)
    if not examples:
        raise BertkitError(f"--unlabeled {path}: no inputs in it; write one text per line")
    return examples[:distill.max_unlabeled] if distill.max_unlabeled else examples


def _text_lines(task: Task, path: Path, limit: int | None) -> list[TextExample]:
    """One classification input per non-blank line, the first `limit` (None: all) of them; a pair teacher reads
    'a ||| b' lines, a single-text one none."""
    pairs = getattr(task.settings, "text_pair_column", None) is not None
    examples: list[TextExample] = []
    blank = 0
    for number, a, b in iter_lines(path, "--unlabeled"):  # read as far as `limit` needs
        if not a.strip() and not (b or "").strip():
            blank += 1
            continue
        if (b is not None) != pairs:
            raise BertkitError(f"{path}:{number}: the teacher reads {'pairs' if pairs else 'single texts'}; write "
                               f"{'text_a ||| text_b' if pairs else 'one text per line without |||'}")
        examples.append(TextExample(f"{path}:{number}", a, b, None))
        if len(examples) == limit:
            break
    if blank:
        log.info("%s: %d blank line(s) skipped", path, blank)
    return examples


def _tagging_lines(task: Task, path: Path) -> list[TaggedSentence]:
    """A tagging --unlabeled text file: CoNLL (one word a line, blank lines between sentences; a line's other columns,
    tags of any tag set included, are ignored) when every line is one word or ends with a tag-like column (O, B-X,
    I-X, ...); any other text, one sentence a line, words split on white space. Which reading was chosen is said."""
    lines = [(n, a) for n, a, _ in iter_lines(path, "--unlabeled") if a]
    if all(len(a.split()) == 1 or _TAG.match(a.split()[-1]) for _, a in lines):
        sentences = list(task.read(path, labelled=False)[0])
        columns = sum(len(a.split()) > 1 for _, a in lines)
        log.info("--unlabeled %s read as CoNLL: %d sentences, a word a line%s", path, len(sentences),
                 f" (the other columns of {columns} line(s) not read: if they are sentences, write one a line "
                 "without a tag-like last word)" if columns else "")
        return sentences
    for number, line in lines:
        if "|||" in line:
            raise BertkitError(f"{path}:{number}: ' ||| ' in a tagging --unlabeled line; a tagger reads one "
                               "sentence a line")
    log.info("--unlabeled %s read as one sentence a line: %d sentences", path, len(lines))
    return [TaggedSentence(a.split(), None, f"{path}:{n}") for n, a in lines]


_TAG = re.compile(r"^(O|[BIESLU]-\S+)$")
"""A CoNLL tag column (the BIO, IOBES and BILOU schemes)."""


# --- the report -----------------------------------------------------------------------------------------------

def distillation_report(task: Task, teacher: nn.Module, tokenizer: WordPieceTokenizer,
                        dev_sets: list[tuple[str, Sequence[Any]]], settings: FinetuneSettings,
                        results: dict[str, Any], baseline: dict[str, Any] | None, plan: StudentPlan,
                        distill: DistillSettings, ctx: DistributedContext) -> dict[str, Any]:
    """The teacher's score on the first dev set, the share of it the student keeps (mean over seeds), both models'
    sizes and inference rates on this machine, and the comparison without a teacher."""
    _, student, _ = load_finetuned(settings.output / "best", ctx.device)
    report: dict[str, Any] = {"teacher": str(distill.teacher), "student": plan.description,
                              "teacher_parameters": teacher.num_parameters(),  # type: ignore[operator]
                              "student_parameters": student.num_parameters(),  # type: ignore[operator]
                              "teacher_layers": teacher.config.num_hidden_layers,  # type: ignore[union-attr]
                              "student_layers": student.config.num_hidden_layers}  # type: ignore[union-attr]
    main = task.metric_names[0]
    if dev_sets:
        _, examples = dev_sets[0]
        features = task.features(examples, tokenizer)
        decoded = task.select_on_dev(examples, predict_features(teacher, task, examples, features,
                                                                tokenizer.pad_token_id, settings.eval_batch_size,
                                                                ctx.device, ctx))
        teacher_scores = task.score(examples, decoded)
        report |= kept_report(main, teacher_scores[main], results)
        if ctx.is_main:  # timed alone: under torchrun on one machine the other processes would share its CPU
            report |= speed_report(measure_speed({"teacher": teacher, "student": student}, features[:SPEED_FEATURES],
                                                 task.output_names, settings.eval_batch_size, tokenizer.pad_token_id,
                                                 ctx.device))
        barrier(ctx)
        if baseline is not None:
            report["without_teacher"] = without_teacher_report(main, results, baseline)
    return report


def kept_report(main: str, teacher_score: float, results: dict[str, Any]) -> dict[str, Any]:
    """The teacher's score on the first dev set, the student's mean over its seeds, and their ratio."""
    student_mean = results["summary"][main]["mean"]
    return {"metric": main, "teacher_score": teacher_score, "student_mean": student_mean,
            "kept": student_mean / teacher_score if teacher_score else None}


def speed_report(rates: dict[str, float]) -> dict[str, float]:
    """`measure_speed`'s rates of the teacher and the student, and their ratio."""
    return {"teacher_examples_per_s": rates["teacher"], "student_examples_per_s": rates["student"],
            "speedup": rates["student"] / rates["teacher"]}


def without_teacher_report(main: str, results: dict[str, Any], baseline: dict[str, Any]) -> dict[str, Any]:
    """The same student trained without the teacher: its seeds' `main`, their mean, and the distilled seeds'
    difference from them with Welch's p (`bertkit.workflows.significance`)."""
    without = [m[main] for m in baseline["seeds"].values()]
    comparison = compare_seeds([m[main] for m in results["seeds"].values()], without)
    return {"mean": statistics.fmean(without), "seeds": without, "difference": comparison.difference,
            "p_value": comparison.p_value, "note": comparison.note}


def measure_speed(models: dict[str, nn.Module], features: Sequence[dict[str, Any]], names: Sequence[str],
                  batch_size: int, pad_token_id: int, device: torch.device) -> dict[str, float]:
    """Examples per second of each model on `features` as `bertkit predict` runs them (`accelerate_for_inference`,
    length-sorted batches, outputs `names` brought back): a warm-up pass each, which also sets how many passes make
    one timed round (at least `ROUND_S` of the slowest), then `SPEED_ROUNDS` rounds taking turns (so a busy moment
    of the machine falls on both), the median round of each."""
    ready = {name: accelerate_for_inference(model.eval()) for name, model in models.items()}

    def one_pass(model: nn.Module) -> float:
        started = time.perf_counter()
        model_outputs(model, features, names, (), batch_size, pad_token_id, device)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - started

    slowest = max(one_pass(model) for model in ready.values())
    passes = max(1, math.ceil(ROUND_S / max(slowest, 1e-6)))
    times: dict[str, list[float]] = {name: [] for name in ready}
    for _ in range(SPEED_ROUNDS):
        for name, model in ready.items():
            times[name].append(sum(one_pass(model) for _ in range(passes)))
    return {name: passes * len(features) / statistics.median(seconds) for name, seconds in times.items()}
