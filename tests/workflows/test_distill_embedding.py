"""`bertkit distill embedding`: a half-depth sentence encoder trained on a teacher's vectors (mean squared error),
scored by retrieval as `finetune embedding` scores; its directory loads in sentence-transformers and gives vectors
close to the teacher's; students of another width or vocabulary are refused."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
from sentence_transformers import SentenceTransformer

from bertkit.cli import main
from bertkit.errors import BertkitError
from bertkit.settings import DistillSettings, EmbeddingSettings, FinetuneSettings
from bertkit.tokenizer import WordPieceTokenizer
from bertkit.workflows.distill_embedding import run_embedding_distillation

TOPICS = 12
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "is", "where",
         *[f"a{i}" for i in range(TOPICS)], *[f"b{i}" for i in range(TOPICS)]]
COMMON = ["--batch-size", "4", "--learning-rate", "3e-3", "--precision", "fp32", "--device", "cpu", "--threads", "1"]


@pytest.fixture(scope="module")
def teacher(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("embedding-distill")
    WordPieceTokenizer(VOCAB).save_pretrained(root / "vocab")
    perm = list(range(TOPICS))
    random.Random(0).shuffle(perm)
    pairs = root / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"anchor": f"where is a{i}", "positive": f"the b{perm[i]}"}) + "\n"
                             for i in range(TOPICS)))
    texts = root / "texts.txt"
    texts.write_text("".join(f"is the a{i} b{j}\n" for i in range(TOPICS) for j in range(3)))
    assert main(["finetune", "embedding", "--model", "bert-debug", "--tokenizer", str(root / "vocab"), "--train",
                 str(pairs), "--dev", str(pairs), "--output", str(root / "teacher"), "--epochs", "8",
                 *COMMON]) == 0
    return {"root": root, "pairs": pairs, "texts": texts, "teacher": root / "teacher" / "best"}


def test_a_half_depth_encoder_learns_the_teachers_vectors(teacher, tmp_path) -> None:
    out = tmp_path / "student"
    assert main(["distill", "embedding", "--teacher", str(teacher["teacher"]), "--train", str(teacher["pairs"]),
                 "--dev", str(teacher["pairs"]), "--output", str(out), "--unlabeled", str(teacher["texts"]),
                 "--epochs", "30", "--compare-without-teacher", *COMMON]) == 0
    results = json.loads((out / "eval_results.json").read_text())
    report = results["distillation"]
    assert report["student_layers"] == 1 and report["teacher_layers"] == 2 and report["speedup"] > 0
    assert results["unlabeled_texts"] == 36 and results["distilled_texts"] == 24 + 36
    assert report["metric"] == "mrr@10" and "without_teacher" in report
    assert (out / "best" / "distillation.json").is_file()
    # The student is a sentence-transformers directory whose vectors are near the teacher's.
    texts = ["where is a3", "the b5", "is the a1 b2"]
    mine = SentenceTransformer(str(out / "best"), device="cpu").encode(texts)
    theirs = SentenceTransformer(str(teacher["teacher"]), device="cpu").encode(texts)
    cosine = (mine * theirs).sum(-1) / np.linalg.norm(mine, axis=-1) / np.linalg.norm(theirs, axis=-1)
    assert cosine.min() > 0.9, cosine


def test_students_that_cannot_give_the_teachers_vectors_are_refused(teacher, tmp_path) -> None:
    def run(**changes) -> None:
        run_embedding_distillation(teacher["pairs"], [], FinetuneSettings.of(model="-", output=tmp_path / "x",
                                                                             device="cpu", batch_size=4),
                                   EmbeddingSettings(), DistillSettings(**{"teacher": teacher["teacher"], **changes}))
    with pytest.raises(BertkitError, match="width 128, the teacher's vectors 32"):
        run(student="bert-tiny")
    with pytest.raises(BertkitError, match="--teacher .*vocab: no config.json"):
        run(teacher=teacher["root"] / "vocab")
    plain = tmp_path / "plain"
    from bertkit.model import BertModel
    BertModel.from_pretrained(teacher["teacher"]).save_pretrained(plain, tokenizer=WordPieceTokenizer(VOCAB))
    with pytest.raises(BertkitError, match="not a sentence-transformers directory"):
        run(teacher=plain)


def test_unlabeled_lines_are_read_as_far_as_max_unlabeled_needs_and_blank_ones_counted(teacher, tmp_path,
                                                                                       caplog) -> None:
    """Blank lines counted toward --max-unlabeled (4 blank, then 3 texts: 'no text in it'), unsaid; and the whole
    file was read first, damage past the N texts included."""
    from bertkit.workflows.distill_embedding import _unlabeled

    path = tmp_path / "texts.txt"
    path.write_bytes(b"\n\n\n\nis the a1 b2\n\nis the a3 b4\nis the a5 b6\nis the a7 b8\n\xff\n")
    with caplog.at_level("INFO"):
        texts = _unlabeled(DistillSettings(teacher=teacher["teacher"], unlabeled=path, max_unlabeled=3))
    assert texts == ["is the a1 b2", "is the a3 b4", "is the a5 b6"] and "5 blank line(s) skipped" in caplog.text
    with pytest.raises(BertkitError, match=r"line 10 \(byte 0 of the line\): not valid UTF-8"):
        _unlabeled(DistillSettings(teacher=teacher["teacher"], unlabeled=path))
