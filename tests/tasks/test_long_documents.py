"""Documents longer than the model (`--long-documents windows`): the windows, the aggregation, the cap, the
flags, and a synthetic task whose label sits past the first window, learnt with windows and not with
truncation, then read back the same way by `bertkit predict` / `evaluate` and the server's /classify."""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from bertkit.cli import main
from bertkit.config import preset
from bertkit.data.glue import TextExample
from bertkit.errors import BertkitError
from bertkit.model import BertForTokenClassification
from bertkit.serve.app import create_app
from bertkit.serve.cost import token_cost
from bertkit.serve.predictor import load_predictor
from bertkit.serve.routes import CALLS
from bertkit.settings import WINDOW_AGGREGATIONS, ClassificationSettings, LongDocumentSettings
from bertkit.tasks.classification import ClassificationTask
from bertkit.tasks.finetuned import save_finetuned
from bertkit.tasks.long_documents import aggregate_logits, plan_windows, window_features
from bertkit.tasks.tagging import TaggingSettings, TaggingTask
from bertkit.tokenizer import WordPieceTokenizer

FILLER = ("the a river ran past old stone mills where miller kept his grain and accounts in small book that "
          "nobody else could read").split()
SEQ = 16  # max_seq_length of the synthetic task: 14 text tokens per window
LENGTH = 36  # words (= tokens) per synthetic document; the keyword is at position SEQ or later
CLS, SEP = 2, 3


@pytest.fixture(scope="module")
def vocab(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("vocab")
    WordPieceTokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *sorted(set(FILLER)), "good", "bad"]
                       ).save_pretrained(directory)
    return directory


# --- windows ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("length, max_seq_length, stride", [(1, 8, None), (6, 8, None), (7, 8, None), (40, 16, None),
                                                            (40, 16, 5), (41, 16, 14), (100, 12, 1), (0, 8, None)])
def test_windows_cover_every_token_and_overlap_by_window_minus_stride(length, max_seq_length, stride):
    plan = plan_windows(length, None, max_seq_length, stride, max_windows=1000)
    room = max_seq_length - 2
    step = stride or room // 2
    ids = list(range(100, 100 + length))
    features = window_features(ids, None, plan, CLS, SEP)
    starts = [start for start, _ in plan.spans]
    assert starts == [k * step for k in range(len(starts))]  # each window starts `stride` after the previous one
    assert all(size == room for _, size in plan.spans[:-1]) and plan.spans[-1][0] + plan.spans[-1][1] == length
    for (start, size), next_start in zip(plan.spans, starts[1:]):
        assert start + size - next_start == room - step  # the overlap
    covered = [token for f in features for token in f["input_ids"][1:-1]]
    assert set(covered) == set(ids)  # every token is read
    for feature, (start, size) in zip(features, plan.spans):
        assert feature["input_ids"] == [CLS, *ids[start:start + size], SEP]
        assert len(feature["input_ids"]) <= max_seq_length
        assert feature["token_type_ids"] == [0] * (size + 2) and feature["attention_mask"] == [1] * (size + 2)
    assert not plan.truncated and plan.tokens == sum(len(f["input_ids"]) for f in features)


def test_a_pair_keeps_its_first_text_in_every_window_and_windows_the_second():
    first, second = [50, 51, 52], list(range(100, 130))
    plan = plan_windows(len(first), len(second), 16, 4, max_windows=1000)  # room 13: 3 for the first, 10 windowed
    features = window_features(first, second, plan, CLS, SEP)
    assert plan.first_kept == 3 and not plan.first_cut
    assert [s for s, _ in plan.spans] == [0, 4, 8, 12, 16, 20] and plan.spans[-1] == (20, 10)
    for feature, (start, size) in zip(features, plan.spans):
        assert feature["input_ids"] == [CLS, *first, SEP, *second[start:start + size], SEP]
        assert feature["token_type_ids"] == [0] * 5 + [1] * (size + 1) and len(feature["input_ids"]) <= 16
    # a long first text keeps half the room and is counted as cut; the second still gets every token read
    plan = plan_windows(40, 30, 16, None, max_windows=1000)
    assert plan.first_kept == 6 and plan.first_cut and plan.truncated
    assert {p for s, n in plan.spans for p in range(s, s + n)} == set(range(30))


