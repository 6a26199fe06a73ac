"""Sentence-transformers directories: `bertkit extract` (.npy, pooling auto) and `Predictor.embed` give the
vectors of sentence-transformers' own `encode` for the same directory, built here with the real library
from a tiny random transformers BertModel (no downloads): every pooling mode it shares with bertkit,
with and without Normalize, a max_seq_length shorter than some texts, lowercasing, and the older file
layout; modules bertkit does not implement are refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import transformers
from sentence_transformers import SentenceTransformer
from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

from bertkit.errors import BertkitError
from bertkit.interop.sentence_transformers import read_sentence_transformers
from bertkit.serve.predictor import load_predictor
from bertkit.settings import ExtractSettings
from bertkit.workflows.extract import extract_features

from .conftest import MAX_SEQ_LENGTH, tokenizer

TEXTS = ["the cat sat on the mat.", "John Smith lives in London, in a big red house!", "paris", "",
         "where did the dog go? the dog ran in the park and the cat sat under the house"]


def _save(model: SentenceTransformer, directory: Path, bert_dir: Path) -> Path:
    model.save(str(directory))
    # sentence-transformers 5+ saves tokenizer.json only; models on the hub ship vocab.txt beside it.
    shutil.copy(bert_dir / "vocab.txt", directory / "vocab.txt")
    return directory


def _compare(directory: Path, expected: np.ndarray, tmp_path: Path) -> None:
    source = tmp_path / "lines.txt"
    source.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    extract_features(ExtractSettings(directory, source, tmp_path / "vectors.npy", batch_size=2))
    np.testing.assert_allclose(np.load(tmp_path / "vectors.npy"), expected, atol=1e-5)
    predictor = load_predictor(directory, batch_size=2)
    np.testing.assert_allclose(predictor.embed(TEXTS), expected, atol=1e-5)


def test_server_embed_follows_the_directory(bert_dir, tmp_path):
    """/embed with no pooling or normalize fields answers with the directory's own vectors."""
    from fastapi.testclient import TestClient

    from bertkit.serve.app import create_app

    model = SentenceTransformer(modules=[Transformer(str(bert_dir), max_seq_length=MAX_SEQ_LENGTH),
                                         Pooling(32, pooling_mode="mean"), Normalize()], device="cpu")
    directory = _save(model, tmp_path / "st", bert_dir)
    with TestClient(create_app(load_predictor(directory))) as client:
        response = client.post("/embed", json={"inputs": TEXTS[:3] + TEXTS[4:]})  # "" is refused (400), as TEI
    assert response.status_code == 200, response.text
    np.testing.assert_allclose(response.json(), model.encode(TEXTS[:3] + TEXTS[4:]), atol=1e-5)


def test_some_texts_are_longer_than_max_seq_length():
    assert max(len(e) for e in tokenizer().encode_batch(TEXTS, truncation=False)) > MAX_SEQ_LENGTH


@pytest.mark.parametrize(("pooling", "normalize"), [
    ("mean", True), ("mean", False), ("cls", True), ("cls", False), ("max", True), ("max", False),
    ("mean_sqrt_len_tokens", False), (("cls", "mean"), True)])
def test_vectors_equal_sentence_transformers(bert_dir, tmp_path, pooling, normalize):
    transformer = Transformer(str(bert_dir), max_seq_length=MAX_SEQ_LENGTH)
    modules = [transformer, Pooling(32, pooling_mode=pooling)] + ([Normalize()] if normalize else [])
    model = SentenceTransformer(modules=modules, device="cpu")
    directory = _save(model, tmp_path / "st", bert_dir)
    settings = read_sentence_transformers(directory)
    assert settings.poolings == ((pooling,) if isinstance(pooling, str) else pooling)
    assert (settings.normalize, settings.max_seq_length) == (normalize, MAX_SEQ_LENGTH)
    _compare(directory, model.encode(TEXTS), tmp_path)


def test_explicit_pooling_overrides_the_directory(bert_dir, tmp_path):
    model = SentenceTransformer(modules=[Transformer(str(bert_dir), max_seq_length=MAX_SEQ_LENGTH),
                                         Pooling(32, pooling_mode="mean"), Normalize()], device="cpu")
    predictor = load_predictor(_save(model, tmp_path / "st", bert_dir))
    tokens = model.encode(TEXTS, output_value="token_embeddings")  # N x (T_i, H), cut at max_seq_length
    np.testing.assert_allclose(predictor.embed(TEXTS, "cls", normalize=False), [t[0].numpy() for t in tokens],
                               atol=1e-5)


