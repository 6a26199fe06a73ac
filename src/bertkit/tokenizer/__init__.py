"""WordPiece tokenizer: Google's BERT tokenization, executed by the `tokenizers` library.

`WordPieceTokenizer` trains a vocabulary, loads/saves `vocab.txt` (ids exactly as the file's line
numbers), and encodes one text or a pair as `[CLS] A [SEP] B [SEP]` with token type ids, attention
mask, character offsets into the original text, word ids and sequence ids.

Design decision: the rules are Google's `tokenization.py` (google-research/bert) - clean text (drop
NUL, U+FFFD and Cc/Cf control characters; Zs, tab, CR, LF -> space), pad CJK ideographs with
spaces, whitespace split, lower-case then NFD accent strip (drop Mn) for uncased vocabularies,
punctuation split (every ASCII non-alphanumeric plus Unicode P*), greedy longest-match-first
WordPiece with `##` continuations, words longer than 100 characters -> [UNK] (the cap of
transformers' BERT tokenizer; Google's code defaults to 200). The Rust pipeline (BertNormalizer,
BertPreTokenizer, WordPiece) runs them at native speed and agrees with Google's code on every
character except a measured set (`_HAZARD_RANGES`: private-use characters it drops, characters its
older Unicode tables classify differently, CJK Extension code points its range table misses, the
context-dependent final sigma of Python's `str.lower`, and lone surrogates it cannot receive).
Texts containing one of those (never plain ASCII) go through `_GoogleBasicTokenizer`, a Python
port of Google's basic tokenizer that keeps each character's position in the original text, and
only the WordPiece step runs in Rust. Tests prove parity with a reference port of Google's code.
Every text, A or B of a pair alike, is encoded alone and never truncated by Rust; `Encoding` cuts
it (a pair by Google's `_truncate_seq_pair`), so every cost is linear in the input.

References: Devlin et al. 2018 (arXiv:1810.04805); google-research/bert `tokenization.py` and
`run_classifier.py` (`_truncate_seq_pair`); Schuster & Nakajima 2012 (WordPiece); Hugging Face
`tokenizers` documentation.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import re
import unicodedata
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from bertkit.atomic import write_text_atomic
from bertkit.errors import BertkitError, where
from bertkit.textlines import GZIP_ERRORS, bounded_lines, decode_line, open_binary, unreadable_reason

logger = logging.getLogger(__name__)

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
# Order of the specials at the head of a freshly trained vocabulary (ids 0..4).
SPECIAL_TOKENS: tuple[str, ...] = (PAD, UNK, CLS, SEP, MASK)
MAX_INPUT_CHARS_PER_WORD = 100
# Longest text one call accepts. Bounds time (~1 s on the Rust path, a few seconds on the Python
# path) and memory (offset tracking costs ~100 bytes per character); longer text raises.
MAX_TEXT_CHARS = 1_000_000
VOCAB_FILE = "vocab.txt"
TOKENIZER_JSON = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"

# Code points where the Rust pipeline and Google's Python code disagree (tokenizers 0.23, Python
# 3.11 / Unicode 14), found by running both on "a" + chr(cp) + "b" for every code point, cased
# and uncased (tests/test_tokenizer_parity.py re-checks the claim). Mostly private use (E000-F8FF,
# planes 15-16), CJK Extension C tail 2B820-2B91F, and characters whose category changed between
# Unicode versions. Plus U+03A3 (final sigma) and the surrogates.
_HAZARD_RANGES: tuple[tuple[int, int], ...] = (
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
_HAZARD_RE = re.compile(
    "[" + "".join(f"\\U{a:08x}-\\U{b:08x}" for a, b in _HAZARD_RANGES) + "]"
)


def _needs_python_path(text: str) -> bool:
    """True when the Rust pipeline could differ from Google's code on `text` (never for ASCII)."""
    return not text.isascii() and _HAZARD_RE.search(text) is not None


# Characters Google's code splits words on: str.split() whitespace that survives cleaning
# (Zs, tab, LF, CR, U+2028, U+2029); other isspace() characters are Cc and get dropped instead.
_SEPARATORS = "\t\n\r\u2028\u2029\u0020\u00a0\u1680\u2000-\u200a\u202f\u205f\u3000"
_SPLIT_RE = re.compile(f"[^{_SEPARATORS}]+")


def _is_cjk(cp: int) -> bool:
    """Google's CJK Unified Ideographs ranges (not Hangul, Hiragana or Katakana)."""
    return (
        0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF
        or 0x2A700 <= cp <= 0x2B73F or 0x2B740 <= cp <= 0x2B81F or 0x2B820 <= cp <= 0x2CEAF
        or 0xF900 <= cp <= 0xFAFF or 0x2F800 <= cp <= 0x2FA1F
    )


def _is_punctuation(char: str) -> bool:
    """Every ASCII non-alphanumeric printable, plus Unicode categories P*."""
    cp = ord(char)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(char).startswith("P")


def _is_dropped(char: str) -> bool:
    """NUL, U+FFFD and Cc/Cf control characters (tab, LF, CR are whitespace, not dropped)."""
    if char in "\t\n\r":
        return False
    return char in "\x00\ufffd" or unicodedata.category(char) in ("Cc", "Cf")


