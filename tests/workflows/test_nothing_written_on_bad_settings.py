"""A setting found wrong writes nothing (issue 40): a --max-seq-length longer than the model's positions is
refused before finetune_run.json, seed-N/ or glue_sweep.json exist, so the corrected command runs in the same
--output; predict reads and checks its input before it loads the model."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from bertkit.cli import main
from bertkit.config import preset

from .conftest import WORDS, tiny_model


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bad-settings")
    tiny_model(root / "model")
    rows = [f"{WORDS[i % 6]} {WORDS[(i + 1) % 6]}\t{'good' if i % 2 else 'bad'}" for i in range(8)]
    (root / "train.tsv").write_text("text\tlabel\n" + "\n".join(rows) + "\n", encoding="utf-8")
    pairs = [json.dumps({"anchor": WORDS[i % 6], "positive": WORDS[(i + 2) % 6]}) for i in range(8)]
    (root / "pairs.jsonl").write_text("\n".join(pairs) + "\n", encoding="utf-8")
    return {"root": root, "model": root / "model", "train": root / "train.tsv", "pairs": root / "pairs.jsonl"}


def _too_long(files: dict[str, Path]) -> int:
    return preset("bert-debug").max_position_embeddings * 2


@pytest.mark.parametrize("command", ["classification", "embedding"])
def test_finetune_writes_nothing_before_refusing_a_length(files, tmp_path, capsys, command):
    data = files["pairs"] if command == "embedding" else files["train"]
    out = tmp_path / "out"
    code = main(["finetune", command, "--model", str(files["model"]), "--train", str(data), "--dev", str(data),
                 "--output", str(out), "--max-seq-length", str(_too_long(files)), "--device", "cpu"])
    assert code == 2 and "exceeds the model's max_position_embeddings" in capsys.readouterr().err
    assert not out.exists()


def test_glue_writes_nothing_before_refusing_a_length(files, tmp_path, capsys):
    sys.path.insert(0, str(Path(__file__).parent))
    from test_glue_command import write_glue

    out = tmp_path / "out"
    code = main(["glue", "--model", str(files["model"]), "--data", str(write_glue(tmp_path / "glue", ("SST-2",))),
                 "--output", str(out), "--max-seq-length", str(_too_long(files)), "--device", "cpu"])
    assert code == 2 and "exceeds the model's max_position_embeddings" in capsys.readouterr().err
    assert not out.exists()


def test_predict_checks_its_input_before_loading_the_model(files, tmp_path, capsys, monkeypatch):
    from bertkit.tasks import finetuned
    from bertkit.workflows import predict

    assert main(["finetune", "classification", "--model", str(files["model"]), "--train", str(files["train"]),
                 "--dev", str(files["train"]), "--output", str(tmp_path / "ft"), "--max-steps", "1",
                 "--device", "cpu", "--precision", "fp32", "--max-seq-length", "16"]) == 0
    model_dir = tmp_path / "ft" / "best"
    loaded = []
    monkeypatch.setattr(predict, "load_finetuned", lambda *a, **k: loaded.append(a) or finetuned.load_finetuned(*a))
    code = main(["predict", "--model", str(model_dir), "--input", str(tmp_path / "missing.tsv"),
                 "--output", str(tmp_path / "pred")])
    assert code == 2 and "missing.tsv" in capsys.readouterr().err
    assert not loaded and not (tmp_path / "pred").exists()
