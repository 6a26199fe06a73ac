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


def test_sample_lines_without_text_are_refused_and_what_is_left_out_is_said(tmp_path, monkeypatch, caplog):
    """A file of blank lines was accepted (the check ran on nothing), and the second text of 'a ||| b' was dropped
    unsaid; the first 256 texts are read and no more."""
    import pytest

    from bertkit.errors import BertkitError
    from bertkit.export import onnx

    blank = tmp_path / "blank.txt"
    blank.write_text("\n \n\n", encoding="utf-8")
    with pytest.raises(BertkitError, match="--sample .*blank.txt: no text in it"):
        onnx.sample_texts(blank)
    mixed = tmp_path / "mixed.txt"
    mixed.write_bytes(b"the cat\n\nthe dog ||| a pet\nthe bird\n\xff\n")
    monkeypatch.setattr(onnx, "MAX_SAMPLE_TEXTS", 3)
    with caplog.at_level("INFO"):
        assert onnx.sample_texts(mixed) == ["the cat", "the dog", "the bird"]  # the damaged 5th line never read
    assert "1 blank line(s) skipped; the second text of 1 'a ||| b' line(s) not used" in caplog.text