@dataclass(slots=True)
class _Word:
    """A word of Google's basic tokenization and where its characters came from.

    `starts`/`ends` give, per character of `text`, its span in the original string; None means
    character i of `text` came from original character `start + i`.
    """

    text: str
    start: int
    end: int
    starts: list[int] | None = None
    ends: list[int] | None = None

    def span(self, a: int, b: int) -> tuple[int, int]:
        """Original span of characters a..b (exclusive) of `text`."""
        if self.starts is None or self.ends is None:
            return self.start + a, self.start + b
        return self.starts[a], self.ends[b - 1]


class _GoogleBasicTokenizer:
    """Google's BasicTokenizer in Python, tracking each output character's original position.

    Used only for texts the Rust normalizer would get wrong (see `_HAZARD_RANGES`). Works one
    whitespace-separated chunk at a time, so memory beyond the output stays per chunk.
    """

    def __init__(self, do_lower_case: bool) -> None:
        self.do_lower_case = do_lower_case

    def words(self, text: str) -> list[_Word]:
        out: list[_Word] = []
        for match in _SPLIT_RE.finditer(text):
            chars: list[str] = []
            positions: list[int] = []
            for i, char in enumerate(match.group(), match.start()):
                if _is_cjk(ord(char)):
                    # An ideograph is a whitespace token of its own, still lower-cased and NFD'd.
                    self._flush(chars, positions, out)
                    self._flush([char], [i], out)
                elif not _is_dropped(char):
                    chars.append(char)
                    positions.append(i)
            self._flush(chars, positions, out)
        return out

    def _flush(self, chars: list[str], positions: list[int], out: list[_Word]) -> None:
        """Normalize one whitespace token (as Google does: lower, NFD, drop Mn) and split punctuation."""
        if not chars:
            return
        token, starts, ends = list(chars), list(positions), [p + 1 for p in positions]
        chars.clear()
        positions.clear()
        if self.do_lower_case:
            token, starts, ends = _lower_strip_accents(token, starts, ends)
        _split_punctuation(token, starts, ends, out)


def _lower_strip_accents(
    chars: list[str], starts: list[int], ends: list[int]
) -> tuple[list[str], list[int], list[int]]:
    """Google's `token.lower()` then NFD and drop Mn, character by character with positions.

    Lower-casing the whole token matters (final sigma), so each character's piece is cut out of
    the whole-token result; NFD of the whole token is used when per-character NFD would differ
    (canonical reordering), then every output character spans the whole token.
    """
    token = "".join(chars)
    lowered = token.lower()
    pieces = [c.lower() for c in chars]
    if sum(map(len, pieces)) == len(lowered):
        cut, pos = [], 0
        for piece in pieces:
            cut.append(lowered[pos : pos + len(piece)])
            pos += len(piece)
        pieces = cut
    else:
        pieces = [lowered] + [""] * (len(chars) - 1)
        starts, ends = [starts[0]] * len(chars), [ends[-1]] * len(chars)
    decomposed = [unicodedata.normalize("NFD", p) for p in pieces]
    if "".join(decomposed) != unicodedata.normalize("NFD", lowered):
        decomposed = [unicodedata.normalize("NFD", lowered)] + [""] * (len(pieces) - 1)
        starts, ends = [starts[0]] * len(pieces), [ends[-1]] * len(pieces)
    out_chars, out_starts, out_ends = [], [], []
    for piece, s, e in zip(decomposed, starts, ends):
        for char in piece:
            if unicodedata.category(char) != "Mn":
                out_chars.append(char)
                out_starts.append(s)
                out_ends.append(e)
    return out_chars, out_starts, out_ends


def _split_punctuation(chars: list[str], starts: list[int], ends: list[int], out: list[_Word]) -> None:
    """Every punctuation character becomes its own word; runs of the rest stay together."""
    begin = 0
    for i, char in enumerate(chars + [" "]):
        if i == len(chars) or _is_punctuation(char):
            if i > begin:
                out.append(_make_word(chars[begin:i], starts[begin:i], ends[begin:i]))
            if i < len(chars):
                out.append(_make_word([char], [starts[i]], [ends[i]]))
            begin = i + 1


def _make_word(chars: list[str], starts: list[int], ends: list[int]) -> _Word:
    one_to_one = all(e == s + 1 for s, e in zip(starts, ends)) and ends[-1] - starts[0] == len(chars)
    if one_to_one:
        return _Word("".join(chars), starts[0], ends[-1])
    return _Word("".join(chars), starts[0], ends[-1], starts, ends)


def _unk_word(word: _Word) -> _Word:
    """A word holding lone surrogates: no vocabulary (UTF-8) can contain it, so it is [UNK]."""
    return _Word(UNK, word.start, word.end, [word.start] * len(UNK), [word.end] * len(UNK))


def _python_words(basic: _GoogleBasicTokenizer, text: str) -> list[_Word]:
    words = basic.words(text)
    for i, word in enumerate(words):
        if not word.text.isascii() and re.search("[\ud800-\udfff]", word.text):
            words[i] = _unk_word(word)
    return words


