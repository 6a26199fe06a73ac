"""General distillation (`bertkit distill pretraining`): a student pre-trained on a teacher's masked-LM outputs,
DistilBERT's way, on a `bertkit data pretraining` directory; its final/ is an ordinary pre-trained checkpoint that
`finetune` and `distill` take.

    distill_pretraining(settings, train, distill) -> FitResult

The run is `bertkit pretrain`'s (`bertkit.workflows.pretrain.pretrain`: the plan, recipe, data, held-out
evaluation, checkpoints, exact resume, torchrun) with the objective replaced by
`bertkit.tasks.distillation.MaskedLMDistillation` and the student as its starting point: every other teacher layer
(or `layers:...`) written to OUTPUT/student-init and continued from (`--init-from`), or a preset from scratch, or a
checkpoint with the teacher's vocabulary. Masked LM only: DistilBERT drops next sentence prediction.

Design decision: the teacher is a masked-LM model (`BertForMaskedLM` of a checkpoint with its MLM head; a
fine-tuned task model has none and is refused); the cosine term compares last hidden states, so it needs the
student at the teacher's width (DistilBERT's setting). The objective's settings are part of the run's identity,
so a resumed run with another temperature or weight is refused unless `--allow-change distillation`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import cast

from bertkit.config import PRESETS, BertConfig, check_model_directory, load_config
from bertkit.data.shards import read_manifest
from bertkit.errors import BertkitError
from bertkit.io.atomic import check_outside, write_text_atomic
from bertkit.model import BertForMaskedLM
from bertkit.model.student import student_from_teacher
from bertkit.settings import DistillSettings, PretrainSettings, TrainConfig, every_other_layer, student_layers
from bertkit.tasks.distillation import LossWeights, MaskedLMDistillation
from bertkit.tokenizer import WordPieceTokenizer
from bertkit.train import FitResult
from bertkit.train.distributed import DistributedContext, barrier, setup_distributed
from bertkit.workflows.distill import LINEAGE_FILE, check_teacher, warn_not_smaller
from bertkit.workflows.pretrain import pretrain
from bertkit.workflows.teacher_outputs import weights_sha256

log = logging.getLogger(__name__)

STUDENT_INIT = "student-init"


def distill_pretraining(settings: PretrainSettings, train: TrainConfig, distill: DistillSettings) -> FitResult:
    """Pre-train the student on the teacher's masked-LM outputs (see the module docstring); OUTPUT/final gets
    distillation.json, its lineage."""
    ctx = setup_distributed(train.device)
    teacher_dir = check_teacher(distill.teacher, Path(settings.output))
    check_outside(Path(settings.output), "--student", distill.student)
    teacher = _teacher(teacher_dir)
    tokenizer = WordPieceTokenizer.from_pretrained(teacher_dir)
    _check_data_vocabulary(settings, tokenizer, teacher_dir)  # before the student's starting point is written
    settings, description = _student(settings, distill, teacher, tokenizer, teacher_dir, ctx)
    config: BertConfig = teacher.config
    if settings.init_from is not None:
        warn_not_smaller(teacher, BertConfig.from_json_file(Path(settings.init_from) / "config.json"))
    if distill.hidden_weight > 0 and _student_width(settings) not in (None, config.hidden_size):
        raise BertkitError(f"--hidden-weight {distill.hidden_weight:g}: the cosine of last hidden states needs the "
                           f"student at the teacher's width ({config.hidden_size}); give --hidden-weight 0, or a "
                           "student of that width")
    weights = LossWeights(distill.soft_weight, distill.hard_weight, distill.hidden_weight, distill.temperature)
    record = {"teacher": str(teacher_dir), "teacher_weights": weights_sha256(teacher), "student": description,
              **dataclasses.asdict(weights)}
    log.info("general distillation of %s into %s: soft targets x %g at temperature %g, masked LM x %g, cosine of "
             "last hidden states x %g", teacher_dir, description, weights.soft, weights.temperature, weights.hard,
             weights.hidden)
    result = pretrain(settings, dataclasses.replace(train, compile=False),
                      objective=lambda run_ctx: MaskedLMDistillation(teacher.to(run_ctx.device), weights),
                      identity={"distillation": record})
    final = Path(settings.output) / "final"
    if ctx.is_main and result.stop_reason == "budget" and final.is_dir():
        write_text_atomic(final / LINEAGE_FILE, json.dumps(record, indent=2) + "\n")
    return result


def _check_data_vocabulary(settings: PretrainSettings, tokenizer: WordPieceTokenizer, teacher_dir: Path) -> None:
    """The data must be made with the teacher's vocabulary (the student reads it with the teacher's); said in
    distill's flags (pre-training names --tokenizer, which distill has not)."""
    made_with = read_manifest(Path(settings.data)).get("tokenizer", {}).get("vocab_hash")
    if made_with != tokenizer.vocab_hash:
        raise BertkitError(f"--data {settings.data} was made with another vocabulary than the teacher's "
                           f"({teacher_dir}: sha256 differs); build it with `bertkit data pretraining --tokenizer "
                           f"{teacher_dir}`")


def _teacher(directory: Path) -> BertForMaskedLM:
    """The teacher's masked-LM model; one without MLM head weights (a fine-tuned task model) is refused."""
    teacher = BertForMaskedLM.from_pretrained(directory)
    missing = [name for name in getattr(teacher, "newly_initialized", []) if name.startswith("mlm.")]
    if missing:
        raise BertkitError(f"--teacher {directory}: no masked-LM head ({', '.join(missing[:3])} missing); general "
                           "distillation needs a pre-trained checkpoint with its MLM head (`bertkit pretrain`'s "
                           "final/, bert-base-uncased); a fine-tuned model is distilled with `bertkit distill <task>`")
    return teacher.eval()


def _student(settings: PretrainSettings, distill: DistillSettings, teacher: BertForMaskedLM,
             tokenizer: WordPieceTokenizer, teacher_dir: Path, ctx: DistributedContext) -> tuple[PretrainSettings, str]:
    """The pre-training settings that start from the student, masked LM only, and the student's description."""
    spec = distill.student
    settings = dataclasses.replace(settings, nsp=False, tokenizer=str(teacher_dir))
    if spec is None or spec.startswith("layers:"):
        layers = every_other_layer(teacher.config.num_hidden_layers) if spec is None else student_layers(
            spec, teacher.config.num_hidden_layers)
        init = Path(settings.output) / STUDENT_INIT
        if ctx.is_main:
            cast(BertForMaskedLM, student_from_teacher(teacher, layers)).save_pretrained(init, tokenizer=tokenizer)
        barrier(ctx)
        return dataclasses.replace(settings, init_from=str(init)), f"teacher layers {','.join(map(str, layers))}"
    if spec in PRESETS:
        return dataclasses.replace(settings, model=spec, init_from=None), spec
    student = WordPieceTokenizer.from_pretrained(check_model_directory(spec, "--student"))
    if student.vocab_hash != tokenizer.vocab_hash:
        raise BertkitError(f"--student {spec}: its vocabulary is not the teacher's ({teacher_dir}); the soft targets "
                           "are over the teacher's vocabulary")
    return dataclasses.replace(settings, init_from=spec), spec


def _student_width(settings: PretrainSettings) -> int | None:
    """The student's hidden size: its --init-from's config, or the preset's."""
    if settings.init_from is not None:
        return BertConfig.from_json_file(Path(settings.init_from) / "config.json").hidden_size
    return load_config(settings.model).hidden_size if settings.model else None

