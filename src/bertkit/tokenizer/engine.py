"""The tokenizer's engine: each text's WordPiece encoding, by whichever of three ways is exact and fastest.

`Engine.encode(texts)` gives each text encoded alone (ids, offsets into the text, word ids; no
special tokens, never truncated), `Engine.encode_ids(texts)` only its ids. Per text, one of:
- the `tokenizers` (Rust) pipeline: BertNormalizer, BertPreTokenizer and WordPiece run Google's
  rules at native speed;
- Google's algorithm in Python (`google.FullTokenizer`), for texts holding a code point where the
  Rust pipeline departs from Google (`HAZARD_RANGES`; never an ASCII text);
- the ASCII chunk path (`chunks`), for the ASCII texts of a batch of at least
  `CHUNK_PATH_MIN_CHARS` characters.
All three give the same fields (a `tokenizers` Encoding, `google.WordPieces`, `chunks.ChunkPiece`).
Where the vocabulary reads special tokens' literals in text (`split_special_tokens` False, transformers'
default: `bertkit.tokenizer.vocab`), a text holding "[SEP]" or another special token's literal is cut there
first, as transformers' added-token matching cuts it (the raw text, case-sensitive, anywhere); the text
between is encoded alone by those ways and the literal becomes the token (`_Joined`), a word of its own.

Design decision: the Rust pipeline is used as a library of Google's steps, never for what it does
differently: it agrees with Google's code on every character except a measured set, found by
running both on "a" + chr(cp) + "b" for every code point, cased and uncased (tokenizers 0.23,
Python 3.11 / Unicode 14; tests/tokenizer/test_google_parity.py re-checks the claim): private-use
characters it drops, characters its older Unicode tables classify differently, CJK Extension code
points its range table misses, the context-dependent final sigma of Python's `str.lower` (U+03A3),
and lone surrogates it cannot receive. Neither pipeline truncates: the Rust library truncates
pairs in quadratic time, so `Encoding` cuts what the engine returns.

References: Hugging Face `tokenizers` documentation (normalizers.BertNormalizer,
pre_tokenizers.BertPreTokenizer, models.WordPiece); google-research/bert `tokenization.py`.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

from bertkit.tokenizer.chunks import CHUNK_PATH_MIN_CHARS, chunk_pieces, encode_ascii
from bertkit.tokenizer.encoding import Piece
from bertkit.tokenizer.google import MAX_INPUT_CHARS_PER_WORD, FullTokenizer
from bertkit.tokenizer.vocab import SPECIAL_TOKENS, UNK

HAZARD_RANGES: tuple[tuple[int, int], ...] = (
    (0x03A3, 0x03A3), (0x061D, 0x061D), (0x07FD, 0x07FD), (0x0890, 0x0891), (0x0898, 0x089F),
    (0x08CA, 0x08E2), (0x09FD, 0x09FE), (0x0A76, 0x0A76), (0x0AFA, 0x0AFF), (0x0B55, 0x0B55),
    (0x0C04, 0x0C04), (0x0C3C, 0x0C3C), (0x0C77, 0x0C77), (0x0C84, 0x0C84), (0x0D00, 0x0D00),
    (0x0D3B, 0x0D3C), (0x0D81, 0x0D81), (0x0EBA, 0x0EBA), (0x166D, 0x166D), (0x1734, 0x1734),
    (0x180F, 0x180F), (0x1885, 0x1886), (0x1ABF, 0x1ACE), (0x1B7D, 0x1B7E), (0x1C89, 0x1C89),
    (0x1DF6, 0x1DFB), (0x2E43, 0x2E4F), (0x2E52, 0x2E5D), (0xA7CB, 0xA7CC), (0xA7CE, 0xA7CE),
    (0xA7D2, 0xA7D2), (0xA7D4, 0xA7D4), (0xA7DA, 0xA7DA), (0xA7DC, 0xA7DC), (0xA82C, 0xA82C),
    (0xA8C5, 0xA8C5), (0xA8FF, 0xA8FF), (0xA9BD, 0xA9BD), (0xD800, 0xF8FF), (0x10D24, 0x10D27),
    (0x10D50, 0x10D65), (0x10EAB, 0x10EAD), (0x10F46, 0x10F50), (0x10F55, 0x10F59),
    (0x10F82, 0x10F89), (0x11070, 0x11070), (0x11073, 0x11074), (0x110C2, 0x110C2),
    (0x110CD, 0x110CD), (0x111C9, 0x111C9), (0x111CF, 0x111CF), (0x1123E, 0x1123E),
    (0x1133B, 0x1133B), (0x11438, 0x1143F), (0x11442, 0x11444), (0x11446, 0x11446),
    (0x1144B, 0x1144F), (0x1145A, 0x1145B), (0x1145D, 0x1145E), (0x11660, 0x1166C),
    (0x116B9, 0x116B9), (0x1182F, 0x11837), (0x11839, 0x1183B), (0x11938, 0x11938),
    (0x1193B, 0x1193C), (0x1193E, 0x1193E), (0x11943, 0x11946), (0x119D4, 0x119D7),
    (0x119DA, 0x119DB), (0x119E0, 0x119E0), (0x119E2, 0x119E2), (0x11A01, 0x11A0A),
    (0x11A33, 0x11A38), (0x11A3B, 0x11A47), (0x11A51, 0x11A56), (0x11A59, 0x11A5B),
    (0x11A8A, 0x11A96), (0x11A98, 0x11A9C), (0x11A9E, 0x11AA2), (0x11C30, 0x11C36),
    (0x11C38, 0x11C3D), (0x11C3F, 0x11C3F), (0x11C41, 0x11C45), (0x11C70, 0x11C71),
    (0x11C92, 0x11CA7), (0x11CAA, 0x11CB0), (0x11CB2, 0x11CB3), (0x11CB5, 0x11CB6),
    (0x11D31, 0x11D36), (0x11D3A, 0x11D3A), (0x11D3C, 0x11D3D), (0x11D3F, 0x11D45),
    (0x11D47, 0x11D47), (0x11D90, 0x11D91), (0x11D95, 0x11D95), (0x11D97, 0x11D97),
    (0x11EF3, 0x11EF4), (0x11EF7, 0x11EF8), (0x11FFF, 0x11FFF), (0x12FF1, 0x12FF2),
    (0x13430, 0x13438), (0x16E97, 0x16E9A), (0x16EA0, 0x16EB8), (0x16F4F, 0x16F4F),
    (0x16FE2, 0x16FE2), (0x16FE4, 0x16FE4), (0x1CF00, 0x1CF2D), (0x1CF30, 0x1CF46),
    (0x1E000, 0x1E006), (0x1E008, 0x1E018), (0x1E01B, 0x1E021), (0x1E023, 0x1E024),
    (0x1E026, 0x1E02A), (0x1E130, 0x1E136), (0x1E2AE, 0x1E2AE), (0x1E2EC, 0x1E2EF),
    (0x1E944, 0x1E94A), (0x1E95E, 0x1E95F), (0x2B820, 0x2B91F), (0xF0000, 0x10FFFF),
)
"""Code points where the Rust pipeline and Google's code disagree: mostly private use (E000-F8FF,
planes 15-16), the CJK Extension C tail 2B820-2B91F and characters whose category changed between
Unicode versions; plus U+03A3 (final sigma) and the surrogates."""
_HAZARD_RE = re.compile("[" + "".join(f"\\U{a:08x}-\\U{b:08x}" for a, b in HAZARD_RANGES) + "]")


def needs_google_path(text: str) -> bool:
    """True when the Rust pipeline could differ from Google's code on `text` (never for ASCII)."""
    return not text.isascii() and _HAZARD_RE.search(text) is not None


