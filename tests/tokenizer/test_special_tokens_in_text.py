"""A special token's literal typed in a text ("a [SEP] b") reads as the model directory says, as transformers
reads it (issue 51, item 7): the same ids, offsets and word ids as transformers' fast BertTokenizer, and the same
sentence vectors as sentence-transformers' `encode`, for a directory transformers wrote (the literal is the
token), one whose tokenizer_config.json says `split_special_tokens: true`, and one bertkit wrote (Google's rule:
the literal is text). Every directory is built here from tiny random weights; nothing is downloaded."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from sentence_transformers import SentenceTransformer
from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

from bertkit.tokenizer import CONFIG_FILE, WordPieceTokenizer

WORDS = "the cat sat on mat a b sep mask cls pad unk [ ] ##s 東 京".split()
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
TEXTS = ["the cat [SEP] sat on the mat", "a[MASK]b [CLS] [PAD][UNK]", "[sep] [ SEP ] [MASK", "[SEP]", "",
         "the [MASK] cats 東京[SEP]the", "no literal at all"]
"""Literals alone, inside words, side by side; look-alikes that are text ([sep], [ SEP ], [MASK)."""


def _transformers_directory(directory: Path) -> Path:
    """A tiny random BERT as transformers saves it (tokenizer.json + tokenizer_config.json, no vocab.txt)."""
    directory.mkdir()
    vocab = directory.parent / f"{directory.name}-vocab.txt"
    vocab.write_text("\n".join(VOCAB) + "\n", encoding="utf-8")
    config = transformers.BertConfig(vocab_size=len(VOCAB), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=37, max_position_embeddings=64)
    torch.manual_seed(0)
    transformers.BertModel(config).save_pretrained(directory)
    transformers.BertTokenizerFast(str(vocab), do_lower_case=True).save_pretrained(directory)
    return directory


def _set_split(directory: Path, split: bool) -> None:
    path = directory / CONFIG_FILE
    config = json.loads(path.read_text(encoding="utf-8"))
    path.write_text(json.dumps({**config, "split_special_tokens": split}), encoding="utf-8")


def _assert_same_encodings(directory: Path) -> None:
    ours = WordPieceTokenizer.from_pretrained(directory)
    theirs = transformers.AutoTokenizer.from_pretrained(directory)
    seconds = [text or "b" for text in TEXTS[::-1]]  # transformers takes an empty second text for no pair
    for encoding, text, second in zip(ours.encode_batch(TEXTS, seconds), TEXTS, seconds):
        expected = theirs(text, second, return_offsets_mapping=True)
        assert encoding.input_ids == expected["input_ids"], text
        assert encoding.offsets == [tuple(span) for span in expected["offset_mapping"]], text
        assert (encoding.word_ids, encoding.sequence_ids) == (expected.word_ids(), expected.sequence_ids()), text
    assert ours.encode_ids(TEXTS) == theirs(TEXTS, add_special_tokens=False)["input_ids"]


def test_a_transformers_directory_reads_the_literals_as_the_tokens(tmp_path):
    directory = _transformers_directory(tmp_path / "bert")
    tokenizer = WordPieceTokenizer.from_pretrained(directory)
    assert tokenizer.split_special_tokens is False  # transformers' default: the key is absent
    assert tokenizer.tokenize("a[MASK]b [sep]") == ["a", "[MASK]", "b", "[", "sep", "]"]
    encoding = tokenizer.encode("the cat [SEP] sat")
    assert encoding.input_ids == [2, *tokenizer.encode_ids(["the cat"])[0], 3, *tokenizer.encode_ids(["sat"])[0], 3]
    assert (encoding.offsets[3], encoding.word_ids[3]) == ((8, 13), 2)  # its span; a word of its own
    _assert_same_encodings(directory)


def test_split_special_tokens_true_makes_them_text(tmp_path):
    directory = _transformers_directory(tmp_path / "bert")
    _set_split(directory, True)
    assert WordPieceTokenizer.from_pretrained(directory).tokenize("a [SEP]") == ["a", "[", "sep", "]"]
    _assert_same_encodings(directory)


def test_a_directory_bertkit_writes_says_google_s_rule_and_reads_the_same_in_transformers(tmp_path):
    ours = WordPieceTokenizer(VOCAB)  # built or trained here: Google's rule, the literal is text
    assert ours.split_special_tokens and ours.tokenize("a [SEP]") == ["a", "[", "sep", "]"]
    ours.save_pretrained(tmp_path / "ours")
    assert json.loads((tmp_path / "ours" / CONFIG_FILE).read_text())["split_special_tokens"] is True
    _assert_same_encodings(tmp_path / "ours")
    WordPieceTokenizer(VOCAB, split_special_tokens=False).save_pretrained(tmp_path / "theirs")
    assert WordPieceTokenizer.from_pretrained(tmp_path / "theirs").split_special_tokens is False
    _assert_same_encodings(tmp_path / "theirs")


def test_a_vocab_txt_alone_reads_by_google_s_rule(tmp_path):
    (tmp_path / "vocab.txt").write_text("\n".join(VOCAB) + "\n", encoding="utf-8")
    assert WordPieceTokenizer.from_pretrained(tmp_path).split_special_tokens is True  # Google's release layout
    reading = WordPieceTokenizer.from_pretrained(tmp_path, split_special_tokens=False)
    assert reading.tokenize("a [SEP]") == ["a", "[SEP]"]
    for name in ("config.json", CONFIG_FILE):  # a model directory, a tokenizer_config.json: transformers loads it
        (tmp_path / name).write_text('{"do_lower_case": true}', encoding="utf-8")
        assert WordPieceTokenizer.from_pretrained(tmp_path).split_special_tokens is False


@pytest.mark.parametrize("split", [None, True], ids=["transformers-default", "split"])
def test_sentence_vectors_equal_sentence_transformers_with_literals_in_the_text(tmp_path, split):
    from bertkit.serve.predictor import load_predictor

    bert = _transformers_directory(tmp_path / "bert")
    model = SentenceTransformer(modules=[Transformer(str(bert), max_seq_length=32), Pooling(32, pooling_mode="mean")],
                                device="cpu")
    directory = tmp_path / "st"
    model.save(str(directory))
    shutil.copy(tmp_path / "bert-vocab.txt", directory / "vocab.txt")  # as models on the hub ship it
    if split is not None:
        _set_split(directory, split)
        model = SentenceTransformer(str(directory), device="cpu")
    texts = [text for text in TEXTS if text]  # an empty input is refused by the predictor
    ours = load_predictor(directory, batch_size=3).embed(texts)
    np.testing.assert_allclose(ours, model.encode(texts), atol=1e-5)
