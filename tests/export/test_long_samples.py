"""Inputs past the model's positions in the export's sample and extract's defaults on a shallow model (issue 50's
attack pass: a --sample line of 127 tokens or more crashed the export with a tensor-size RuntimeError, and extract's
default four layers failed on a model of two)."""

from __future__ import annotations

import json

from bertkit.cli import main


def test_a_sample_line_longer_than_the_model_is_cut_as_inference_cuts_it(classifier_dir, tmp_path, capsys):
    sample = tmp_path / "long.txt"
    sample.write_text("the cat sat on the mat " * 100 + "\nthe dog\n", encoding="utf-8")
    assert main(["export", "onnx", "--model", str(classifier_dir), "--output", str(tmp_path / "onnx"),
                 "--sample", str(sample)]) == 0, capsys.readouterr().err


def test_extract_defaults_to_the_layers_a_shallow_model_has(mlm_dir, tmp_path):
    lines = tmp_path / "lines.txt"
    lines.write_text("the cat sat\n", encoding="utf-8")
    assert main(["extract", "--model", str(mlm_dir), "--input", str(lines), "--output", str(tmp_path / "f.jsonl")]) == 0
    record = json.loads((tmp_path / "f.jsonl").read_text().splitlines()[0])
    assert [layer["index"] for layer in record["features"][0]["layers"]] == [-1, -2]  # bert-debug: two layers