def test_inputs_that_fit_are_one_window_equal_to_the_truncated_feature(vocab):
    tokenizer = WordPieceTokenizer.from_pretrained(vocab)
    examples = [TextExample("f:1", "the river ran", "past old mills", "a"), TextExample("f:2", "good", "", "b")]
    truncate = ClassificationTask(ClassificationSettings(labels=["a", "b"], max_seq_length=SEQ))
    windows = truncate.with_long_documents(long_documents="windows")
    features = windows.features(examples, tokenizer)
    assert [f.pop("document_index") for f in features] == [0, 1]
    assert features == truncate.features(examples, tokenizer)
    single = [TextExample("f:1", "the river ran", None, None)]
    assert [{k: v for k, v in f.items() if k != "document_index"} for f in windows.features(single, tokenizer)] \
        == truncate.features(single, tokenizer)


# --- aggregation -----------------------------------------------------------------------------------

def test_mean_and_max_of_window_logits_by_hand():
    # document 0: windows with logits (1, 4), (3, -2); document 1: (0.5, 0.25); document 2: (2, 0), (-1, 5), (0, 0)
    rows = [np.array(r, np.float32) for r in ([1, 4], [0.5, 0.25], [3, -2], [2, 0], [-1, 5], [0, 0])]
    features = [{"document_index": d} for d in (0, 1, 0, 2, 2, 2)]
    mean = aggregate_logits(rows, features, 3, "mean")
    np.testing.assert_allclose(mean, [[2.0, 1.0], [0.5, 0.25], [1 / 3, 5 / 3]])
    np.testing.assert_allclose(aggregate_logits(rows, features, 3, "max"), [[3, 4], [0.5, 0.25], [2, 5]])
    assert aggregate_logits(rows[:2], [{}, {}], 2, "mean").tolist() == [[1, 4], [0.5, 0.25]]  # no windows: as is
    with pytest.raises(BertkitError, match="use one of mean, max"):
        aggregate_logits(rows, features, 3, "median")
    assert WINDOW_AGGREGATIONS == ("mean", "max")

    examples = [TextExample(f"f:{i}", "x", None, None) for i in range(3)]
    task = ClassificationTask(ClassificationSettings(labels=["neg", "pos"], long_documents="windows"))
    decoded = task.decode(examples, features, {"logits": rows})
    # document 0: softmax of the mean (2, 1) = (e / (e + 1), 1 / (e + 1)): "neg"
    assert decoded[0]["label"] == "neg" and decoded[0]["probabilities"]["neg"] == pytest.approx(np.e / (np.e + 1))
    assert decoded[2]["label"] == "pos"
    task = task.with_long_documents(window_aggregation="max")  # document 0: softmax of (3, 4): "pos"
    decoded = task.decode(examples, features, {"logits": rows})
    assert decoded[0]["label"] == "pos" and decoded[0]["probabilities"]["pos"] == pytest.approx(np.e / (np.e + 1))
    regression = ClassificationTask(ClassificationSettings(labels=None, long_documents="windows"))
    scores = [np.array([v], np.float32) for v in (1.0, 2.0, 6.0)]
    two = [{"document_index": 0}, {"document_index": 0}, {"document_index": 1}]
    assert [d["score"] for d in regression.decode(examples[:2], two, {"logits": scores})] == [1.5, 6.0]


# --- the cap ---------------------------------------------------------------------------------------

