"""Embedding distillation (`bertkit distill embedding`): a smaller sentence encoder trained to give a teacher's
sentence vectors, scored by retrieval on dev pairs as `bertkit finetune embedding` scores, and kept as a
sentence-transformers directory.

    run_embedding_distillation(train_path, dev_paths, settings, embedding, distill) -> results

The texts are every text of the training pairs (anchors, positives, negatives) and --unlabeled's lines; the
teacher's vectors of them are computed once and kept (`bertkit.workflows.teacher_outputs`); the loss is the mean
squared error between the student's and the teacher's vectors (Reimers and Gurevych 2020, section 2), so the
student lands in the teacher's vector space (its index, its similarity threshold keep working). The seeds,
retrieval scoring, best-keeping and resume are `finetune embedding`'s (`EncoderRecipe`); with
--compare-without-teacher the same student is trained on the pairs alone (in-batch negatives) in
OUTPUT/without-teacher.

Design decision: the student keeps the teacher's width (the vectors are compared directly, and a
sentence-transformers directory of another width would need a Dense module): every other teacher layer by
default, chosen layers, or a preset or checkpoint of that width with the teacher's vocabulary; the teacher's
pooling, normalisation and length are the student's.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar, cast

import torch
import torch.nn.functional as F
from torch import nn

from bertkit.config import PRESETS, BertConfig, check_model_directory, preset
from bertkit.data.pairs import PairExample
from bertkit.data.text_inputs import iter_lines
from bertkit.errors import BertkitError
from bertkit.interop.sentence_transformers import read_sentence_transformers
from bertkit.io.atomic import check_outside, write_text_atomic
from bertkit.io.textfile import format_suffix
from bertkit.model import BertModel
from bertkit.model.student import student_from_teacher
from bertkit.runtime.device import apply_threads
from bertkit.settings import DistillSettings, EmbeddingSettings, FinetuneSettings, every_other_layer, student_layers
from bertkit.tasks.distillation import TEACHER_KEY, collate_distillation
from bertkit.tasks.embedding import METRIC_NAMES, DevPairs, SentenceEncoder, evaluate_retrieval
from bertkit.tokenizer import WordPieceTokenizer
from bertkit.workflows.distill import (
    LINEAGE_FILE,
    SPEED_FEATURES,
    TABLE_SUFFIXES,
    TEACHER_OUTPUTS,
    WITHOUT_TEACHER,
    check_run,
    check_teacher,
    kept_report,
    measure_speed,
    speed_report,
    warn_not_smaller,
    without_teacher_report,
)
from bertkit.workflows.embedding import (
    EncoderRecipe,
    as_starting_directory,
    check_settings,
    one_process,
    read_pair_files,
    train_encoder_seeds,
)
from bertkit.workflows.finetune import ModelSource
from bertkit.workflows.predict import RESULTS_FILE, write_results
from bertkit.workflows.run_output import data_fingerprint, data_record, stops_between_loops
from bertkit.workflows.teacher_outputs import teacher_outputs, weights_sha256

log = logging.getLogger(__name__)

VECTOR = "sentence_embedding"


class _Vectors(nn.Module):
    """A sentence encoder as `model_outputs` reads a model: its vectors under the output name `VECTOR`."""

    output_names: ClassVar[tuple[str, ...]] = (VECTOR,)
    token_level_outputs: ClassVar[tuple[str, ...]] = ()

    def __init__(self, encoder: nn.Module) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None) -> Any:
        return _Out(self.encoder(input_ids, token_type_ids, attention_mask))


@dataclasses.dataclass
class _Out:
    sentence_embedding: torch.Tensor


def vector_loss(model: nn.Module, batch: dict[str, Any]) -> tuple[torch.Tensor, dict[str, float]]:
    """The mean squared error between the student's vectors and the teacher's (a per-text mean)."""
    vectors = model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])  # (B, H)
    return F.mse_loss(vectors.float(), batch[TEACHER_KEY][VECTOR].float()), {}


@stops_between_loops("distillation")
def run_embedding_distillation(train_path: str | Path, dev_paths: Sequence[str | Path], settings: FinetuneSettings,
                               embedding: EmbeddingSettings, distill: DistillSettings) -> dict[str, Any]:
    """Distil the teacher's sentence vectors into the student (see the module docstring); eval_results.json's
    content with the report under "distillation"."""
    check_run(settings, distill, bool(dev_paths))
    apply_threads(settings.train.threads)
    teacher_dir = check_teacher(distill.teacher, settings.output)
    check_outside(settings.output, "--student", distill.student)
    if read_sentence_transformers(teacher_dir) is None:
        raise BertkitError(f"--teacher {teacher_dir}: not a sentence-transformers directory (no modules.json); "
                           "give a `bertkit finetune embedding` OUTPUT/best or a sentence-transformers model")
    embedding = as_starting_directory(embedding, str(teacher_dir))
    tokenizer = WordPieceTokenizer.from_pretrained(teacher_dir)
    teacher = SentenceEncoder(BertModel.from_pretrained(teacher_dir), embedding.pooling, embedding.normalize).eval()
    source, state, description = _student(distill, teacher.bert, tokenizer, teacher_dir)
    warn_not_smaller(teacher.bert, source.config)
    report: dict[str, Any] = {}
    train, dev_sets = read_pair_files(train_path, dev_paths, embedding, report)
    check_settings(settings, train)
    unlabeled = _unlabeled(distill)
    report["unlabeled_texts"] = len(unlabeled)
    ctx = one_process(settings)
    teacher = teacher.to(ctx.device)
    settings = dataclasses.replace(settings, model=description, tokenizer=None)
    data = data_record(train_path, dev_paths)
    lineage = {"teacher": str(teacher_dir), "teacher_weights": weights_sha256(teacher), "student": description,
               "loss": "mse of sentence vectors",
               "unlabeled": data_fingerprint(distill.unlabeled) if distill.unlabeled else None,
               "max_unlabeled": distill.max_unlabeled}

    def build(settings: FinetuneSettings, embedding: EmbeddingSettings, _: WordPieceTokenizer) -> SentenceEncoder:
        dropout = {"hidden_dropout_prob": settings.dropout, "attention_probs_dropout_prob": settings.dropout}
        bert = BertModel(source.config.replace(vocab_size=tokenizer.vocab_size, **dropout))
        if state is not None:
            bert.load_state_dict(state)
        return SentenceEncoder(bert, embedding.pooling, embedding.normalize)

    def features(pairs: list[PairExample], _: WordPieceTokenizer, max_seq_length: int
                 ) -> tuple[list[dict[str, Any]], int]:
        texts = list(dict.fromkeys([t for p in pairs for t in (p.anchor, p.positive, p.negative) if t] + unlabeled))
        encodings = tokenizer.encode_batch(texts, max_length=max_seq_length)
        rows = [{"input_ids": e.input_ids, "token_type_ids": e.token_type_ids, "attention_mask": e.attention_mask,
                 "labelled": False} for e in encodings]
        vectors = teacher_outputs(_Vectors(teacher), _Vectors, rows, settings.output / TEACHER_OUTPUTS,
                                  tokenizer.pad_token_id, settings.eval_batch_size, ctx.device, str(teacher_dir),
                                  variant=f"pooling {embedding.pooling}, normalize {embedding.normalize}")
        report["distilled_texts"] = len(rows)
        return [{**row, TEACHER_KEY: vector} for row, vector in zip(rows, vectors)], sum(e.truncated for e in encodings)

    recipe = EncoderRecipe(build=build, loss=lambda _: vector_loss, features=features, collate=collate_distillation,
                           record={"distillation": lineage})
    log.info("distilling the sentence vectors of %s into %s (mean squared error)", teacher_dir, description)
    results = train_encoder_seeds(settings, embedding, tokenizer, train, dev_sets, report, ctx, data, source, recipe)
    baseline = None
    if distill.compare_without_teacher:
        baseline = train_encoder_seeds(dataclasses.replace(settings, output=settings.output / WITHOUT_TEACHER),
                                       embedding, tokenizer, train, dev_sets, {}, ctx, data, source,
                                       EncoderRecipe(build=build))
    results["distillation"] = _report(teacher, settings, embedding, tokenizer, dev_sets, results, baseline, lineage,
                                      ctx.device)
    write_results(settings.output / RESULTS_FILE, results)
    write_text_atomic(settings.output / "best" / LINEAGE_FILE,
                      json.dumps({**lineage, "report": results["distillation"]}, indent=2) + "\n")
    return results


def _student(distill: DistillSettings, teacher: BertModel, tokenizer: WordPieceTokenizer, teacher_dir: Path
             ) -> tuple[ModelSource, dict[str, torch.Tensor] | None, str]:
    """(the student's source, the weights every seed starts from or None, its description); one of another width
    or vocabulary is refused."""
    width, spec = teacher.config.hidden_size, distill.student
    if spec is None or spec.startswith("layers:"):
        layers = every_other_layer(teacher.config.num_hidden_layers) if spec is None else student_layers(
            spec, teacher.config.num_hidden_layers)
        student = student_from_teacher(teacher, layers)
        config = cast(BertConfig, student.config)
        description = f"teacher layers {','.join(map(str, layers))}"
        return ModelSource(None, config, tokenizer, {}), student.state_dict(), description
    if spec in PRESETS:
        config, state = preset(spec), None
    else:
        directory = check_model_directory(spec, "--student", presets=True)
        if WordPieceTokenizer.from_pretrained(directory).vocab_hash != tokenizer.vocab_hash:
            raise BertkitError(f"--student {directory}: its vocabulary is not the teacher's ({teacher_dir})")
        config, state = BertConfig.from_json_file(directory / "config.json"), BertModel.from_pretrained(
            directory).state_dict()
    if config.hidden_size != width:
        raise BertkitError(f"--student {spec}: width {config.hidden_size}, the teacher's vectors {width}; an "
                           "embedding student gives the teacher's vectors, so it needs the teacher's width "
                           "(layers:..., or a model of that width)")
    return ModelSource(None, config, tokenizer, {} if state is not None else None), state, spec


def _unlabeled(distill: DistillSettings) -> list[str]:
    """--unlabeled's texts: one a non-blank line of a text file (a pair line is refused: a sentence encoder reads
    one text), or a Parquet / `datasets` table's `text` column."""
    path = distill.unlabeled
    if path is None:
        return []
    if format_suffix(path) in TABLE_SUFFIXES:
        raise BertkitError(f"--unlabeled {path}: give one text per line (.txt), or a Parquet or `datasets` table "
                           "with a 'text' column")
    texts: list[str] = []
    blank = 0
    for number, text, pair in iter_lines(path, "--unlabeled"):  # read as far as --max-unlabeled needs
        if pair is not None:
            raise BertkitError(f"{path}:{number}: ' ||| ' in an --unlabeled line; a sentence encoder reads one text a "
                               "line")
        if not text:
            blank += 1
            continue
        texts.append(text)
        if len(texts) == distill.max_unlabeled:
            break
    if blank:
        log.info("%s: %d blank line(s) skipped", path, blank)
    if not texts:
        raise BertkitError(f"--unlabeled {path}: no text in it; write one text per line")
    return texts