def bert_normalizer(do_lower_case: bool) -> normalizers.Normalizer:
    """The Rust pipeline's text cleaning, CJK spacing and (uncased) lower-casing and accent stripping."""
    # Google couples accent stripping to lower-casing; say so explicitly rather than rely on the default.
    return normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=do_lower_case, lowercase=do_lower_case
    )


def _rust_pipeline(vocab: dict[str, int], normalizer: normalizers.Normalizer | None) -> Tokenizer:
    """WordPiece over `vocab`; with a normalizer, also BERT's pre-tokenizer (the full pipeline)."""
    pipeline = Tokenizer(models.WordPiece(
        vocab, unk_token=UNK, max_input_chars_per_word=MAX_INPUT_CHARS_PER_WORD, continuing_subword_prefix="##",
    ))
    if normalizer is not None:
        pipeline.normalizer = normalizer
        pipeline.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    pipeline.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    return pipeline


class Engine:
    """Google's rules over one vocabulary: the Rust pipeline, the chunk path and Google's code in Python.

    Immutable and safe to share between threads.
    """

    chunk_path_min_chars: float = CHUNK_PATH_MIN_CHARS
    """Smallest batch (characters) whose ASCII texts take the chunk path; benchmarks/tokenization.py
    sets it to infinity on one instance to measure what the path buys."""

    def __init__(self, vocab: dict[str, int], do_lower_case: bool, split_special_tokens: bool = True) -> None:
        self.do_lower_case = do_lower_case
        self.pipeline = _rust_pipeline(vocab, bert_normalizer(do_lower_case))
        self.wordpiece = _rust_pipeline(vocab, None)  # for the words of the chunk path
        self.google = FullTokenizer(vocab, do_lower_case, UNK)
        self.special_ids = {token: vocab[token] for token in SPECIAL_TOKENS}
        self.special_literals = None if split_special_tokens else re.compile("|".join(map(re.escape, SPECIAL_TOKENS)))

    def encode(self, texts: Sequence[str]) -> list[Piece]:
        """Each text encoded alone: ids, offsets and word ids, no specials added, never truncated."""
        return self._reading_literals(texts, lambda batch: self._each(
            batch,
            lambda chunk: chunk_pieces(self.pipeline, self.wordpiece, chunk, self.do_lower_case),
            lambda rest: self.pipeline.encode_batch(rest, add_special_tokens=False),
            self.google.encode,
        ), pieces=True)

    def encode_ids(self, texts: Sequence[str]) -> list[list[int]]:
        """Each text's token ids, no specials added, never truncated."""
        return self._reading_literals(texts, lambda batch: self._each(
            batch,
            lambda chunk: encode_ascii(self.wordpiece, chunk, self.do_lower_case),
            lambda rest: [e.ids for e in self.pipeline.encode_batch_fast(rest, add_special_tokens=False)],
            lambda text: self.google.encode(text).ids,
        ), pieces=False)

    def _reading_literals(self, texts: Sequence[str], encode: Callable[[list[str]], list], pieces: bool) -> list:
        """`encode(texts)`, where a text holding special tokens' literals (read as the tokens: module docstring)
        is encoded as the texts around them, in the same batch, and joined with them: a `_Joined` piece, or
        (`pieces` False) its ids."""
        pattern = self.special_literals
        marked = [] if pattern is None else [i for i, text in enumerate(texts) if "[" in text and pattern.search(text)]
        if pattern is None or not marked:
            return encode(list(texts))
        batch, layouts = list(texts), {}
        for i in marked:
            found = [(self.special_ids[m.group()], m.start(), m.end()) for m in pattern.finditer(texts[i])]
            starts = [0] + [end for _, _, end in found]
            ends = [start for _, start, _ in found] + [len(texts[i])]
            layouts[i] = (len(batch), starts, found)
            batch[i] = ""  # encoded from the texts around its literals
            batch += [texts[i][a:b] for a, b in zip(starts, ends)]
        results = encode(batch)
        out = results[:len(texts)]
        for i, (first, starts, found) in layouts.items():
            parts = results[first:first + len(starts)]
            out[i] = _Joined(parts, starts, found) if pieces else _joined_ids(parts, found)
        return out

    def decode(self, tokens: list[str]) -> str:
        """Tokens joined by spaces, `##` continuations glued to their word."""
        return self.pipeline.decoder.decode(tokens)

    def _each(self, texts: Sequence[str], chunk_path: Callable[[list[str]], list],
              rust_path: Callable[[list[str]], list], google_path: Callable[[str], object]) -> list:
        """Each text's result by its way: the ASCII texts of a batch of at least `chunk_path_min_chars`
        characters by `chunk_path`, texts the Rust pipeline gets wrong by `google_path`, the rest by
        `rust_path` (the two batch paths in one call each)."""
        chunk: list[int] = []
        rest: Sequence[int] = range(len(texts))
        if sum(map(len, texts)) >= self.chunk_path_min_chars:
            chunk = [i for i in rest if texts[i].isascii()]
            rest = [i for i in rest if not texts[i].isascii()]
        google = [i for i in rest if needs_google_path(texts[i])]
        rust = [i for i in rest if not needs_google_path(texts[i])] if google else rest
        out: list = [None] * len(texts)
        for indices, results in ((chunk, chunk_path([texts[i] for i in chunk])),
                                 (rust, rust_path([texts[i] for i in rust])),
                                 (google, [google_path(texts[i]) for i in google])):
            for i, result in zip(indices, results):
                out[i] = result
        return out


