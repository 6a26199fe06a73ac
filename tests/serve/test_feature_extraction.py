"""`extract_features`: Google's JSONL layout and layer indexing, values equal to transformers' hidden
states of the same checkpoint, pairs, truncation, and pooled .npy vectors."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import transformers

from bertkit.data.text_inputs import read_lines
from bertkit.errors import BertkitError
from bertkit.settings import ExtractSettings
from bertkit.workflows.extract import extract_features, parse_layers

from .conftest import tokenizer

LINES = ["the cat sat on the mat.", "", "john lives in london ||| the big red house", "paris"]


@pytest.fixture
def input_file(tmp_path):
    path = tmp_path / "input.txt"
    path.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    return path


def _reference(mlm_dir, text, pair=None):
    """transformers' encoder layers (L x (T, H)) and tokens for one line, no padding at all."""
    model = transformers.BertModel.from_pretrained(mlm_dir, add_pooling_layer=False).eval()
    encoding = tokenizer().encode(text, pair)
    with torch.no_grad():
        out = model(torch.tensor([encoding.input_ids]), token_type_ids=torch.tensor([encoding.token_type_ids]),
                    output_hidden_states=True)
    return [h[0] for h in out.hidden_states[1:]], encoding.tokens


def test_jsonl_matches_transformers_layer_by_layer(mlm_dir, input_file, tmp_path):
    output = tmp_path / "features.jsonl"
    assert extract_features(ExtractSettings(mlm_dir, input_file, output, layers="-1,-2", batch_size=3)) == 4
    records = [json.loads(line) for line in output.read_text().splitlines()]
    assert [r["linex_index"] for r in records] == [0, 1, 2, 3]  # input order despite length sorting
    for record, (text, pair) in zip(records, read_lines(input_file)):
        layers, tokens = _reference(mlm_dir, text, pair)
        assert [f["token"] for f in record["features"]] == tokens
        for t, feature in enumerate(record["features"]):
            assert [layer["index"] for layer in feature["layers"]] == [-1, -2]
            for layer in feature["layers"]:
                np.testing.assert_allclose(layer["values"], layers[layer["index"]][t].numpy(), atol=2e-6)
    assert records[2]["features"][-1]["token"] == "[SEP]" and len(records[1]["features"]) == 2  # pair; empty line


def test_pooled_npy_concatenates_the_requested_layers(mlm_dir, input_file, tmp_path):
    output = tmp_path / "vectors.npy"
    extract_features(ExtractSettings(mlm_dir, input_file, output, layers="-1,0", pooling="mean", batch_size=2))
    vectors = np.load(output)
    assert vectors.shape == (4, 64) and vectors.dtype == np.float32
    layers, _ = _reference(mlm_dir, "paris")
    np.testing.assert_allclose(vectors[3], torch.cat([layers[-1].mean(0), layers[0].mean(0)]).numpy(), atol=1e-5)
    extract_features(ExtractSettings(mlm_dir, input_file, output, layers="-1", pooling="cls", overwrite=True))
    np.testing.assert_allclose(np.load(output)[3], layers[-1][0].numpy(), atol=1e-5)


def test_truncation_to_max_seq_length(mlm_dir, tmp_path):
    path = tmp_path / "long.txt"
    path.write_text("the cat " * 50 + "\n", encoding="utf-8")
    extract_features(ExtractSettings(mlm_dir, path, tmp_path / "out.jsonl", layers="-1", max_seq_length=12))
    [record] = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert len(record["features"]) == 12 and record["features"][-1]["token"] == "[SEP]"


def test_errors_name_the_flag(mlm_dir, input_file, tmp_path):
    with pytest.raises(BertkitError, match=r"--layers '-3'.*2 layers"):
        parse_layers("-3", 2)
    with pytest.raises(BertkitError, match="--layers 'a'"):
        parse_layers("a", 2)
    with pytest.raises(BertkitError, match="--input .* not found"):
        extract_features(ExtractSettings(mlm_dir, tmp_path / "missing.txt", tmp_path / "o.jsonl", layers="-1"))
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"ok\n\xff\xfe\n")
    with pytest.raises(BertkitError, match="not valid UTF-8"):
        read_lines(bad)
    with pytest.raises(BertkitError, match="--pooling 'weightedmean': use one of auto"):
        extract_features(ExtractSettings(mlm_dir, input_file, tmp_path / "o.npy", pooling="weightedmean"))
    with pytest.raises(BertkitError, match="--model .*missing: no such model directory"):
        extract_features(ExtractSettings(tmp_path / "missing", input_file, tmp_path / "o.npy"))


def test_the_output_extension_picks_the_format(mlm_dir, input_file, tmp_path):
    with pytest.raises(BertkitError, match=r"--pooling makes one vector per line.*name the output \*\.npy"):
        extract_features(ExtractSettings(mlm_dir, input_file, tmp_path / "v.jsonl", layers="-1", pooling="mean"))
    with pytest.raises(BertkitError, match="--normalize/--no-normalize makes one vector per line"):
        extract_features(ExtractSettings(mlm_dir, input_file, tmp_path / "v.jsonl", layers="-1", normalize=False))
    with pytest.raises(BertkitError, match=r"--output .*v\.txt: name it \*\.jsonl .* or \*\.npy"):
        extract_features(ExtractSettings(mlm_dir, input_file, tmp_path / "v.txt", layers="-1"))
    assert not list(tmp_path.glob("v.*"))
    # .npy without --pooling is "auto": a plain BERT directory's last layer at [CLS], not JSONL text.
    extract_features(ExtractSettings(mlm_dir, input_file, tmp_path / "v.npy"))
    layers, _ = _reference(mlm_dir, "paris")
    np.testing.assert_allclose(np.load(tmp_path / "v.npy")[3], layers[-1][0].numpy(), atol=1e-5)
    extract_features(ExtractSettings(mlm_dir, input_file, tmp_path / "n.npy", layers="-1,-2", pooling="max",
                                     normalize=True))
    expected = torch.cat([layers[-1].amax(0), layers[-2].amax(0)])
    np.testing.assert_allclose(np.load(tmp_path / "n.npy")[3], (expected / expected.norm()).numpy(), atol=1e-5)


def test_tokenizer_from_another_directory(mlm_dir, input_file, tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    for name in ("config.json", "model.safetensors"):
        (model / name).write_bytes((mlm_dir / name).read_bytes())
    with pytest.raises(BertkitError, match="no vocabulary"):
        extract_features(ExtractSettings(model, input_file, tmp_path / "v.npy"))
    extract_features(ExtractSettings(model, input_file, tmp_path / "v.npy", tokenizer=mlm_dir / "vocab.txt"))
    extract_features(ExtractSettings(mlm_dir, input_file, tmp_path / "w.npy"))
    np.testing.assert_array_equal(np.load(tmp_path / "v.npy"), np.load(tmp_path / "w.npy"))
    big = tmp_path / "big.txt"
    big.write_text("\n".join([*tokenizer().vocab, *(f"extra{i}" for i in range(40))]) + "\n", encoding="utf-8")
    with pytest.raises(BertkitError, match=r"big.txt has 82 tokens but .*model/config.json says vocab_size 42"):
        extract_features(ExtractSettings(model, input_file, tmp_path / "v.npy", tokenizer=big))
    with pytest.raises(BertkitError, match=r"big.txt is not the vocabulary of the model in .*\(82 tokens there, 42 in"):
        extract_features(ExtractSettings(mlm_dir, input_file, tmp_path / "v.npy", tokenizer=big))
