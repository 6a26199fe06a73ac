"""SmoothQuant for `--precision int8` (bertkit.inference.smoothquant): scales measured on a calibration sample
move activation outliers into the weights, so int8 tracks fp32 far more closely on a model with outlier
channels; the scales are kept beside the model and reused; bad calibration files and settings are one-line
errors; `predict --precision int8 --calibration FILE` runs end to end."""

from __future__ import annotations

import gzip
import logging
import os

import pytest
import torch
from safetensors.torch import save_file

from bertkit import model as bm
from bertkit.cli import main
from bertkit.config import preset
from bertkit.errors import BertkitError
from bertkit.inference.smoothquant import (
    SMOOTHING_FILE,
    calibrate,
    int8_smoothing,
    read_calibration,
    weights_fingerprint,
)
from bertkit.model.accelerate import Int8Linear
from bertkit.tokenizer import WordPieceTokenizer

WORDS = "the cat sat on mat dog ran in park paris is capital of france where did go who john".split()
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
SAMPLE = ["the cat sat on the mat", "where did the dog go", "paris is the capital of france", "john ran in the park",
          "the dog sat\tthe cat ran"]


def _outlier_model() -> bm.BertModel:
    """bert-debug with BERT's known trait made strong: a few hidden channels far larger than the rest after
    every LayerNorm (Dettmers et al. 2022; Xiao et al. 2023), which one int8 scale per token resolves badly."""
    torch.manual_seed(0)
    model = bm.BertModel(preset("bert-debug", vocab_size=len(VOCAB))).eval()
    with torch.no_grad():
        for norm in [model.embeddings.norm, *(n for layer in model.layers for n in (layer.attn_norm, layer.ffn_norm))]:
            norm.weight[:3] *= 200.0
    return model


def _features(tokenizer: WordPieceTokenizer, texts: list[str]) -> list[dict]:
    return [{"input_ids": e.input_ids, "token_type_ids": e.token_type_ids, "attention_mask": e.attention_mask}
            for e in tokenizer.encode_batch(texts)]


def _batch(tokenizer: WordPieceTokenizer, texts: list[str]) -> dict[str, torch.Tensor]:
    features = _features(tokenizer, texts)
    width = max(len(f["input_ids"]) for f in features)
    return {k: torch.tensor([f[k] + [0] * (width - len(f[k])) for f in features]) for k in features[0]}


def test_smoothing_brings_int8_close_to_fp32_on_outlier_channels():
    tokenizer = WordPieceTokenizer(VOCAB, do_lower_case=True)
    model = _outlier_model()
    scales = calibrate(model, _features(tokenizer, SAMPLE[:4]), tokenizer.pad_token_id)
    layers = {f"layers.{i}.{d}" for i in range(len(model.layers)) for d in ("qkv", "attn_out", "ffn_in", "ffn_out")}
    assert set(scales) == layers | {f"{name}.outliers" for name in layers}
    plain, smoothed = bm.for_inference(model, "int8"), bm.for_inference(model, "int8", smoothing=lambda: scales)
    assert all(m.inverse_smooth is not None for m in smoothed.modules() if isinstance(m, Int8Linear))
    batch = _batch(tokenizer, ["the dog ran in the park", "who is john"])  # not in the calibration sample
    with torch.inference_mode():
        exact = model(**batch).last_hidden_state
        errors = {name: (m(**batch).last_hidden_state - exact).abs().max().item()
                  for name, m in (("plain", plain), ("smoothed", smoothed))}
    assert errors["smoothed"] < errors["plain"] / 2, errors  # measured here: 5x closer (0.17 against 0.89)


def test_calibration_keeps_the_largest_scaled_channels_in_fp32_and_that_brings_int8_closer():
    """The channels still largest after SmoothQuant's scaling (here the three made 200x larger) are named the
    layer's outlier channels; multiplied in fp32, int8 tracks fp32 closer than with smoothing alone."""
    tokenizer = WordPieceTokenizer(VOCAB, do_lower_case=True)
    model = _outlier_model()
    scales = calibrate(model, _features(tokenizer, SAMPLE[:4]), tokenizer.pad_token_id)
    assert {0, 1, 2} <= set(scales["layers.0.qkv.outliers"].tolist())
    assert all(len(v) == 4 and v.dtype == torch.int64 for k, v in scales.items() if k.endswith(".outliers"))
    without = {k: v for k, v in scales.items() if not k.endswith(".outliers")}
    models = {name: bm.for_inference(model, "int8", smoothing=lambda chosen=chosen: chosen)
              for name, chosen in (("smoothed", without), ("outliers", scales))}
    assert "4 outlier channels fp32" in repr(models["outliers"].layers[0].qkv)
    batch = _batch(tokenizer, ["the dog ran in the park", "who is john"])
    with torch.inference_mode():
        exact = model(**batch).last_hidden_state
        errors = {name: (m(**batch).last_hidden_state - exact).pow(2).mean().item() for name, m in models.items()}
    assert errors["outliers"] < errors["smoothed"] / 2, errors


