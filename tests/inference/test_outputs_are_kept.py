"""`bertkit predict`, `evaluate` and `extract` refuse to write over an earlier output, as `finetune` refuses an
earlier run: an existing non-empty --output is a one-line error naming --overwrite, before any work; with
--overwrite the earlier results are replaced (none of them left beside the new ones)."""

from __future__ import annotations

import json

import pytest

from bertkit.cli import main
from bertkit.config import preset
from bertkit.model import BertForMaskedLM, BertForSequenceClassification
from bertkit.settings import ClassificationSettings
from bertkit.tasks.classification import ClassificationTask
from bertkit.tasks.finetuned import save_finetuned
from bertkit.tokenizer import WordPieceTokenizer

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "good", "bad", "film"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("kept")
    task = ClassificationTask(ClassificationSettings(labels=["bad", "good"], max_seq_length=8))
    model = BertForSequenceClassification(preset("bert-debug", vocab_size=len(VOCAB), **task.config_overrides()))
    save_finetuned(model, task, WordPieceTokenizer(VOCAB), root / "classifier")
    BertForMaskedLM(preset("bert-debug", vocab_size=len(VOCAB))).save_pretrained(root / "mlm",
                                                                               tokenizer=WordPieceTokenizer(VOCAB))
    (root / "rows.csv").write_text("text,label\ngood film,good\nbad film,bad\n", encoding="utf-8")
    (root / "lines.txt").write_text("good film\nbad\n", encoding="utf-8")
    return root


def test_predict_and_evaluate_refuse_an_earlier_output_unless_overwrite(files, tmp_path, capsys):
    output = tmp_path / "out"
    evaluate = ["evaluate", "--model", str(files / "classifier"), "--input", str(files / "rows.csv"),
                "--output", str(output), "--device", "cpu"]
    assert main(evaluate) == 0
    written = {p.name: p.read_text() for p in output.iterdir()}
    assert set(written) == {"predictions.jsonl", "eval_results.json"}
    capsys.readouterr()
    predict = ["predict", *evaluate[1:]]
    for argv in (evaluate, predict):
        assert main(argv) == 2
        assert capsys.readouterr().err == (f"bertkit: error: --output {output} is not empty; pass --overwrite to "
                                           "replace the results in it, or choose another directory\n")
        assert {p.name: p.read_text() for p in output.iterdir()} == written  # untouched
    (output / "notes.txt").write_text("mine")
    assert main([*predict, "--overwrite"]) == 0
    assert sorted(p.name for p in output.iterdir()) == ["notes.txt", "predictions.jsonl"]  # no stale scores
    assert [json.loads(line)["label"] for line in (output / "predictions.jsonl").read_text().splitlines()] == \
        [json.loads(line)["label"] for line in written["predictions.jsonl"].splitlines()]
    (tmp_path / "empty").mkdir()
    assert main(["predict", *evaluate[1:5], "--output", str(tmp_path / "empty"), "--device", "cpu"]) == 0


def test_extract_refuses_an_existing_output_unless_overwrite(files, tmp_path, capsys):
    output = tmp_path / "vectors.npy"
    extract = ["extract", "--model", str(files / "mlm"), "--input", str(files / "lines.txt"), "--output",
               str(output), "--layers", "-1", "--pooling", "cls"]
    assert main(extract) == 0
    before = output.read_bytes()
    assert main(extract) == 2
    assert capsys.readouterr().err == (f"bertkit: error: --output {output} exists; pass --overwrite to replace "
                                       "it, or choose another name\n")
    assert output.read_bytes() == before
    assert main([*extract, "--overwrite"]) == 0 and output.read_bytes() == before  # the same vectors again
    output.with_suffix(".jsonl").write_text("")  # an empty file is no earlier output
    assert main([*extract[:5], "--output", str(output.with_suffix(".jsonl")), "--layers", "-1"]) == 0
