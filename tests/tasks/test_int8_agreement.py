"""int8 inference on a fine-tuned model: `bertkit predict`/`evaluate --precision int8`, the predictor and
`bertkit extract` agree with fp32 on nearly every prediction, and the metric moves little (the numbers
of a real fine-tuned model are in docs/performance.md)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

from bertkit.cli import main
from bertkit.serve.predictor import load_predictor
from bertkit.settings import ServeSettings
from bertkit.tokenizer import WordPieceTokenizer

POSITIVE, NEGATIVE = ["good", "great", "fine"], ["bad", "awful"]
WORDS = ["the", "a", "film", "was", "is", "movie", "plot", "very", "not", *POSITIVE, *NEGATIVE]


@pytest.fixture(scope="module")
def finetuned(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(a bert-debug classifier fine-tuned on a learnable sentiment task, its labelled dev file)."""
    root = tmp_path_factory.mktemp("int8")
    WordPieceTokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]).save_pretrained(root / "vocab")
    rng = random.Random(0)

    def rows(count: int) -> list[dict]:
        out = []
        for _ in range(count):
            label = rng.choice(["pos", "neg"])
            word = rng.choice(POSITIVE if label == "pos" else NEGATIVE)
            text = (f"{rng.choice(['the', 'a'])} {rng.choice(['film', 'movie', 'plot'])} "
                    f"{rng.choice(['was', 'is'])} {word}")
            out.append({"text": text, "label": label})
        return out
    for name, count in (("train", 96), ("dev", 64)):
        (root / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows(count)), encoding="utf-8")
    assert main(["finetune", "classification", "--model", "bert-debug", "--tokenizer", str(root / "vocab"),
                 "--train", str(root / "train.jsonl"), "--dev", str(root / "dev.jsonl"), "--output", str(root / "out"),
                 "--epochs", "6", "--batch-size", "8", "--learning-rate", "3e-3", "--precision", "fp32",
                 "--device", "cpu", "--max-seq-length", "16"]) == 0
    return root / "out" / "best", root / "dev.jsonl"


def _evaluate(model: Path, dev: Path, out: Path, precision: str) -> tuple[float, list[str]]:
    assert main(["evaluate", "--model", str(model), "--input", str(dev), "--output", str(out), "--device", "cpu",
                 "--precision", precision]) == 0
    accuracy = json.loads((out / "eval_results.json").read_text())["accuracy"]
    labels = [json.loads(line)["label"] for line in (out / "predictions.jsonl").read_text().splitlines()]
    return accuracy, labels


def test_int8_agrees_with_fp32_on_a_finetuned_model(finetuned, tmp_path):
    model, dev = finetuned
    exact_accuracy, exact = _evaluate(model, dev, tmp_path / "fp32", "fp32")
    assert exact_accuracy >= 0.9  # the task was learned, so agreement means something
    for precision in ("int8", "bf16"):
        accuracy, labels = _evaluate(model, dev, tmp_path / precision, precision)
        agreement = np.mean([a == b for a, b in zip(labels, exact)])
        assert len(labels) == len(exact) and agreement >= 0.95 and abs(accuracy - exact_accuracy) <= 0.05, precision
    assert main(["predict", "--model", str(model), "--input", str(dev), "--output", str(tmp_path / "p"),
                 "--device", "cpu", "--precision", "int8"]) == 0
    texts = [json.loads(line)["text"] for line in dev.read_text().splitlines()][:8]
    fast = [r["label"] for r in load_predictor(ServeSettings(model, precision="int8")).classify(texts)]
    assert np.mean([a == b for a, b in zip(fast, [r["label"] for r in load_predictor(model).classify(texts)])]) >= 0.75


def test_extract_in_int8_is_close_to_fp32(finetuned, tmp_path):
    model, _dev = finetuned
    source = tmp_path / "in.txt"
    source.write_text("the film was good\na plot is awful\n", encoding="utf-8")
    for precision in ("fp32", "int8"):
        assert main(["extract", "--model", str(model), "--input", str(source), "--output",
                     str(tmp_path / f"{precision}.npy"), "--pooling", "mean", "--precision", precision]) == 0
    exact, fast = np.load(tmp_path / "fp32.npy"), np.load(tmp_path / "int8.npy")
    assert exact.shape == fast.shape and not np.array_equal(fast, exact)  # it really ran in int8
    cosine = (exact * fast).sum(1) / np.linalg.norm(exact, axis=1) / np.linalg.norm(fast, axis=1)
    assert cosine.min() > 0.99