class _Joined:
    """A text encoded around its special tokens' literals: the pieces of the texts between them (`parts`, each
    starting at `starts[k]` in the text) and the literals as (id, start, end), one between each two parts."""

    def __init__(self, parts: list[Piece], starts: list[int], literals: list[tuple[int, int, int]]) -> None:
        self._parts, self._starts, self._literals = parts, starts, literals
        self.ids = _joined_ids([part.ids for part in parts], literals)

    def __len__(self) -> int:
        return len(self.ids)

    @functools.cached_property
    def offsets(self) -> list[tuple[int, int]]:
        """Each part's offsets moved to where it starts in the text; a literal's own span."""
        out = list(self._parts[0].offsets)  # the first part starts the text
        for (_, start, end), part, shift in zip(self._literals, self._parts[1:], self._starts[1:]):
            out += [(start, end), *((a + shift, b + shift) for a, b in part.offsets)]
        return out

    @functools.cached_property
    def word_ids(self) -> list[int | None]:
        """Words counted through the whole text, a literal one word (as transformers numbers them)."""
        out: list[int | None] = []
        words = 0
        for k, part in enumerate(self._parts):
            if k:  # the literal before this part
                out.append(words)
                words += 1
            part_words = [word for word in part.word_ids if word is not None]
            out += [word + words for word in part_words]
            words += max(part_words, default=-1) + 1
        return out


def _joined_ids(parts: list[list[int]], literals: list[tuple[int, int, int]]) -> list[int]:
    """The ids of a text encoded around its special tokens' literals (`_Joined`)."""
    ids = list(parts[0])
    for (token, _, _), part in zip(literals, parts[1:]):
        ids += [token, *part]
    return ids
