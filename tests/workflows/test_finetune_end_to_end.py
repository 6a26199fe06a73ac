"""Tiny end-to-end fine-tuning runs through the CLI for every task (bert-debug, inline data, seconds each),
then `bertkit predict` / `bertkit evaluate` from the fine-tuned directory alone."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from bertkit.cli import main
from bertkit.tokenizer import WordPieceTokenizer

WORDS = ("the a film was is good great bad awful fine paris france berlin germany where who capital of in "
         "eu rejects german call peter blackburn someone sits down he eats flies sings swims city").split()


@pytest.fixture(scope="module")
def vocab(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("vocab")
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, "?", ".", ",", "##s"]
    WordPieceTokenizer(tokens).save_pretrained(directory)
    return directory


def _finetune(kind: str, vocab: Path, out: Path, train: Path, dev: Path, *extra: str) -> dict:
    argv = ["finetune", kind, "--model", "bert-debug", "--tokenizer", str(vocab), "--train", str(train),
            "--dev", str(dev), "--output", str(out), "--epochs", "2", "--batch-size", "4", "--learning-rate", "1e-3",
            "--precision", "fp32", "--device", "cpu", "--max-seq-length", "32", *extra]
    assert main(argv) == 0
    results = json.loads((out / "eval_results.json").read_text())
    for name in ("config.json", "model.safetensors", "vocab.txt", "tokenizer_config.json", "bertkit_task.json"):
        assert (out / "best" / name).is_file(), name
    return results


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_classification_glue_layout_two_seeds_then_predict_and_evaluate(vocab: Path, tmp_path: Path) -> None:
    rng = random.Random(0)
    lines = ["sentence\tlabel"]
    lines += [f"the film was {rng.choice(['good', 'bad'])}\t{rng.randint(0, 1)}" for _ in range(12)]
    train = tmp_path / "train.tsv"
    train.write_text("\n".join(lines) + "\nbroken\n", encoding="utf-8")  # the last row has no label column
    results = _finetune("classification", vocab, tmp_path / "out", train, train, "--task", "sst2", "--seeds", "1,2")
    assert set(results["seeds"]) == {"1", "2"} and results["best_seed"] in (1, 2)
    assert set(results["summary"]["accuracy"]) == {"mean", "std", "max"}
    assert results["skipped_train"] == 1 and 0.0 <= results["accuracy"] <= 1.0
    assert (tmp_path / "out" / "predictions.jsonl").is_file()
    task = json.loads((tmp_path / "out" / "best" / "bertkit_task.json").read_text())
    assert task["task"] == "classification" and task["glue_task"] == "sst2" and task["labels"] == ["0", "1"]
    config = json.loads((tmp_path / "out" / "best" / "config.json").read_text())
    assert config["id2label"] == {"0": "0", "1": "1"}

    rows = _jsonl(tmp_path / "in.jsonl", [{"text": "the film was good", "label": "1"}, {"text": "bad", "label": "0"}])
    assert main(["predict", "--model", str(tmp_path / "out" / "best"), "--input", str(rows), "--output",
                 str(tmp_path / "pred"), "--device", "cpu"]) == 0
    predictions = [json.loads(line) for line in (tmp_path / "pred" / "predictions.jsonl").read_text().splitlines()]
    assert len(predictions) == 2 and predictions[0]["label"] in ("0", "1")
    assert main(["evaluate", "--model", str(tmp_path / "out" / "best"), "--input", str(rows), "--output",
                 str(tmp_path / "eval"), "--device", "cpu"]) == 0
    assert "accuracy" in json.loads((tmp_path / "eval" / "eval_results.json").read_text())


def test_regression_generic_jsonl_with_truncation_reported(vocab: Path, tmp_path: Path) -> None:
    rows = [{"a": "the film " * 20, "b": "good", "y": 1.5}] + [{"a": "a film", "b": w, "y": i % 5}
                                                                for i, w in enumerate(WORDS[:11])]
    train = _jsonl(tmp_path / "train.jsonl", rows)
    results = _finetune("classification", vocab, tmp_path / "out", train, train, "--text-column", "a",
                        "--text-pair-column", "b", "--label-column", "y", "--regression")
    assert {"pearson", "spearman"} <= set(results) and results["truncated_train_examples"] == 1


def test_headerless_tsv_and_json_array_train_and_predict(vocab: Path, tmp_path: Path) -> None:
    """Issue 29: a TSV without a header row (--no-header, columns by number) and a JSON array of objects."""
    rows = [("good" if i % 2 else "bad", f"the film was {'good' if i % 2 else 'bad'}") for i in range(12)]
    train = tmp_path / "train.tsv"
    train.write_text("".join(f"{label}\t{text}\n" for label, text in rows), encoding="utf-8")
    results = _finetune("classification", vocab, tmp_path / "out", train, train, "--no-header",
                        "--text-column", "1", "--label-column", "0")
    task = json.loads((tmp_path / "out" / "best" / "bertkit_task.json").read_text())
    assert task["header"] is False and task["labels"] == ["bad", "good"] and "accuracy" in results
    new = tmp_path / "new.tsv"
    new.write_text("x\tthe film was good\n", encoding="utf-8")  # read as fine-tuned: no header, column 1
    assert main(["predict", "--model", str(tmp_path / "out" / "best"), "--input", str(new), "--output",
                 str(tmp_path / "pred"), "--device", "cpu"]) == 0
    [prediction] = [json.loads(line) for line in (tmp_path / "pred" / "predictions.jsonl").read_text().splitlines()]
    assert prediction["label"] in ("bad", "good") and prediction["id"] == f"{new}:1"
    array = tmp_path / "train.json"
    array.write_text(json.dumps([{"text": text, "label": label} for label, text in rows], indent=1), encoding="utf-8")
    assert "accuracy" in _finetune("classification", vocab, tmp_path / "array", array, array)


def test_unknown_dev_label_is_a_one_line_error(vocab: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    train = _jsonl(tmp_path / "train.jsonl", [{"text": "good", "label": "pos"}, {"text": "bad", "label": "neg"}])
    dev = _jsonl(tmp_path / "dev.jsonl", [{"text": "fine", "label": "neutral"}])
    argv = ["finetune", "classification", "--model", "bert-debug", "--tokenizer", str(vocab), "--train", str(train),
            "--dev", str(dev), "--output", str(tmp_path / "out")]
    assert main(argv) == 2
    assert f"{dev}:1: unknown label 'neutral'" in capsys.readouterr().err


def test_tagging_conll_with_windows_and_conll_predictions(vocab: Path, tmp_path: Path) -> None:
    sentence = "EU B-ORG\nrejects O\nGerman B-MISC\ncall O\n\nPeter B-PER\nBlackburn I-PER\n\n"
    long_sentence = "".join(f"{w} O\n" for w in ["the", "film"] * 20) + "\n"  # longer than one 32-token window
    train = tmp_path / "train.txt"
    train.write_text("-DOCSTART- O\n\n" + sentence * 4 + long_sentence, encoding="utf-8")
    results = _finetune("tagging", vocab, tmp_path / "out", train, train, "--doc-stride", "8")
    assert {"f1", "precision", "recall", "accuracy"} <= set(results)
    lines = (tmp_path / "out" / "predictions.conll").read_text().splitlines()
    assert lines[0] == "-DOCSTART- O O" and len(lines[2].split()) == 3  # word, gold, predicted (the marker too)
    token_lines = [line for line in lines[1:] if line.strip()]
    assert len(token_lines) == 4 * 6 + 40  # every word of every sentence got exactly one prediction


def _squad_file(path: Path, version_2: bool) -> Path:
    context = "Paris is the capital of France. Berlin is the capital of Germany."
    paragraphs = []
    for p in range(3):
        qas = [{"id": f"q1-{p}", "question": "where is paris?", "answers": [{"text": "France", "answer_start": 24}]},
               {"id": f"q2-{p}", "question": "where is berlin?", "answers": [{"text": "Germany", "answer_start": 57}]}]
        if version_2:
            qas.append({"id": f"q3-{p}", "question": "who sings?", "answers": [], "is_impossible": True})
        paragraphs.append({"context": context, "qas": qas})
    path.write_text(json.dumps({"version": "v2.0", "data": [{"title": "t", "paragraphs": paragraphs}]}),
                    encoding="utf-8")
    return path


@pytest.mark.parametrize("version_2", [False, True], ids=["v1.1", "v2.0"])
def test_squad_outputs_like_the_original(vocab: Path, tmp_path: Path, version_2: bool) -> None:
    train = _squad_file(tmp_path / "train.json", version_2)
    extra = ["--doc-stride", "8", "--max-query-length", "8"] + (["--version-2-with-negative"] if version_2 else [])
    results = _finetune("squad", vocab, tmp_path / "out", train, train, *extra)
    assert {"exact_match", "f1"} <= set(results)
    predictions = json.loads((tmp_path / "out" / "predictions.json").read_text())
    nbest = json.loads((tmp_path / "out" / "nbest_predictions.json").read_text())
    assert set(predictions) == set(nbest) and all(len(v) <= 20 for v in nbest.values())
    assert (tmp_path / "out" / "null_odds.json").is_file() == version_2
    task = json.loads((tmp_path / "out" / "best" / "bertkit_task.json").read_text())
    assert task["doc_stride"] == 8 and task["version_2_with_negative"] == version_2
    if version_2:
        assert task["null_score_diff_threshold"] == results["best_f1_thresh"]
    assert main(["evaluate", "--model", str(tmp_path / "out" / "best"), "--input", str(train), "--output",
                 str(tmp_path / "eval"), "--device", "cpu"]) == 0
    assert (tmp_path / "eval" / "predictions.json").is_file()


@pytest.mark.parametrize("dev_kind", ["v1.1", "only-unanswerable"])
def test_squad_v2_with_a_dev_set_that_cannot_place_the_threshold(vocab: Path, tmp_path: Path, dev_kind: str,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    # A v1.1 dev file (every question answerable) with --version-2-with-negative once failed with
    # KeyError 'best_f1_thresh': the threshold stays at its default and the run is scored.
    train = _squad_file(tmp_path / "train.json", version_2=True)
    dev = _squad_file(tmp_path / "dev.json", version_2=dev_kind == "only-unanswerable")
    if dev_kind == "only-unanswerable":
        data = json.loads(dev.read_text())
        for paragraph in data["data"][0]["paragraphs"]:
            paragraph["qas"] = [q for q in paragraph["qas"] if q.get("is_impossible")]
        dev.write_text(json.dumps(data), encoding="utf-8")
    results = _finetune("squad", vocab, tmp_path / "out", train, dev, "--doc-stride", "8", "--max-query-length", "8",
                        "--version-2-with-negative")
    assert {"exact_match", "f1", "best_f1", "best_f1_thresh"} <= set(results)
    assert results["null_score_diff_threshold"] == 0.0
    task = json.loads((tmp_path / "out" / "best" / "bertkit_task.json").read_text())
    assert task["null_score_diff_threshold"] == 0.0
    assert "the SQuAD 2.0 no-answer threshold cannot be chosen on it" in caplog.text
    assert main(["evaluate", "--model", str(tmp_path / "out" / "best"), "--input", str(dev), "--output",
                 str(tmp_path / "eval"), "--device", "cpu"]) == 0


def test_multiple_choice_swag_with_feature_based_head(vocab: Path, tmp_path: Path) -> None:
    header = ",video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3,label"
    rows = [f"{i},v,{i},x,someone sits down.,he,gold,eats.,flies.,sings.,swims.,{i % 4}" for i in range(8)]
    train = tmp_path / "train.csv"
    train.write_text("\n".join([header, *rows]) + "\n", encoding="utf-8")
    results = _finetune("multiple-choice", vocab, tmp_path / "out", train, train,
                        "--feature-layers", "-1,-2", "--feature-combine", "concat")
    assert "accuracy" in results
    assert (tmp_path / "out" / "best" / "feature_head.safetensors").is_file()
    assert main(["predict", "--model", str(tmp_path / "out" / "best"), "--input", str(train), "--output",
                 str(tmp_path / "pred"), "--device", "cpu"]) == 0
    assert len((tmp_path / "pred" / "predictions.jsonl").read_text().splitlines()) == 8