def test_scales_of_another_width_are_refused():
    with pytest.raises(ValueError, match="measured on another model"):
        Int8Linear(torch.nn.Linear(64, 32), smooth=torch.ones(48))


def test_a_smoothed_layer_computes_the_same_product():
    """(x / s)(W s)^T = x W^T: with no outliers, smoothing changes int8's result only by rounding."""
    torch.manual_seed(1)
    linear = torch.nn.Linear(64, 32)
    x = torch.randn(5, 64)
    smooth = torch.rand(64) + 0.5
    with torch.inference_mode():
        torch.testing.assert_close(Int8Linear(linear, smooth=smooth)(x), linear(x), atol=0.05, rtol=0.0)


def test_scales_are_kept_beside_the_model_and_reused(tmp_path, caplog):
    tokenizer = WordPieceTokenizer(VOCAB, do_lower_case=True)
    model = _outlier_model()
    sample = tmp_path / "sample.txt"
    sample.write_text("\n".join(SAMPLE) + "\n\n")
    assert read_calibration(sample)[-1] == ("the dog sat", "the cat ran")  # a tab: a pair
    measured = int8_smoothing(model, tmp_path, sample, tokenizer)
    assert (tmp_path / SMOOTHING_FILE).is_file()
    with caplog.at_level(logging.INFO, logger="bertkit.inference.smoothquant"):
        kept = int8_smoothing(model, tmp_path, None, tokenizer)
    assert kept is not None and set(kept) == set(measured) and all(torch.equal(kept[k], measured[k]) for k in measured)
    assert "calibrated on sample.txt, 5 inputs" in caplog.text and "names no outlier channels" not in caplog.text
    assert int8_smoothing(model, tmp_path / "elsewhere", None, tokenizer) is None  # never calibrated: plain int8
    with torch.no_grad():
        model.layers[0].ffn_in.weight.mul_(1.5)  # fine-tuned again into the same directory: the scales are stale
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert int8_smoothing(model, tmp_path, None, tokenizer) is None
    assert "other weights" in caplog.text
    about = {"calibration": "sample.txt", "inputs": "5", "weights": weights_fingerprint(model)}
    earlier = {k: v for k, v in measured.items() if not k.endswith(".outliers")}  # what an earlier bertkit kept
    save_file(earlier, str(tmp_path / SMOOTHING_FILE), metadata=about)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="bertkit.inference.smoothquant"):
        kept = int8_smoothing(model, tmp_path, None, tokenizer)
    assert kept is not None and set(kept) == set(earlier) and "names no outlier channels" in caplog.text
    assert bm.for_inference(model, "int8", smoothing=lambda: kept) is not None  # runs, smoothing alone
    for damage in ({"layers.0.qkv.outliers": torch.tensor([0, 1, 2, 10**6])},
                   {"layers.0.qkv.outliers": torch.tensor([1, 1])}, {"layers.0.qkv": torch.ones(3)},
                   {"layers.99.qkv": torch.ones(3)}):
        save_file({**measured, **damage}, str(tmp_path / SMOOTHING_FILE), metadata=about)
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            assert int8_smoothing(model, tmp_path, None, tokenizer) is None  # plain int8, never a traceback
        assert "is damaged" in caplog.text and "--calibration" in caplog.text, damage
    (tmp_path / SMOOTHING_FILE).write_bytes(b"damaged")
    with caplog.at_level(logging.WARNING):
        assert int8_smoothing(model, tmp_path, None, tokenizer) is None
    assert "unreadable" in caplog.text and "--calibration" in caplog.text