def test_default_prompt_goes_before_every_text(bert_dir, tmp_path):
    model = SentenceTransformer(modules=[Transformer(str(bert_dir), max_seq_length=MAX_SEQ_LENGTH),
                                         Pooling(32, pooling_mode="mean")], device="cpu",
                                prompts={"query": "where did "}, default_prompt_name="query")
    directory = _save(model, tmp_path / "st", bert_dir)
    assert read_sentence_transformers(directory).prompt == "where did "
    _compare(directory, model.encode(TEXTS), tmp_path)


def test_older_layout_and_lowercasing(bert_dir, tmp_path):
    """The files sentence-transformers 2.x wrote (pooling_mode_* booleans, max_seq_length and
    do_lower_case in sentence_bert_config.json, no 2_Normalize folder), over a cased tokenizer."""
    directory = tmp_path / "old"
    shutil.copytree(bert_dir, directory)
    transformers.BertTokenizerFast(str(bert_dir / "vocab.txt"), do_lower_case=False).save_pretrained(directory)
    modules = [{"idx": i, "name": str(i), "path": path, "type": f"sentence_transformers.models.{kind}"}
               for i, (path, kind) in enumerate([("", "Transformer"), ("1_Pooling", "Pooling"),
                                                 ("2_Normalize", "Normalize")])]
    (directory / "modules.json").write_text(json.dumps(modules), encoding="utf-8")
    (directory / "1_Pooling").mkdir()
    (directory / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": 32, "pooling_mode_cls_token": False, "pooling_mode_mean_tokens": False,
         "pooling_mode_max_tokens": True, "pooling_mode_mean_sqrt_len_tokens": False}), encoding="utf-8")
    (directory / "sentence_bert_config.json").write_text(json.dumps(
        {"max_seq_length": MAX_SEQ_LENGTH, "do_lower_case": True}), encoding="utf-8")
    assert read_sentence_transformers(directory).do_lower_case
    model = SentenceTransformer(str(directory), device="cpu")
    assert model.max_seq_length == MAX_SEQ_LENGTH
    _compare(directory, model.encode(TEXTS), tmp_path)


def _write_modules(directory: Path, kinds: list[str], pooling: dict, transformer_path: str = "") -> Path:
    directory.mkdir()
    (directory / "modules.json").write_text(json.dumps(
        [{"path": transformer_path if k == "Transformer" else f"{i}_{k}", "type": f"sentence_transformers.models.{k}"}
         for i, k in enumerate(kinds)]), encoding="utf-8")
    (directory / "1_Pooling").mkdir()
    (directory / "1_Pooling" / "config.json").write_text(json.dumps(pooling), encoding="utf-8")
    return directory


def test_unsupported_modules_and_modes_are_refused(mlm_dir, tmp_path):
    assert read_sentence_transformers(mlm_dir) is None
    with pytest.raises(BertkitError, match="modules Transformer, Pooling, Dense are not a BERT sentence encoder"):
        read_sentence_transformers(_write_modules(tmp_path / "dense", ["Transformer", "Pooling", "Dense"], {}))
    with pytest.raises(BertkitError, match="the transformer lives in '0_Transformer'"):
        read_sentence_transformers(_write_modules(tmp_path / "sub", ["Transformer", "Pooling"], {}, "0_Transformer"))
    weighted = _write_modules(tmp_path / "weighted", ["Transformer", "Pooling"], {"pooling_mode": "weightedmean"})
    with pytest.raises(BertkitError, match="pooling mode 'weightedmean' is not supported"):
        read_sentence_transformers(weighted)
    legacy = _write_modules(tmp_path / "last", ["Transformer", "Pooling"], {"pooling_mode_lasttoken": True})
    with pytest.raises(BertkitError, match="pooling mode 'lasttoken' is not supported"):
        read_sentence_transformers(legacy)
    source = tmp_path / "in.txt"
    source.write_text("the cat\n", encoding="utf-8")
    for model_file in mlm_dir.iterdir():  # a whole model directory: extract checks that first
        if model_file.is_file() and not (weighted / model_file.name).exists():
            (weighted / model_file.name).write_bytes(model_file.read_bytes())
    with pytest.raises(BertkitError, match="weightedmean"):
        extract_features(ExtractSettings(weighted, source, tmp_path / "v.npy"))