def test_the_window_cap_keeps_head_and_tail_and_is_counted(vocab, caplog):
    plan = plan_windows(100, None, 12, 5, max_windows=4)  # 10 text tokens a window: 19 windows needed
    assert plan.needed == 19 and plan.spans == ((0, 10), (5, 10), (10, 10), (90, 10)) and plan.truncated
    assert plan_windows(100, None, 12, 5, max_windows=1).spans == ((0, 10),)
    tokenizer = WordPieceTokenizer.from_pretrained(vocab)
    task = ClassificationTask(ClassificationSettings(labels=["a", "b"], max_seq_length=12, long_documents="windows",
                                                     doc_stride=5, max_windows=4))
    examples = [TextExample("dev.tsv:2", " ".join(["river"] * 100), None, "a"),
                TextExample("dev.tsv:3", "the river", None, "b"),
                TextExample("dev.tsv:4", " ".join(["mills"] * 25), None, "b")]  # 4 windows: the cap
    with caplog.at_level(logging.INFO, logger="bertkit.tasks.classification"):
        features = task.features(examples, tokenizer)
    assert [f["document_index"] for f in features] == [0] * 4 + [1] + [2] * 4
    assert [f["labels"] for f in features] == [0] * 4 + [1] * 5
    assert task.last_truncated == 1
    assert "1 of 3 inputs (from dev.tsv) need more than --max-windows 4 windows (the longest 19)" in caplog.text
    assert "3 inputs (from dev.tsv) read in 9 windows of at most 12 tokens" in caplog.text


def test_truncating_most_inputs_names_the_setting_that_reads_them_whole(vocab, caplog):
    """A truncated minority is counted; when most inputs lose tokens, the warning names --long-documents windows
    (on long dictionary entries it was worth several points: docs/finetuning.md)."""
    tokenizer = WordPieceTokenizer.from_pretrained(vocab)
    task = ClassificationTask(ClassificationSettings(labels=["a", "b"], max_seq_length=12))
    long, short = " ".join(["river"] * 30), "the river"

    def said(texts: list[str]) -> str:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="bertkit.tasks.classification"):
            task.features([TextExample(f"dev.tsv:{i}", t, None, "a") for i, t in enumerate(texts)], tokenizer)
        return caplog.text

    assert "1 of 3 examples (from dev.tsv) are longer" in said([long, short, short])
    assert "--long-documents windows" not in said([long, short, short])
    assert "2 of 3 examples (from dev.tsv) are longer than --max-seq-length 12 and were truncated longest-first; " \
           "--long-documents windows reads every token of them" in said([long, long, short])


# --- flags -----------------------------------------------------------------------------------------

def _finetune_argv(vocab: Path, train: Path, out: Path, *extra: str) -> list[str]:
    return ["finetune", "classification", "--model", "bert-debug", "--tokenizer", str(vocab), "--train", str(train),
            "--dev", str(train), "--output", str(out), "--epochs", "1", "--batch-size", "4", "--precision", "fp32",
            "--device", "cpu", "--max-seq-length", str(SEQ), *extra]


def test_bad_flags_give_a_one_line_error(vocab, tmp_path, capsys):
    train = _write(tmp_path / "train.jsonl", [{"text": "the river", "label": "a"}, {"text": "good", "label": "b"}])
    for extra, message in [(["--doc-stride", "4"], "--doc-stride applies to --long-documents windows"),
                           (["--long-documents", "windows", "--doc-stride", "15"],
                            "--doc-stride 15 is longer than a window's 14 text tokens"),
                           (["--long-documents", "windows", "--max-seq-length", "3"],
                            "--long-documents windows needs --max-seq-length of at least 4")]:
        assert main(_finetune_argv(vocab, train, tmp_path / "out", *extra)) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("bertkit: error: ") and message in err, err
    for extra, flag in [(["--long-documents", "sliding"], "--long-documents"),
                        (["--window-aggregation", "median"], "--window-aggregation"),
                        (["--max-windows", "0"], "--max-windows")]:
        assert main(_finetune_argv(vocab, train, tmp_path / "out", *extra)) == 2
        assert f"Invalid value for '{flag}'" in capsys.readouterr().err
    with pytest.raises(BertkitError, match="--long-documents 'x': use one of truncate, windows"):
        ClassificationSettings(labels=None, long_documents="x")


def test_regression_trains_on_windows_with_the_document_score(vocab, tmp_path):
    rows = [{"text": " ".join(["river"] * (10 + 3 * i)), "label": float(i % 3)} for i in range(8)]
    train = _write(tmp_path / "train.jsonl", rows)
    assert main(_finetune_argv(vocab, train, tmp_path / "out", "--regression", "--long-documents", "windows",
                               "--window-aggregation", "max", "--max-windows", "3")) == 0
    results = json.loads((tmp_path / "out" / "eval_results.json").read_text())
    # 14 text tokens a window, stride 7: only the 31-token document needs more than 3 windows (4)
    assert {"pearson", "spearman"} <= set(results) and results["truncated_train_examples"] == 1
    saved = json.loads((tmp_path / "out" / "best" / "bertkit_task.json").read_text())
    assert saved["labels"] is None and saved["window_aggregation"] == "max" and saved["max_windows"] == 3
    predictions = [json.loads(line) for line in (tmp_path / "out" / "predictions.jsonl").read_text().splitlines()]
    assert len(predictions) == 8 and all(isinstance(p["score"], float) for p in predictions)