@pytest.mark.parametrize("doctor", ["nan", "zero", "inf", "negative", "integer", "tiny", "huge", "missing"])
def test_doctored_scale_values_are_refused_with_plain_int8(doctor, tmp_path, caplog):
    """Issue 50: a kept file with the right fingerprint and shapes but NaN, 0, inf, negated or integer scales was
    trusted, and every output became NaN (or a reflection at cosine 0.16 to fp32) with exit 0. Such values are
    refused with a warning, and int8 runs plain: outputs finite and as close to fp32 as plain int8's."""
    tokenizer, model = WordPieceTokenizer(VOCAB, do_lower_case=True), _outlier_model()
    sample = tmp_path / "sample.txt"
    sample.write_text("\n".join(SAMPLE) + "\n")
    measured = int8_smoothing(model, tmp_path, sample, tokenizer)
    about = {"calibration": "sample.txt", "inputs": "5", "weights": weights_fingerprint(model)}
    name = "layers.0.qkv"
    scale = measured[name]
    doctored = {"nan": torch.full_like(scale, float("nan")), "zero": torch.zeros_like(scale),
                "inf": torch.full_like(scale, float("inf")), "negative": -scale,
                "integer": torch.ones_like(scale, dtype=torch.int64), "tiny": torch.full_like(scale, 1e-38),
                "huge": torch.full_like(scale, 1e38), "missing": None}[doctor]
    kept_tensors = ({k: v for k, v in measured.items() if k != name} if doctored is None
                    else {**measured, name: doctored})
    save_file(kept_tensors, str(tmp_path / SMOOTHING_FILE), metadata=about)
    with caplog.at_level(logging.WARNING):
        kept = int8_smoothing(model, tmp_path, None, tokenizer)
    assert kept is None and "is damaged" in caplog.text and name in caplog.text
    batch = _batch(tokenizer, SAMPLE[:3])
    with torch.inference_mode():
        exact = model(**batch).last_hidden_state
        plain = bm.for_inference(model, "int8", smoothing=lambda: kept)(**batch).last_hidden_state
    assert torch.isfinite(plain).all()
    cosine = torch.nn.functional.cosine_similarity(plain.flatten(), exact.flatten(), dim=0)
    assert cosine > 0.9


def test_a_smaller_sample_does_not_replace_the_scales_of_a_larger_one(tmp_path, caplog):
    """Issue 51: a later 2-line --calibration silently replaced the scales of a 40-line one. The larger sample's
    scales stay kept (the smaller one's serve the process that asked for them, and the log says so); a sample at
    least as large replaces them, saying which; deleting the file lets a smaller one in."""
    from safetensors import safe_open

    def kept_inputs() -> str:
        with safe_open(str(tmp_path / SMOOTHING_FILE), "pt") as handle:
            return handle.metadata()["inputs"]

    tokenizer, model = WordPieceTokenizer(VOCAB, do_lower_case=True), _outlier_model()
    large, small = tmp_path / "large.txt", tmp_path / "small.txt"
    large.write_text("\n".join(SAMPLE * 8) + "\n")
    small.write_text("\n".join(SAMPLE[:2]) + "\n")
    int8_smoothing(model, tmp_path, large, tokenizer)
    assert kept_inputs() == "40"
    with caplog.at_level(logging.INFO, logger="bertkit.inference.smoothquant"):
        used = int8_smoothing(model, tmp_path, small, tokenizer)
    assert used is not None and kept_inputs() == "40"
    assert "in this process only" in caplog.text and "keeps those of 40 inputs of large.txt" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="bertkit.inference.smoothquant"):
        int8_smoothing(model, tmp_path, large, tokenizer)
    assert "replacing the scales kept from 40 inputs of large.txt" in caplog.text and kept_inputs() == "40"
    (tmp_path / SMOOTHING_FILE).unlink()
    int8_smoothing(model, tmp_path, small, tokenizer)
    assert kept_inputs() == "2"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_a_read_only_model_directory_keeps_the_scales_for_the_process(tmp_path, caplog):
    tokenizer = WordPieceTokenizer(VOCAB, do_lower_case=True)
    sample = tmp_path / "sample.txt"
    sample.write_text("the cat sat\n")
    directory = tmp_path / "model"
    directory.mkdir()
    directory.chmod(0o500)
    try:
        with caplog.at_level(logging.WARNING):
            assert int8_smoothing(_outlier_model(), directory, sample, tokenizer) is not None
    finally:
        directory.chmod(0o700)
    assert "this process only" in caplog.text


