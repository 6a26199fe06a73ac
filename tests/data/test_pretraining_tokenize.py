"""The ASCII chunk path of `WordPieceTokenizer.encode_ids` (used by data creation) against the Rust pipeline.

`encode_ids` sends large batches of ASCII text through `_encode_ascii` (cleaned and split at
whitespace by bytes methods, distinct chunks split into words by a regex, WordPiece once over the
distinct words); these tests require the same ids as the full Rust pipeline (whose parity with
Google's tokenizer tests/test_tokenizer_parity.py proves) on generated text with every ASCII
character: control characters, tabs and line breaks inside a text, punctuation runs, digits, words
over 100 characters, empty texts; cased and uncased.
"""

from __future__ import annotations

import random
import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bertkit.tokenizer import _CHUNK_PATH_MIN_CHARS, WordPieceTokenizer, _encode_ascii

PIECES = ["the", "of", "a", "b", "c", "x", "is", "un", "able", "##able", "##s", "##ing", "##a", "##b", "##x",
          "1", "2", "##1", "##2", "The", "A", "B", "##B", ".", ",", "!", "'", "-", "#", "##"]


def tokenizer(lower: bool) -> WordPieceTokenizer:
    return WordPieceTokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *PIECES], do_lower_case=lower)


TOKENIZERS = {lower: tokenizer(lower) for lower in (True, False)}
# Texts built from single ASCII characters and whole chunks (vocabulary words, a word over 100 characters).
ASCII_TEXT = st.lists(st.sampled_from([chr(c) for c in range(128)] + ["the ", "able", "x" * 101]),
                      max_size=40).map("".join)


def rust_ids(tok: WordPieceTokenizer, texts: list[str]) -> list[list[int]]:
    full, _ = tok._pipelines[None]
    return [e.ids for e in full.encode_batch_fast(texts, add_special_tokens=False)]


@settings(max_examples=300, deadline=None)
@given(texts=st.lists(ASCII_TEXT, max_size=8), lower=st.booleans())
def test_chunk_path_equals_rust_pipeline(texts, lower):
    tok = TOKENIZERS[lower]
    assert _encode_ascii(tok._pipelines[None][1], texts, lower) == rust_ids(tok, texts)


@pytest.mark.parametrize("lower", [True, False])
def test_large_mixed_batch_takes_every_path_with_the_same_ids(lower):
    rng = random.Random(0)
    alphabet = string.ascii_letters + string.digits + string.punctuation + "  \t\n\x01"
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 200))) for _ in range(800)]
    texts += ["Café the able", "Σ the", "x\ue000able", "日本 the"]  # Rust, final sigma and private use (Python path)
    tok = TOKENIZERS[lower]
    assert sum(map(len, texts)) >= _CHUNK_PATH_MIN_CHARS
    expected = rust_ids(tok, texts[:800]) + [tok.encode_ids([t])[0] for t in texts[800:]]
    assert tok.encode_ids(texts) == expected