# --- the synthetic task: the label is past the first window ---------------------------------------

def _documents(count: int, seed: int) -> list[dict]:
    """Filler words; one keyword, good (pos) or bad (neg), at a position >= SEQ, so truncation never sees it."""
    rng = random.Random(seed)
    rows = []
    for i in range(count):
        words = [rng.choice(FILLER) for _ in range(LENGTH)]
        label = rng.choice(["pos", "neg"])
        words[rng.randrange(SEQ, LENGTH)] = "good" if label == "pos" else "bad"
        rows.append({"id": f"d{i}", "text": " ".join(words), "label": label})
    return rows


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="module")
def synthetic(vocab, tmp_path_factory) -> dict[str, Path]:
    """The synthetic task fine-tuned twice, with truncation and with windows (same recipe and seed)."""
    root = tmp_path_factory.mktemp("synthetic")
    paths = {"train": _write(root / "train.jsonl", _documents(160, 1)),
             "dev": _write(root / "dev.jsonl", _documents(60, 2))}
    for mode, extra in (("truncate", []), ("windows", ["--long-documents", "windows"])):
        argv = ["finetune", "classification", "--model", "bert-debug", "--tokenizer", str(vocab), "--train",
                str(paths["train"]), "--dev", str(paths["dev"]), "--output", str(root / mode), "--epochs", "3",
                "--batch-size", "16", "--learning-rate", "3e-3", "--dropout", "0", "--precision", "fp32",
                "--device", "cpu", "--max-seq-length", str(SEQ), *extra]
        assert main(argv) == 0
        paths[mode] = root / mode
    return paths


def test_windows_learn_a_label_past_the_first_window_and_truncation_stays_at_chance(synthetic):
    truncated = json.loads((synthetic["truncate"] / "eval_results.json").read_text())
    windows = json.loads((synthetic["windows"] / "eval_results.json").read_text())
    assert truncated["truncated_dev_examples"] == 60 and windows["truncated_dev_examples"] == 0
    assert truncated["accuracy"] <= 0.7  # the majority class of dev is 53%: nothing to learn from the first window
    assert windows["accuracy"] >= 0.95


def test_the_directory_records_the_setting_and_predict_and_evaluate_use_it(synthetic, tmp_path):
    saved = json.loads((synthetic["windows"] / "best" / "bertkit_task.json").read_text())
    assert {k: saved[k] for k in ("long_documents", "doc_stride", "window_aggregation", "max_windows")} == \
        {"long_documents": "windows", "doc_stride": None, "window_aggregation": "mean", "max_windows": 16}
    best, dev = str(synthetic["windows"] / "best"), str(synthetic["dev"])
    assert main(["predict", "--model", best, "--input", dev, "--output", str(tmp_path / "pred"), "--precision",
                 "fp32", "--device", "cpu"]) == 0
    assert _jsonl(tmp_path / "pred" / "predictions.jsonl") == _jsonl(synthetic["windows"] / "predictions.jsonl")
    assert main(["evaluate", "--model", best, "--input", dev, "--output", str(tmp_path / "eval"),
                 "--device", "cpu"]) == 0
    evaluated = json.loads((tmp_path / "eval" / "eval_results.json").read_text())
    assert evaluated["accuracy"] == json.loads((synthetic["windows"] / "eval_results.json").read_text())["accuracy"]
    assert evaluated["truncated"] == 0
    # the flags override the recorded setting: the same model reading only the first window is at chance
    assert main(["evaluate", "--model", best, "--input", dev, "--output", str(tmp_path / "cut"), "--device", "cpu",
                 "--long-documents", "truncate"]) == 0
    cut = json.loads((tmp_path / "cut" / "eval_results.json").read_text())
    assert cut["truncated"] == 60 and cut["accuracy"] <= 0.7


