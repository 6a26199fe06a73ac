"""The ASCII chunk path: WordPiece once per distinct word of a batch, the same ids as the Rust pipeline.

On ASCII, BERT's normalizer and pre-tokenizer reduce to: drop control characters (all but tab, LF,
CR; they join their neighbours), lower-case (uncased vocabularies), split at whitespace, make every
ASCII punctuation mark a word of its own. So a batch is cleaned and split at whitespace by bytes
methods, the distinct chunks are split into words by a regex, and WordPiece runs once, over the
distinct words, in one Rust call.

Design decision: kept because it pays where it is used. Natural text repeats its chunks and words.
benchmarks/tokenization.py times bertkit with and without this path and transformers in one run,
in turn (bundled corpus, batches of 1000 lines, Rust on one thread; two runs on 2 busy cores;
docs/tokenizer.md): the path makes ids 3.1x as fast (5.2-5.4x transformers, against 1.7x without it),
model inputs 3.0-3.5x (3.7-4.1x against 1.2x) and pairs 3.5-5.2x (3.9-6.6x against 1.1-1.25x).
Its pieces know their ids; offsets and word ids come from the Rust pipeline, for the whole batch,
only when one of them is read. tests/data/test_pretraining_tokenize.py checks every field against
the Rust pipeline on generated text.
"""

from __future__ import annotations

import functools
import itertools
import re

import numpy as np
from tokenizers import Encoding, Tokenizer

CHUNK_PATH_MIN_CHARS = 1 << 16
"""Smallest batch (characters) for the chunk path; below it the Rust pipeline's lower overhead wins."""
_ASCII_CONTROL = bytes([*range(0x09), 0x0B, 0x0C, *range(0x0E, 0x20), 0x7F])
"""Dropped by BERT's text cleaning: control characters other than tab, LF and CR."""
_LF_TO_NUL = bytes.maketrans(b"\n", b"\x00")
"""After the cleaning, NUL and SOH can only be separators: NUL between texts, SOH between chunks."""
_ASCII_WORD = re.compile(rb"[0-9A-Za-z]+|[!-/:-@\[-`{-~]|\x01")


def encode_ascii(wordpiece: Tokenizer, texts: list[str], do_lower_case: bool) -> list[list[int]]:
    """Token ids of ASCII texts, equal to the full Rust pipeline's; `wordpiece` is the WordPiece-only pipeline."""
    if not texts:
        return []
    joined = " \n ".join(texts)
    if joined.count("\n") != len(texts) - 1:  # a text's own line breaks are whitespace
        joined = " \n ".join(t.replace("\n", " ") for t in texts)
    data = joined.encode("ascii").translate(_LF_TO_NUL, _ASCII_CONTROL)
    chunks, chunk = _codes((data.lower() if do_lower_case else data).split())  # a b"\x00" chunk ends a text
    words, word = _codes(_ASCII_WORD.findall(b"\x01".join(chunks) + b"\x01"))  # words of each distinct chunk
    encoding = wordpiece.encode([w.decode("ascii").strip("\x01") for w in words], is_pretokenized=True,
                                add_special_tokens=False)  # one call; separators go in as "" (no pieces)
    word_counts = np.bincount(np.array(encoding.word_ids, dtype=np.int64), minlength=len(words))
    pieces, word_start = _concatenated(np.array(encoding.ids, dtype=np.int64), word_counts, word)
    chunk_counts = np.diff(word_start[word == words[b"\x01"]], prepend=0)  # pieces of each distinct chunk
    ids, chunk_start = _concatenated(pieces, chunk_counts, chunk)
    ends = chunk_start[chunk == chunks[b"\x00"]].tolist() if b"\x00" in chunks else []
    flat = ids.tolist()
    edges = [0, *ends, len(flat)]
    return [flat[a:b] for a, b in itertools.pairwise(edges)]


def _codes(items: list[bytes]) -> tuple[dict[bytes, int], np.ndarray]:
    """(distinct items -> code, in first-seen order; (len(items),) code of each item)."""
    index = {x: k for k, x in enumerate(dict.fromkeys(items))}
    return index, np.fromiter(map(index.__getitem__, items), dtype=np.int64, count=len(items))


def _concatenated(table: np.ndarray, counts: np.ndarray, codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Values of items `codes`, back to back (item k owns counts[k] values of `table`, in order), and
    where each occurrence starts in the result."""
    n = counts[codes]
    out_start = np.cumsum(n) - n
    return table[np.repeat(np.cumsum(counts)[codes] - n - out_start, n) + np.arange(int(n.sum()))], out_start


def chunk_pieces(pipeline: Tokenizer, wordpiece: Tokenizer, texts: list[str], do_lower_case: bool) -> list[ChunkPiece]:
    """Each ASCII text's encoding by the chunk path; `pipeline` (the full Rust one) fills in offsets on demand."""
    batch = _DeferredBatch(pipeline, texts)
    return [ChunkPiece(ids, batch, k) for k, ids in enumerate(encode_ascii(wordpiece, texts, do_lower_case))]


class _DeferredBatch:
    """Texts whose Rust-pipeline encodings are computed only if a field the chunk path does not produce
    is read, then for the whole batch in one call."""

    def __init__(self, pipeline: Tokenizer, texts: list[str]) -> None:
        self.pipeline, self.texts = pipeline, texts

    @functools.cached_property
    def encodings(self) -> list[Encoding]:
        return self.pipeline.encode_batch(self.texts, add_special_tokens=False)


class ChunkPiece:
    """One text's encoding by the chunk path: its ids now, offsets and word ids from its batch when read."""

    __slots__ = ("_batch", "_index", "ids")

    def __init__(self, ids: list[int], batch: _DeferredBatch, index: int) -> None:
        self.ids, self._batch, self._index = ids, batch, index

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def offsets(self) -> list[tuple[int, int]]:
        return self._batch.encodings[self._index].offsets

    @property
    def word_ids(self) -> list[int | None]:
        return self._batch.encodings[self._index].word_ids