def _report(teacher: SentenceEncoder, settings: FinetuneSettings, embedding: EmbeddingSettings,
            tokenizer: WordPieceTokenizer, dev_sets: list[DevPairs], results: dict[str, Any],
            baseline: dict[str, Any] | None, lineage: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """The teacher's retrieval on the first dev set, the share of it the student keeps, both encoders' sizes and
    rates on this machine, and the comparison without a teacher."""
    student_bert = BertModel.from_pretrained(settings.output / "best")
    student = SentenceEncoder(student_bert, embedding.pooling, embedding.normalize).to(device).eval()
    report: dict[str, Any] = {"teacher": lineage["teacher"], "student": lineage["student"],
                              "teacher_parameters": teacher.bert.num_parameters(),
                              "student_parameters": student_bert.num_parameters(),
                              "teacher_layers": teacher.bert.config.num_hidden_layers,
                              "student_layers": student_bert.config.num_hidden_layers}
    main = METRIC_NAMES[0]
    if dev_sets:
        scores = evaluate_retrieval(teacher, tokenizer, dev_sets[:1], embedding, settings.eval_batch_size, device)
        report |= kept_report(main, scores[main], results)
        texts = dev_sets[0].anchors[:SPEED_FEATURES]
        rows = [{"input_ids": e.input_ids, "token_type_ids": e.token_type_ids, "attention_mask": e.attention_mask}
                for e in tokenizer.encode_batch(texts, max_length=embedding.max_seq_length)]
        report |= speed_report(measure_speed({"teacher": _Vectors(teacher), "student": _Vectors(student)}, rows,
                                             (VECTOR,), settings.eval_batch_size, tokenizer.pad_token_id, device))
        if baseline is not None:
            report["without_teacher"] = without_teacher_report(main, results, baseline)
    return report