def test_bad_calibration_files_and_settings_are_one_line_errors(tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n")
    with pytest.raises(BertkitError, match="no text in it"):
        read_calibration(empty)
    binary = tmp_path / "binary.txt"
    binary.write_bytes(b"\xff\xfe\x00\x80")
    with pytest.raises(BertkitError, match="cannot read it as UTF-8"):
        read_calibration(binary)
    nul = tmp_path / "nul.txt"
    nul.write_bytes(b"the cat\n\x00\x00\x00\nabc\x00def\n")
    with pytest.raises(BertkitError, match="line 2 holds NUL bytes"):  # never kept as scales beside the model
        read_calibration(nul)
    compressed = tmp_path / "sample.txt.gz"
    compressed.write_bytes(gzip.compress(b"the cat sat\n\nwhere did the dog go\tjohn ran\n"))
    assert read_calibration(compressed) == [("the cat sat", None), ("where did the dog go", "john ran")]
    sample = tmp_path / "sample.txt"
    sample.write_text("the cat\n")
    assert main(["predict", "--model", str(tmp_path), "--input", str(sample), "--output", str(tmp_path / "out"),
                 "--calibration", str(sample)]) == 2
    err = capsys.readouterr().err
    assert "--calibration applies to --precision int8" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_predict_with_int8_and_calibration_end_to_end(tmp_path, capsys):
    import json

    from bertkit.model import BertForSequenceClassification
    from bertkit.tasks.classification import ClassificationSettings, ClassificationTask

    task = ClassificationTask(ClassificationSettings(labels=["a", "b"], max_seq_length=16))
    directory = tmp_path / "cls"
    torch.manual_seed(0)
    BertForSequenceClassification(preset("bert-debug", vocab_size=len(VOCAB), num_labels=2,
                                         id2label={0: "a", 1: "b"})).save_pretrained(
        directory, tokenizer=WordPieceTokenizer(VOCAB, do_lower_case=True))
    (directory / "bertkit_task.json").write_text(json.dumps(task.to_json()))
    rows = tmp_path / "rows.tsv"
    rows.write_text("text\tlabel\n" + "".join(f"{t}\ta\n" for t in ["the cat sat", "the dog ran", "paris"]))
    sample = tmp_path / "sample.txt"  # a line longer than the model's 128 positions: cut as inference cuts it
    sample.write_text("the cat sat on the mat\nwhere did john go\n" + "the dog ran in the park " * 60 + "\n")
    main(["predict", "--model", str(directory), "--input", str(rows), "--output", str(tmp_path / "out"),
          "--precision", "int8", "--calibration", str(sample), "--text-column", "text"])
    assert (directory / SMOOTHING_FILE).is_file() and any((tmp_path / "out").iterdir())


def test_a_calibration_stream_without_line_breaks_is_refused_after_a_bounded_read(tmp_path):
    """Issue 50: a link to /dev/zero as --calibration read 4.4 GB in 20 s. The read is bounded before decoding:
    a line past MAX_CALIBRATION_LINE_BYTES is refused naming the file, having read at most that much (counted on a
    FIFO fed without end; the bound on memory is about one such line), and /dev/zero is refused at its first line."""
    import threading

    from bertkit.inference import smoothquant

    os.symlink("/dev/zero", tmp_path / "zero")
    with pytest.raises(BertkitError, match="line 1 runs past 1,048,576 bytes without a line break"):
        read_calibration(tmp_path / "zero")
    fifo = tmp_path / "stream"
    os.mkfifo(fifo)
    written = {"bytes": 0}

    def feed() -> None:  # "a" forever, until the reader closes the pipe
        chunk = b"a" * 65536
        try:
            with open(fifo, "wb") as out:
                while written["bytes"] < 1 << 30:
                    out.write(chunk)
                    written["bytes"] += len(chunk)
        except BrokenPipeError:
            pass
    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    with pytest.raises(BertkitError, match="runs past"):
        read_calibration(fifo)
    writer.join(timeout=10)
    assert written["bytes"] <= smoothquant.MAX_CALIBRATION_LINE_BYTES + (4 << 20)  # the pipe's buffers, not GBs


def test_an_endless_stream_of_blank_lines_stops_at_the_byte_bound(tmp_path, monkeypatch):
    from bertkit.inference import smoothquant

    monkeypatch.setattr(smoothquant, "MAX_CALIBRATION_BYTES", 4096)
    blank = tmp_path / "blank.txt"
    blank.write_bytes(b"\n" * 100_000)
    with pytest.raises(BertkitError, match=r"no text in it \(read 4,096 bytes\)"):
        read_calibration(blank)


def test_a_calibration_stream_of_lines_is_read_once_and_not_to_its_end(tmp_path):
    """`--calibration <(yes a)`: the first MAX_TEXTS lines are the sample, and the digest kept with the scales is of
    the bytes read (hashing the whole file again never ended on a stream; issue 50's audit)."""
    import threading

    from safetensors import safe_open

    fifo = tmp_path / "yes"
    os.mkfifo(fifo)
    written = {"bytes": 0}

    def feed() -> None:
        try:
            with open(fifo, "wb") as out:
                while written["bytes"] < 1 << 30:
                    out.write(b"the cat sat\n" * 4096)
                    written["bytes"] += 12 * 4096
        except BrokenPipeError:
            pass
    threading.Thread(target=feed, daemon=True).start()
    tokenizer = WordPieceTokenizer(VOCAB, do_lower_case=True)
    assert int8_smoothing(_outlier_model(), tmp_path, fifo, tokenizer) is not None
    assert written["bytes"] < 8 << 20
    with safe_open(str(tmp_path / SMOOTHING_FILE), "pt") as handle:
        about = handle.metadata()
    assert about["inputs"] == "512" and len(about["sha256"]) == 64
