"""The ASCII chunk path of `WordPieceTokenizer.encode_ids` (used by data creation) against the Rust pipeline.

`encode_ids` sends large batches of ASCII text through `chunks.encode_ascii` (cleaned and split at
whitespace by bytes methods, distinct chunks split into words by a regex, WordPiece once over the
distinct words); these tests require the same ids as the full Rust pipeline (whose parity with
Google's tokenizer tests/tokenizer/test_google_parity.py proves) on generated text with every ASCII
character: control characters, tabs and line breaks inside a text, punctuation runs, digits, words
over 100 characters, empty texts; cased and uncased.
"""

from __future__ import annotations

import random
import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bertkit.tokenizer import WordPieceTokenizer
from bertkit.tokenizer.chunks import CHUNK_PATH_MIN_CHARS, ChunkPiece, encode_ascii

PIECES = ["the", "of", "a", "b", "c", "x", "is", "un", "able", "##able", "##s", "##ing", "##a", "##b", "##x",
          "1", "2", "##1", "##2", "The", "A", "B", "##B", ".", ",", "!", "'", "-", "#", "##"]


def tokenizer(lower: bool) -> WordPieceTokenizer:
    return WordPieceTokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *PIECES], do_lower_case=lower)


TOKENIZERS = {lower: tokenizer(lower) for lower in (True, False)}
# Texts built from single ASCII characters and whole chunks (vocabulary words, a word over 100 characters).
ASCII_TEXT = st.lists(st.sampled_from([chr(c) for c in range(128)] + ["the ", "able", "x" * 101]),
                      max_size=40).map("".join)


def rust_ids(tok: WordPieceTokenizer, texts: list[str]) -> list[list[int]]:
    return [e.ids for e in tok._engine.pipeline.encode_batch_fast(texts, add_special_tokens=False)]


@settings(max_examples=300, deadline=None)
@given(texts=st.lists(ASCII_TEXT, max_size=8), lower=st.booleans())
def test_chunk_path_equals_rust_pipeline(texts, lower):
    tok = TOKENIZERS[lower]
    assert encode_ascii(tok._engine.wordpiece, texts, lower) == rust_ids(tok, texts)


@pytest.mark.parametrize("lower", [True, False])
def test_large_mixed_batch_takes_every_path_with_the_same_ids(lower):
    rng = random.Random(0)
    alphabet = string.ascii_letters + string.digits + string.punctuation + "  \t\n\x01"
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 200))) for _ in range(800)]
    texts += ["Café the able", "Σ the", "x\ue000able", "日本 the"]  # Rust, final sigma and private use (Python path)
    tok = TOKENIZERS[lower]
    assert sum(map(len, texts)) >= CHUNK_PATH_MIN_CHARS
    expected = rust_ids(tok, texts[:800]) + [tok.encode_ids([t])[0] for t in texts[800:]]
    assert tok.encode_ids(texts) == expected


FIELDS = ("input_ids", "token_type_ids", "attention_mask", "tokens", "word_ids", "sequence_ids", "offsets")


@pytest.mark.parametrize("lower", [True, False])
@pytest.mark.parametrize("limit", [None, 16], ids=["untruncated", "max_length=16"])
def test_encode_batch_of_a_large_batch_equals_the_rust_path_in_every_field(lower, limit):
    """Large batches of single texts take the chunk path for their ASCII texts (model inputs for
    classification, extraction); every field equals the Rust pipeline's, read one text at a time."""
    rng = random.Random(1)
    alphabet = string.ascii_letters + string.digits + string.punctuation + "  \t\n\x01\x7f"
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 200))) for _ in range(700)]
    texts += ["", "   ", "x" * 101 + " the", "Café the able", "日本 the"]  # empty, blank, [UNK], non-ASCII
    tok = TOKENIZERS[lower]
    assert sum(map(len, texts)) >= CHUNK_PATH_MIN_CHARS
    batch = tok.encode_batch(texts, max_length=limit, truncation=limit is not None)
    assert sum(isinstance(e._pieces[0], ChunkPiece) for e in batch) == 703  # all but the two non-ASCII texts
    for text, encoding in zip(texts, batch, strict=True):
        alone = tok.encode(text, max_length=limit, truncation=limit is not None)  # a small call: Rust path
        assert len(encoding) == len(alone)
        for field in FIELDS:
            assert getattr(encoding, field) == getattr(alone, field), (text, field)


def test_small_batches_keep_the_rust_path_and_pairs_of_large_ones_take_the_chunk_path():
    tok = TOKENIZERS[True]
    assert not any(isinstance(e._pieces[0], ChunkPiece) for e in tok.encode_batch(["the able"] * 10))
    texts = ["the able " * 5000, "a b"]
    pairs = tok.encode_batch(texts, texts[::-1])
    assert all(isinstance(p, ChunkPiece) for e in pairs for p in e._pieces)
    for encoding, a, b in zip(pairs, texts, texts[::-1]):
        alone = tok.encode(a, b)  # a small call: Rust path
        for field in FIELDS:
            assert getattr(encoding, field) == getattr(alone, field), field