def test_serve_classify_aggregates_windows_as_predict_does(synthetic, tmp_path):
    rows = _jsonl(synthetic["dev"])
    predicted = _jsonl(synthetic["windows"] / "predictions.jsonl")
    predictor = load_predictor(synthetic["windows"] / "best")
    plan = plan_windows(LENGTH, None, SEQ, None, 16)  # 36 tokens, 14 a window, stride 7: 5 windows
    with TestClient(create_app(predictor)) as client:
        answer = client.post("/classify", json={"inputs": [r["text"] for r in rows[:20]]})
        assert answer.status_code == 200, answer.text
        for result, expected in zip(answer.json()["results"], predicted):
            assert result["label"] == expected["label"] and result["windows"] == len(plan.spans) == 5
            assert result["truncated"] is False
            for label, p in expected["probabilities"].items():
                assert result["probabilities"][label] == pytest.approx(p, abs=1e-6)
        info = client.get("/info").json()
        assert info["long_documents"] == {"mode": "windows", "doc_stride": None, "window_aggregation": "mean",
                                          "max_windows": 16}
    # the cap: a document over it is flagged, or refused with "truncate": false
    capped = load_predictor(synthetic["windows"] / "best", long_documents=LongDocumentSettings(max_windows=2))
    with TestClient(create_app(capped)) as client:
        result = client.post("/classify", json={"inputs": [rows[0]["text"]]}).json()["results"][0]
        assert result["windows"] == 2 and result["truncated"] is True
        refused = client.post("/classify", json={"inputs": ["the river", rows[0]["text"]], "truncate": False})
        assert refused.status_code == 422 and "'inputs[1]' has 38;" in refused.json()["error"]
    # the micro-batcher's token budget counts every window, as the predictor builds them
    items = [(r["text"], None) for r in rows[:3]]
    cost = token_cost(predictor, CALLS)(("classify", False, True, "right"), items)
    examples = [TextExample(f"inputs[{i}]", r["text"], None, None) for i, r in enumerate(rows[:3])]
    features, _ = predictor.task.window_features(examples, predictor.tokenizer)
    assert sum(cost) == sum(len(f["input_ids"]) for f in features) and cost == [plan.tokens] * 3 == [4 * SEQ + 10] * 3
    with pytest.raises(BertkitError, match="--long-documents applies to classification models"):
        load_predictor(_tagger(tmp_path), long_documents=LongDocumentSettings(long_documents="windows"))


def _tagger(directory: Path) -> Path:
    task = TaggingTask(TaggingSettings(labels=["O", "B-X"]))
    model = BertForTokenClassification(preset("bert-debug", vocab_size=8, **task.config_overrides()))
    save_finetuned(model, task, WordPieceTokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "x"]),
                   directory / "tagger")
    return directory / "tagger"


def test_predict_and_evaluate_flags_reach_the_settings_and_refuse_other_tasks(monkeypatch, tmp_path, capsys):
    from bertkit.workflows import predict

    seen: dict = {}
    monkeypatch.setattr(predict, "predict_file", lambda settings: seen.update(settings=settings) or
                        {"examples": 1, "skipped": 0})
    assert main(["predict", "--model", "m", "--input", "in.csv", "--output", "out", "--long-documents", "windows",
                 "--doc-stride", "3", "--window-aggregation", "max", "--max-windows", "2"]) == 0
    assert seen["settings"].columns() == {"long_documents": "windows", "doc_stride": 3, "window_aggregation": "max",
                                          "max_windows": 2}
    monkeypatch.undo()
    tagger = _tagger(tmp_path)
    (tmp_path / "in.jsonl").write_text('{"tokens": ["x"], "ner_tags": ["O"]}\n', encoding="utf-8")
    assert main(["predict", "--model", str(tagger), "--input", str(tmp_path / "in.jsonl"), "--output",
                 str(tmp_path / "out"), "--device", "cpu", "--long-documents", "windows"]) == 2
    err = capsys.readouterr().err
    assert err == "bertkit: error: --long-documents applies to classification models; this is a tagging model\n"