def truncated_pair_lengths(len_a: int, len_b: int, room: int) -> tuple[int, int]:
    """Tokens of A and B kept when a pair must fit `room` tokens (specials not counted).

    Google's `_truncate_seq_pair` (run_classifier.py) removes the last token of the longer side, B's
    on ties, until the pair fits; this is its closed form: the shorter side is kept whole when it
    fits in half the room, else A keeps ceil(room / 2) and B floor(room / 2).
    """
    if len_a + len_b <= room:
        return len_a, len_b
    kept_b = min(len_b, max(room - len_a, room // 2))
    return room - kept_b, kept_b


class _DeferredBatch:
    """Texts whose Rust-pipeline encodings are computed only if a field the chunk path does not produce
    is read, then for the whole batch in one call."""

    def __init__(self, pipeline: Tokenizer, texts: list[str]) -> None:
        self.pipeline, self.texts = pipeline, texts

    @functools.cached_property
    def encodings(self) -> list[object]:
        return self.pipeline.encode_batch(self.texts, add_special_tokens=False)


class _Piece:
    """One text encoded alone: its WordPiece tokens, no specials, never truncated.

    `rust` is the `tokenizers` encoding of the text (offsets, word ids); `words` maps the Python
    path's word-relative offsets back to the original text. A piece of the chunk path knows its ids
    and gets its Rust encoding only when one of those fields is read, for its whole batch at once.
    """

    __slots__ = ("_rust", "words", "_ids", "_batch", "_index")

    def __init__(self, rust: object, words: list[_Word] | None = None, ids: list[int] | None = None,
                 batch: _DeferredBatch | None = None, index: int = 0) -> None:
        self._rust, self.words, self._ids, self._batch, self._index = rust, words, ids, batch, index

    @property
    def rust(self) -> object:
        if self._rust is None:
            self._rust = self._batch.encodings[self._index]
        return self._rust

    @property
    def from_chunk_path(self) -> bool:
        return self._batch is not None

    def __len__(self) -> int:
        return len(self._ids) if self._ids is not None else len(self._rust)

    def ids(self, n: int) -> list[int]:
        return (self._ids if self._ids is not None else self._rust.ids)[:n]

    def tokens(self, n: int, vocabulary: list[str]) -> list[str]:
        return [vocabulary[i] for i in self.ids(n)]

    def word_ids(self, n: int) -> list[int]:
        return self.rust.word_ids[:n]

    def offsets(self, n: int) -> list[tuple[int, int]]:
        spans = self.rust.offsets[:n]
        if self.words is None:
            return spans
        return [self.words[w].span(a, b) for (a, b), w in zip(spans, self.rust.word_ids[:n])]


class Encoding:
    """One encoded text or pair, `[CLS] A [SEP]` or `[CLS] A [SEP] B [SEP]`; every list has one entry
    per token, specials included.

    Made from each text encoded alone and the number of its tokens kept, so its cost is linear in the
    texts whatever the truncation. The model inputs are built at once; tokens, word and sequence ids
    and offsets on first access (batch encoding pays only for what the caller reads).
    `num_truncated` tells how many tokens truncation removed.
    """

    def __init__(self, pieces: tuple[_Piece, ...], kept: tuple[int, ...], specials: tuple[int, int],
                 vocabulary: list[str]) -> None:
        self._pieces, self._kept, self._vocabulary = pieces, kept, vocabulary
        cls, sep = specials
        self.input_ids: list[int] = [cls, *pieces[0].ids(kept[0]), sep]
        if len(pieces) == 2:
            self.input_ids += pieces[1].ids(kept[1])
            self.input_ids.append(sep)
        first = kept[0] + 2  # [CLS] A [SEP] are type 0, B [SEP] type 1
        self.token_type_ids: list[int] = [0] * first + [1] * (len(self.input_ids) - first)
        self.attention_mask: list[int] = [1] * len(self.input_ids)

    def _framed(self, parts: list[list], cls: object, sep: object) -> list:
        """[cls] + A + [sep] (+ B + [sep])."""
        out = [cls, *parts[0], sep]
        if len(parts) == 2:
            out += parts[1]
            out.append(sep)
        return out

    @functools.cached_property
    def tokens(self) -> list[str]:
        return self._framed([p.tokens(n, self._vocabulary) for p, n in zip(self._pieces, self._kept)], CLS, SEP)

    @functools.cached_property
    def word_ids(self) -> list[int | None]:
        """Index of the pre-tokenized word (within its sequence) of each token; None for specials."""
        return self._framed([p.word_ids(n) for p, n in zip(self._pieces, self._kept)], None, None)

    @functools.cached_property
    def sequence_ids(self) -> list[int | None]:
        """0 for tokens of A, 1 for tokens of B, None for specials."""
        return self._framed([[k] * n for k, n in enumerate(self._kept)], None, None)

    @functools.cached_property
    def offsets(self) -> list[tuple[int, int]]:
        """Character span of each token in its original text (A or B); (0, 0) for specials."""
        return self._framed([p.offsets(n) for p, n in zip(self._pieces, self._kept)], (0, 0), (0, 0))

    @property
    def num_truncated(self) -> int:
        """Tokens of A and B that truncation removed (0 when the text or pair fit)."""
        return sum(len(p) for p in self._pieces) - sum(self._kept)

    @property
    def truncated(self) -> bool:
        return self.num_truncated > 0

    def __len__(self) -> int:
        return len(self.input_ids)

    def __repr__(self) -> str:
        return f"Encoding(tokens={self.tokens!r})"


def _vocabulary_file(path: Path) -> Path:
    """vocab.txt or tokenizer.json: the path itself, or the first of them in the directory."""
    if not path.exists():
        raise BertkitError(f"tokenizer path {path} does not exist; pass a directory holding {VOCAB_FILE} or "
                           f"{TOKENIZER_JSON} (e.g. the output of `bertkit tokenizer train`) or one of those files")
    if not path.is_dir():
        return path
    for name in (VOCAB_FILE, TOKENIZER_JSON):
        if (path / name).is_file():
            return path / name
    raise BertkitError(f"no vocabulary in {path}: it holds neither {VOCAB_FILE} nor {TOKENIZER_JSON}; pass the "
                       "directory of a BERT tokenizer (e.g. the output of `bertkit tokenizer train`)")


def _read_vocab(path: Path) -> list[str]:
    """vocab.txt lines -> tokens (id = line index), stripped as Google's loader strips them."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise BertkitError(f"cannot read vocabulary {path}: {exc.strerror}; pass a directory holding "
                           f"{VOCAB_FILE} or the path of a {VOCAB_FILE} file") from exc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise BertkitError(f"{where(path, line)}: vocabulary is not valid UTF-8; re-save it as UTF-8") from exc
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line.strip() for line in lines]


def _check_vocab(tokens: Sequence[str], source: str) -> None:
    """Reject what Google's loader would silently mis-handle: empty lines, duplicates, no specials."""
    first_line: dict[str, int] = {}
    for number, token in enumerate(tokens, 1):
        if not token:
            raise BertkitError(f"{where(source, number)}: empty vocabulary line; every line holds one "
                               "token whose id is its line number - 1, so put a placeholder such as "
                               "[unused0] there (deleting the line would shift every later id)")
        if token in first_line:
            raise BertkitError(f"{where(source, number)}: duplicate token {token!r} (also on line "
                               f"{first_line[token]}); one token cannot have two ids, so replace one "
                               "of them with an unused placeholder")
        first_line[token] = number
    missing = [t for t in SPECIAL_TOKENS if t not in first_line]
    if missing:
        raise BertkitError(f"{source}: vocabulary lacks {', '.join(missing)}; BERT needs "
                           f"{', '.join(SPECIAL_TOKENS)} (add them as lines of {VOCAB_FILE})")


def _check_text(text: object, name: str) -> str:
    if not isinstance(text, str):
        raise BertkitError(f"{name} must be a str, got {type(text).__name__}")
    if len(text) > MAX_TEXT_CHARS:
        raise BertkitError(f"{name} has {len(text):,} characters, over the {MAX_TEXT_CHARS:,} one call "
                           "accepts; split it into lines, paragraphs or documents first")
    return text


@dataclass
class TrainingStats:
    """What `WordPieceTokenizer.train` read, and what it did about bad input (each counted, as
    `bertkit data pretraining` counts it)."""

    files: int = 0
    bytes: int = 0
    """Bytes of (decompressed) text read."""
    lines: int = 0
    empty_files: list[str] = field(default_factory=list)
    skipped_files: dict[str, list[str]] = field(default_factory=dict)
    """Reason -> files skipped whole (binary, unreadable or corrupt gzip)."""
    invalid_utf8_lines: int = 0
    lines_cut: int = 0
    """Lines over MAX_TEXT_CHARS bytes, cut there."""
    long_words: int = 0
    """Words over MAX_INPUT_CHARS_PER_WORD characters, left out (they encode as [UNK])."""


def _training_lines(paths: Sequence[Path], stats: TrainingStats, strict: bool,
                    words: _ShortWords) -> Iterator[str]:
    """Lines of text files (.gz read transparently), each at most MAX_TEXT_CHARS bytes, long words left out."""
    for path in paths:
        stats.files += 1
        reason = "empty" if path.stat().st_size == 0 else unreadable_reason(path)
        if reason == "empty":
            stats.empty_files.append(str(path))
        elif reason is not None:
            if strict:
                raise BertkitError(f"{path}: {reason}; remove it from --input (or drop --strict to skip it)")
            stats.skipped_files.setdefault(reason, []).append(str(path))
        else:
            yield from _file_lines(path, stats, strict, words)


def _file_lines(path: Path, stats: TrainingStats, strict: bool, words: _ShortWords) -> Iterator[str]:
    try:
        with open_binary(path) as stream:
            for lineno, (raw, cut) in enumerate(bounded_lines(stream, MAX_TEXT_CHARS), start=1):
                text, invalid = decode_line(raw, path, lineno, strict)
                stats.lines += 1
                stats.bytes += len(raw)
                stats.invalid_utf8_lines += invalid
                stats.lines_cut += cut
                yield words(text, stats)
    except GZIP_ERRORS as exc:
        if strict:
            raise BertkitError(f"{path}: corrupt gzip data ({exc}); fix or remove the file") from None
        stats.skipped_files.setdefault("corrupt gzip data (rest of file)", []).append(str(path))


# A run of more than MAX_INPUT_CHARS_PER_WORD characters between BERT's word separators: it may hold a
# word too long for WordPiece.
_LONG_RUN_RE = re.compile(f"[^{_SEPARATORS}]{{{MAX_INPUT_CHARS_PER_WORD + 1},}}")


class _ShortWords:
    """A training line without its words over MAX_INPUT_CHARS_PER_WORD characters (normalized).

    They encode as [UNK], so they have nothing to teach the vocabulary, and the trainer's cost grows
    with the square of a word's length (one 1M-character word runs for hours). Only runs between
    separators longer than the cap are looked at, by the Rust normalizer and pre-tokenizer the
    trainer uses; the rest of the line is left as it is.
    """

    def __init__(self, do_lower_case: bool) -> None:
        self.normalizer = _bert_normalizer(do_lower_case)
        self.pre_tokenizer = pre_tokenizers.BertPreTokenizer()

    def __call__(self, line: str, stats: TrainingStats) -> str:
        if _LONG_RUN_RE.search(line) is None:
            return line
        return _LONG_RUN_RE.sub(lambda run: self._short_words(run.group(), stats), line)

    def _short_words(self, run: str, stats: TrainingStats) -> str:
        words = [w for w, _ in self.pre_tokenizer.pre_tokenize_str(self.normalizer.normalize_str(run))]
        kept = [w for w in words if len(w) <= MAX_INPUT_CHARS_PER_WORD]
        stats.long_words += len(words) - len(kept)
        return " " + " ".join(kept) + " "


class WordPieceTokenizer:
    """BERT's WordPiece tokenizer over a fixed vocabulary (Google's rules, Rust speed).

    Build it with `from_pretrained` (vocab.txt), `train` (text files) or directly from a list of
    tokens in id order. It is immutable and safe to share between threads.
    """

    def __init__(self, tokens: Sequence[str], do_lower_case: bool = True, *, source: str = "vocabulary") -> None:
        tokens = list(tokens)
        _check_vocab(tokens, source)
        self._tokens = tokens
        self._vocab = {token: i for i, token in enumerate(tokens)}
        self._do_lower_case = bool(do_lower_case)
        self._basic = _GoogleBasicTokenizer(self._do_lower_case)
        self._special_ids = tuple(self._vocab[t] for t in SPECIAL_TOKENS)
        # The full Rust pipeline, and WordPiece alone for the words of the Python path. Neither
        # truncates: the Rust library truncates pairs in quadratic time (it pairs every overflowing
        # piece of A with every piece of B), so texts are encoded alone and cut here.
        self._rust, self._wordpiece = self._build_pipelines()

    # ----------------------------------------------------------------- construction
    @classmethod
    def from_pretrained(cls, path: str | Path, do_lower_case: bool | None = None) -> WordPieceTokenizer:
        """Load a directory holding vocab.txt or a Hugging Face tokenizer.json (+ tokenizer_config.json),
        or the path of either file.

        do_lower_case=None reads it from tokenizer_config.json beside the vocabulary, else from
        tokenizer.json's normalizer, else True.
        """
        source = _vocabulary_file(Path(path))
        if source.suffix == ".json":
            tokens, json_lower_case = _read_tokenizer_json(source)
        else:
            tokens, json_lower_case = _read_vocab(source), None
        if do_lower_case is None:
            config_lower_case = _read_do_lower_case(source.parent / CONFIG_FILE)
            do_lower_case = next((v for v in (config_lower_case, json_lower_case) if v is not None), True)
        return cls(tokens, do_lower_case, source=str(source))

    @classmethod
    def train(
        cls,
        files: Sequence[str | Path],
        vocab_size: int = 30522,
        do_lower_case: bool = True,
        min_frequency: int = 2,
        limit_alphabet: int = 1000,
        show_progress: bool = True,
        strict: bool = False,
    ) -> WordPieceTokenizer:
        """Learn a WordPiece vocabulary from text files (plain or .gz, UTF-8, one or more lines each).

        Ids 0..4 are [PAD], [UNK], [CLS], [SEP], [MASK]; then the alphabet (at most
        `limit_alphabet` characters, and at most (vocab_size - 5) / 2 so that it and its `##`
        continuation forms fit) and the learned pieces: never more than `vocab_size` tokens.
        Files are streamed as `bertkit data pretraining` reads them: lines cut at MAX_TEXT_CHARS
        bytes, invalid UTF-8 replaced, empty files counted, binary files skipped (`strict` raises
        instead); words over MAX_INPUT_CHARS_PER_WORD characters are left out. All of it is logged.
        Training counts words with the Rust normalizer, which differs from Google's rules only on
        the rare characters listed in `_HAZARD_RANGES`; encoding with the result is exact.
        """
        paths = [Path(f) for f in files]
        if not paths:
            raise BertkitError("no training files given; pass at least one --input file")
        for p in paths:
            if not p.is_file():
                raise BertkitError(f"training file {p} does not exist; check the --input paths")
        if vocab_size < len(SPECIAL_TOKENS) or min_frequency < 1:
            raise BertkitError(f"--vocab-size must be >= {len(SPECIAL_TOKENS)} and --min-frequency >= 1 "
                               f"(got {vocab_size} and {min_frequency})")
        trainer = trainers.WordPieceTrainer(
            vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=list(SPECIAL_TOKENS),
            limit_alphabet=min(limit_alphabet, (vocab_size - len(SPECIAL_TOKENS)) // 2),
            continuing_subword_prefix="##", show_progress=show_progress,
        )
        pipeline = Tokenizer(models.WordPiece(unk_token=UNK, max_input_chars_per_word=MAX_INPUT_CHARS_PER_WORD))
        pipeline.normalizer = _bert_normalizer(do_lower_case)
        pipeline.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        stats = TrainingStats()
        pipeline.train_from_iterator(_training_lines(paths, stats, strict, _ShortWords(do_lower_case)), trainer=trainer)
        _report_training(stats)
        learned = pipeline.get_vocab()
        tokens = sorted(learned, key=learned.__getitem__)
        if len(tokens) <= len(SPECIAL_TOKENS):
            skipped = [f for files in stats.skipped_files.values() for f in files]
            raise BertkitError(f"no text found in {', '.join(map(str, paths))}; the files are empty, "
                               f"{'binary (skipped: ' + ', '.join(skipped) + '), ' if skipped else ''}"
                               "or hold only whitespace and control characters")
        return cls(tokens, do_lower_case, source="trained vocabulary")

    def save_pretrained(self, directory: str | Path) -> Path:
        """Write vocab.txt and a transformers-compatible tokenizer_config.json; return the directory."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        write_text_atomic(directory / VOCAB_FILE, self._vocab_text())
        config = {
            "tokenizer_class": "BertTokenizer",
            "do_lower_case": self._do_lower_case,
            "strip_accents": None,
            "tokenize_chinese_chars": True,
            "unk_token": UNK, "sep_token": SEP, "pad_token": PAD, "cls_token": CLS, "mask_token": MASK,
        }
        write_text_atomic(directory / CONFIG_FILE, json.dumps(config, indent=2) + "\n")
        return directory

    def _build_pipelines(self) -> tuple[Tokenizer, Tokenizer]:
        """The full Rust pipeline and a WordPiece-only one for words the Python path produced."""
        pipelines = []
        for full in (True, False):
            tk = Tokenizer(models.WordPiece(
                self._vocab, unk_token=UNK, max_input_chars_per_word=MAX_INPUT_CHARS_PER_WORD,
                continuing_subword_prefix="##",
            ))
            if full:
                tk.normalizer = _bert_normalizer(self._do_lower_case)
                tk.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
            tk.decoder = decoders.WordPiece(prefix="##", cleanup=False)
            pipelines.append(tk)
        return pipelines[0], pipelines[1]

    # ----------------------------------------------------------------- properties
    @property
    def vocab_size(self) -> int:
        return len(self._tokens)

    def __len__(self) -> int:
        return len(self._tokens)

    @property
    def vocab(self) -> dict[str, int]:
        """token -> id (a copy)."""
        return dict(self._vocab)

    @property
    def do_lower_case(self) -> bool:
        return self._do_lower_case

    @property
    def pad_token_id(self) -> int:
        return self._vocab[PAD]

    @property
    def unk_token_id(self) -> int:
        return self._vocab[UNK]

    @property
    def cls_token_id(self) -> int:
        return self._vocab[CLS]

    @property
    def sep_token_id(self) -> int:
        return self._vocab[SEP]

    @property
    def mask_token_id(self) -> int:
        return self._vocab[MASK]

    @property
    def special_token_ids(self) -> tuple[int, ...]:
        """Ids of [PAD], [UNK], [CLS], [SEP], [MASK], in that order."""
        return self._special_ids

    @functools.cached_property
    def vocab_hash(self) -> str:
        """sha256 of vocab.txt as save_pretrained writes it (one token per line, LF endings)."""
        return hashlib.sha256(self._vocab_text().encode("utf-8")).hexdigest()

    def _vocab_text(self) -> str:
        return "".join(token + "\n" for token in self._tokens)

    def __repr__(self) -> str:
        return f"WordPieceTokenizer(vocab_size={self.vocab_size}, do_lower_case={self._do_lower_case})"

    # ----------------------------------------------------------------- tokens and ids
    def tokenize(self, text: str) -> list[str]:
        """WordPiece tokens of `text`, no special tokens."""
        return [self._tokens[i] for i in self.encode_ids([_check_text(text, "text")])[0]]

    def encode_ids(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text, no special tokens, no truncation: the fast path for data creation.

        In a batch of at least `_CHUNK_PATH_MIN_CHARS` characters, ASCII texts take `_encode_ascii`
        (same ids as the Rust pipeline, which sees each distinct whitespace-separated chunk once).
        """
        texts = [_check_text(t, f"texts[{i}]") for i, t in enumerate(texts)]
        chunk, rust, python = self._routes(texts)
        out: list[list[int] | None] = [None] * len(texts)
        for i, ids in zip(chunk, _encode_ascii(self._wordpiece, [texts[i] for i in chunk], self._do_lower_case)):
            out[i] = ids
        rust_encodings = self._rust.encode_batch_fast([texts[i] for i in rust], add_special_tokens=False)
        for i, encoding in zip(rust, rust_encodings):
            out[i] = encoding.ids
        for i in python:
            out[i] = self._python_path(texts[i])[0].ids
        return out

    def convert_tokens_to_ids(self, tokens: str | Sequence[str]) -> int | list[int]:
        """Token(s) -> id(s); tokens outside the vocabulary map to [UNK]."""
        unk = self.unk_token_id
        if isinstance(tokens, str):
            return self._vocab.get(tokens, unk)
        return [self._vocab.get(t, unk) for t in tokens]

    def convert_ids_to_tokens(self, ids: int | Sequence[int]) -> str | list[str]:
        """Id(s) -> token(s); an id outside [0, vocab_size) raises BertkitError."""
        if isinstance(ids, int):
            return self._tokens[self._check_ids([ids])[0]]
        return [self._tokens[i] for i in self._check_ids(ids)]

    def _check_ids(self, ids: Iterable[int]) -> list[int]:
        ids = [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i < len(self._tokens)]
        if bad:
            raise BertkitError(f"token ids {bad[:5]} are outside this vocabulary (0..{len(self._tokens) - 1}); "
                               "were they produced with a different vocab.txt?")
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Ids -> text: tokens joined by spaces with `##` continuations glued to their word."""
        ids = self._check_ids(ids)
        if skip_special_tokens:
            ids = [i for i in ids if i not in self._special_ids]
        return self._rust.decoder.decode([self._tokens[i] for i in ids])

    # ----------------------------------------------------------------- encoding
    def encode(
        self, text: str, text_pair: str | None = None, max_length: int | None = None, truncation: bool = True
    ) -> Encoding:
        """[CLS] A [SEP] (B [SEP]) with type ids, mask, offsets, word and sequence ids.

        With truncation and max_length, tokens are cut to fit (specials included): a single text
        loses its end, a pair is cut by Google's `_truncate_seq_pair` rule (`truncated_pair_lengths`).
        `Encoding.num_truncated` tells how many tokens were cut.
        """
        _check_text(text, "text")
        pairs = None if text_pair is None else [_check_text(text_pair, "text_pair")]
        return self.encode_batch([text], pairs, max_length=max_length, truncation=truncation)[0]

    def encode_batch(
        self,
        texts: Sequence[str],
        text_pairs: Sequence[str] | None = None,
        max_length: int | None = None,
        truncation: bool = True,
    ) -> list[Encoding]:
        """`encode` over many texts (or pairs) at once; the Rust part runs them in one call.

        Every text (A and B alike) is encoded alone, then cut: time and memory are linear in the
        texts. ASCII texts of a batch of at least `_CHUNK_PATH_MIN_CHARS` characters take the chunk
        path of `encode_ids` (several times faster); their offsets and word ids are computed by the
        Rust pipeline, for the whole batch, when first read. Every field is the same either way.
        """
        texts = [_check_text(t, f"texts[{i}]") for i, t in enumerate(texts)]
        if text_pairs is not None:
            text_pairs = [_check_text(t, f"text_pairs[{i}]") for i, t in enumerate(text_pairs)]
            if len(text_pairs) != len(texts):
                raise BertkitError(f"got {len(texts)} texts but {len(text_pairs)} text_pairs; pass one pair per text")
        limit = max_length if truncation else None
        specials = 3 if text_pairs is not None else 2
        if limit is not None and limit < specials:
            raise BertkitError(f"max_length={limit} leaves no room for text beside the {specials} special "
                               f"tokens; use max_length > {specials}")
        pieces = self._pieces(texts + (text_pairs or []))
        ids, room, out = (self.cls_token_id, self.sep_token_id), None if limit is None else limit - specials, []
        for a, b in zip(pieces, pieces[len(texts):] if text_pairs is not None else [None] * len(texts)):
            if b is None:
                parts, kept = (a,), (len(a) if room is None else min(len(a), room),)
            else:
                parts, kept = (a, b), (len(a), len(b))
                if room is not None:
                    kept = truncated_pair_lengths(*kept, room)
            out.append(Encoding(parts, kept, ids, self._tokens))
        return out

    def _pieces(self, texts: list[str]) -> list[_Piece]:
        """Each text encoded alone, by the path `_routes` picks."""
        chunk, rust, python = self._routes(texts)
        out: list[_Piece | None] = [None] * len(texts)
        batch = _DeferredBatch(self._rust, [texts[i] for i in chunk])
        for k, ids in enumerate(_encode_ascii(self._wordpiece, batch.texts, self._do_lower_case)):
            out[chunk[k]] = _Piece(None, None, ids, batch, k)
        for i, encoding in zip(rust, self._rust.encode_batch([texts[i] for i in rust], add_special_tokens=False)):
            out[i] = _Piece(encoding)
        for i in python:
            out[i] = _Piece(*self._python_path(texts[i]))
        return out

    def _routes(self, texts: list[str]) -> tuple[list[int], list[int], list[int]]:
        """Indices of the texts for the ASCII chunk path (batches of at least `_CHUNK_PATH_MIN_CHARS`
        characters), the Rust pipeline, and the Python path (text the Rust normalizer gets wrong)."""
        chunk, rest = [], list(range(len(texts)))
        if sum(map(len, texts)) >= _CHUNK_PATH_MIN_CHARS:
            chunk = [i for i in rest if texts[i].isascii()]
            rest = [i for i in rest if not texts[i].isascii()]
        python = [i for i in rest if _needs_python_path(texts[i])]
        return chunk, [i for i in rest if not _needs_python_path(texts[i])] if python else rest, python

    def _python_path(self, text: str) -> tuple[object, list[_Word]]:
        """(WordPiece encoding, words) of Google's basic tokenization in Python (see `_HAZARD_RANGES`)."""
        words = _python_words(self._basic, text)
        return self._wordpiece.encode([w.text for w in words], is_pretokenized=True, add_special_tokens=False), words


# --- encode_ids' chunk path for ASCII text --------------------------------------------------------
# On ASCII, BERT's normalizer and pre-tokenizer reduce to: drop control characters (all but tab, LF,
# CR; they join their neighbours), lower-case (uncased vocabularies), split at whitespace, make every
# ASCII punctuation mark a word of its own. So a batch is cleaned and split at whitespace by bytes
# methods, the distinct chunks are split into words by a regex, and WordPiece runs once, over the
# distinct words: natural text repeats its chunks and words, so this is several times faster than
# the Rust pipeline over every occurrence. tests/data/test_pretraining_tokenize.py checks the ids
# against the Rust pipeline on generated text.
_CHUNK_PATH_MIN_CHARS = 1 << 16
"""Smallest batch (characters) for the chunk path; below it the Rust pipeline's lower overhead wins."""
_ASCII_CONTROL = bytes([*range(0x00, 0x09), 0x0B, 0x0C, *range(0x0E, 0x20), 0x7F])
"""Dropped by BERT's text cleaning: control characters other than tab, LF and CR."""
_LF_TO_NUL = bytes.maketrans(b"\n", b"\x00")
"""After the cleaning, NUL and SOH can only be separators: NUL between texts, SOH between chunks."""
_ASCII_WORD = re.compile(rb"[0-9A-Za-z]+|[!-/:-@\[-`{-~]|\x01")


def _encode_ascii(bare: Tokenizer, texts: list[str], do_lower_case: bool) -> list[list[int]]:
    """Token ids of ASCII texts, equal to the full Rust pipeline's; `bare` is the WordPiece-only pipeline."""
    if not texts:
        return []
    joined = " \n ".join(texts)
    if joined.count("\n") != len(texts) - 1:  # a text's own line breaks are whitespace
        joined = " \n ".join(t.replace("\n", " ") for t in texts)
    data = joined.encode("ascii").translate(_LF_TO_NUL, _ASCII_CONTROL)
    chunks, chunk = _codes((data.lower() if do_lower_case else data).split())  # a b"\x00" chunk ends a text
    words, word = _codes(_ASCII_WORD.findall(b"\x01".join(chunks) + b"\x01"))  # words of each distinct chunk
    encoding = bare.encode([w.decode("ascii").strip("\x01") for w in words], is_pretokenized=True,
                           add_special_tokens=False)  # one call; separators go in as "" (no pieces)
    word_counts = np.bincount(np.array(encoding.word_ids, dtype=np.int64), minlength=len(words))
    pieces, word_start = _concatenated(np.array(encoding.ids, dtype=np.int64), word_counts, word)
    chunk_counts = np.diff(word_start[word == words[b"\x01"]], prepend=0)  # pieces of each distinct chunk
    ids, chunk_start = _concatenated(pieces, chunk_counts, chunk)
    ends = chunk_start[chunk == chunks[b"\x00"]].tolist() if b"\x00" in chunks else []
    flat = ids.tolist()
    edges = [0, *ends, len(flat)]
    return [flat[a:b] for a, b in zip(edges[:-1], edges[1:])]


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


def _bert_normalizer(do_lower_case: bool) -> normalizers.Normalizer:
    # Google couples accent stripping to lower-casing; say so explicitly rather than rely on the default.
    return normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=do_lower_case, lowercase=do_lower_case
    )


def _read_do_lower_case(config_path: Path) -> bool | None:
    """do_lower_case from tokenizer_config.json, None when the file or the key is absent."""
    if not config_path.is_file():
        return None
    value = _read_json_object(config_path).get("do_lower_case")
    if value is not None and not isinstance(value, bool):
        raise BertkitError(f"{config_path}: do_lower_case must be true or false, got {value!r}")
    return value


def _read_json_object(path: Path) -> dict:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise BertkitError(f"{path}: not readable JSON ({exc}); fix or delete the file") from exc
    if not isinstance(value, dict):
        raise BertkitError(f"{path}: not a JSON object; fix or delete the file")
    return value


def _read_tokenizer_json(path: Path) -> tuple[list[str], bool | None]:
    """(tokens in id order, lower-casing of its normalizer or None) of a Hugging Face tokenizer.json."""
    spec = _read_json_object(path)
    model = spec.get("model") or {}
    if model.get("type") != "WordPiece" or model.get("continuing_subword_prefix", "##") != "##":
        raise BertkitError(f"{path}: the tokenizer's model is {model.get('type')!r} (prefix "
                           f"{model.get('continuing_subword_prefix')!r}), not BERT's WordPiece with '##' "
                           "continuations; bertkit loads only WordPiece vocabularies")
    vocab = model.get("vocab")
    ids = sorted(vocab.values()) if isinstance(vocab, dict) and all(type(i) is int for i in vocab.values()) else None
    if not ids or ids != list(range(len(ids))):
        raise BertkitError(f"{path}: model.vocab must map each token to a distinct id 0..N-1; the file is not "
                           "a complete WordPiece tokenizer")
    extra = [t["content"] for t in spec.get("added_tokens") or [] if vocab.get(t.get("content")) != t.get("id")]
    if extra:
        raise BertkitError(f"{path}: added tokens {extra[:5]} are not in model.vocab with the same id; bertkit "
                           "reads only the WordPiece vocabulary")
    return sorted(vocab, key=vocab.__getitem__), _normalizer_lower_case(spec.get("normalizer"))


def _normalizer_lower_case(normalizer: object) -> bool | None:
    """Whether a tokenizer.json normalizer lower-cases (None when it has none bertkit knows)."""
    if not isinstance(normalizer, dict):
        return None
    if normalizer.get("type") == "BertNormalizer":
        return bool(normalizer.get("lowercase", True))
    if normalizer.get("type") == "Lowercase":
        return True
    found = [_normalizer_lower_case(n) for n in normalizer.get("normalizers") or []]  # a Sequence
    return True if True in found else False if False in found else None


def _report_training(stats: TrainingStats) -> None:
    logger.info("read %d lines (%.1f MB) from %d file(s)", stats.lines, stats.bytes / 1e6, stats.files)
    if stats.empty_files:
        logger.warning("%d empty file(s): %s", len(stats.empty_files), ", ".join(stats.empty_files))
    for reason, files in stats.skipped_files.items():
        logger.warning("skipped %d file(s), %s: %s (pass --strict to stop instead)", len(files), reason,
                       ", ".join(files))
    if stats.invalid_utf8_lines:
        logger.warning("%d line(s) held bytes that are not UTF-8; they were read with U+FFFD, which "
                       "BERT's text cleaning drops", stats.invalid_utf8_lines)
    if stats.lines_cut:
        logger.warning("%d line(s) over %s bytes were cut there (as `bertkit data pretraining` cuts them)",
                       stats.lines_cut, f"{MAX_TEXT_CHARS:,}")
    if stats.long_words:
        logger.warning("left out %d word(s) over %d characters: they encode as [UNK]", stats.long_words,
                       MAX_INPUT_CHARS_PER_WORD)
