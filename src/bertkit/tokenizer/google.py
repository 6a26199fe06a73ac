"""Google's BERT tokenization (google-research/bert `tokenization.py`) in pure Python, with offsets.

Read top to bottom, this is the whole algorithm BERT's vocabularies are made for. `BasicTokenizer`
cleans the text (drop NUL, U+FFFD and Cc/Cf control characters; Zs, tab, CR and LF are
whitespace), makes every CJK ideograph a word of its own, splits at whitespace, lower-cases then
strips accents (NFD, drop Mn) for uncased vocabularies, and splits off punctuation (every ASCII
non-alphanumeric plus Unicode P*). `WordpieceTokenizer` cuts each word greedily into the longest
vocabulary pieces from its start (`##` marks a continuation); a word with no such cut, or longer
than `MAX_INPUT_CHARS_PER_WORD` characters, is one [UNK]. `FullTokenizer` chains the two.

Design decision: every step carries, for each character it outputs, the span of the original
text that character came from, so each piece gets offsets into the caller's text; the steps run
one whitespace-separated chunk at a time, so memory beyond the output stays per chunk. The
engine (`bertkit.tokenizer.engine`) runs this code only for texts where the Rust pipeline departs
from Google (`engine.HAZARD_RANGES`); tests/tokenizer/test_google_parity.py checks this module and the
engine against a second, offset-free rewrite of Google's code.

References: google-research/bert `tokenization.py` (BasicTokenizer, WordpieceTokenizer) and
`tokenization_test.py`; Devlin et al. 2018 (arXiv:1810.04805); Schuster & Nakajima 2012.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass, field

MAX_INPUT_CHARS_PER_WORD = 100
"""Longer words are [UNK]: the cap of transformers and the `tokenizers` library (Google's file says 200)."""

SEPARATORS = "\t\n\r\u2028\u2029\u0020\u00a0\u1680\u2000-\u200a\u202f\u205f\u3000"
"""Whitespace after cleaning, as a regex class: what str.split() splits at among the characters
cleaning keeps (Zs, tab, LF, CR, U+2028, U+2029); the other isspace() characters are Cc, dropped."""
_CHUNK = re.compile(f"[^{SEPARATORS}]+")

_Chars = tuple[list[str], list[int], list[int]]
"""Characters on their way through the steps, with the original span (start, end) of each."""


def _is_chinese_char(cp: int) -> bool:
    """Google's CJK Unified Ideographs ranges (not Hangul, Hiragana or Katakana: those are letters)."""
    return (
        0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF
        or 0x2A700 <= cp <= 0x2B73F or 0x2B740 <= cp <= 0x2B81F or 0x2B820 <= cp <= 0x2CEAF
        or 0xF900 <= cp <= 0xFAFF or 0x2F800 <= cp <= 0x2FA1F
    )


def _is_punctuation(char: str) -> bool:
    """Every ASCII non-alphanumeric printable (so $, +, <, ^, ` count), plus Unicode categories P*."""
    cp = ord(char)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(char).startswith("P")


def _is_dropped(char: str) -> bool:
    """What `_clean_text` removes: NUL, U+FFFD and Cc/Cf control characters (tab, LF, CR are whitespace)."""
    if char in "\t\n\r":
        return False
    return char in "\x00\ufffd" or unicodedata.category(char) in ("Cc", "Cf")


@dataclass(slots=True)
class Word:
    """A word of basic tokenization and where its characters came from in the original text.

    `starts`/`ends` give each character's original span; None means character i came from
    original character `start + i` (the common case, stored without lists).
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


@dataclass(slots=True)
class WordPieces:
    """A text's WordPiece tokens (no specials): id, span in the text and word index of each piece.

    The same three fields as a `tokenizers` Encoding, so callers read either alike.
    """

    ids: list[int] = field(default_factory=list)
    offsets: list[tuple[int, int]] = field(default_factory=list)
    word_ids: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.ids)


class FullTokenizer:
    """Basic tokenization, then WordPiece on each word: Google's FullTokenizer, as ids with offsets."""

    def __init__(self, vocab: dict[str, int], do_lower_case: bool, unk_token: str) -> None:
        self.basic = BasicTokenizer(do_lower_case)
        self.wordpiece = WordpieceTokenizer(vocab, unk_token)

    def encode(self, text: str) -> WordPieces:
        out = WordPieces()
        for index, word in enumerate(self.basic.tokenize(text)):
            for piece_id, a, b in self.wordpiece.tokenize(word.text):
                out.ids.append(piece_id)
                out.offsets.append(word.span(a, b))
                out.word_ids.append(index)
        return out


class BasicTokenizer:
    """Google's BasicTokenizer: clean, isolate CJK, split at whitespace, (lower, strip accents), split punctuation."""

    def __init__(self, do_lower_case: bool) -> None:
        self.do_lower_case = do_lower_case

    def tokenize(self, text: str) -> list[Word]:
        words: list[Word] = []
        for chunk in _CHUNK.finditer(text):  # cleaning maps whitespace to spaces, then split at them
            for chars in _clean_and_split_chinese(chunk.group(), chunk.start()):
                if self.do_lower_case:
                    chars = _lower_and_strip_accents(*chars)
                words += _split_on_punctuation(*chars)
        return words


def _clean_and_split_chinese(chunk: str, offset: int) -> Iterator[_Chars]:
    """Google's `_clean_text` and `_tokenize_chinese_chars` on one whitespace-free chunk: dropped
    characters vanish without splitting the word, each CJK ideograph is a token of its own."""
    chars: list[str] = []
    starts: list[int] = []
    for i, char in enumerate(chunk, offset):
        if _is_chinese_char(ord(char)):
            if chars:
                yield chars, starts, [s + 1 for s in starts]
                chars, starts = [], []
            yield [char], [i], [i + 1]
        elif not _is_dropped(char):
            chars.append(char)
            starts.append(i)
    if chars:
        yield chars, starts, [s + 1 for s in starts]


def _lower_and_strip_accents(chars: list[str], starts: list[int], ends: list[int]) -> _Chars:
    """Google's `token.lower()` then `_run_strip_accents` (NFD, drop Mn), keeping each character's span.

    Lower-casing the whole token matters (final sigma), so each character's piece is cut out of
    the whole-token result; NFD of the whole token is used when per-character NFD would differ
    (canonical reordering that moves a kept character), then every output character spans the whole token.
    """
    lowered = "".join(chars).lower()
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
    # Reordering only among marks that are dropped anyway leaves each kept character's span as it was.
    if _without_marks("".join(decomposed)) != _without_marks(unicodedata.normalize("NFD", lowered)):
        decomposed = [unicodedata.normalize("NFD", lowered)] + [""] * (len(pieces) - 1)
        starts, ends = [starts[0]] * len(pieces), [ends[-1]] * len(pieces)
    out: _Chars = ([], [], [])
    for piece, s, e in zip(decomposed, starts, ends):
        for char in piece:
            if unicodedata.category(char) != "Mn":
                out[0].append(char)
                out[1].append(s)
                out[2].append(e)
    return out


def _without_marks(text: str) -> str:
    return "".join(char for char in text if unicodedata.category(char) != "Mn")


def _split_on_punctuation(chars: list[str], starts: list[int], ends: list[int]) -> list[Word]:
    """Google's `_run_split_on_punc`: every punctuation character is a word; runs of the rest stay together."""
    words, begin = [], 0
    for i in range(len(chars) + 1):
        if i == len(chars) or _is_punctuation(chars[i]):
            if i > begin:
                words.append(_word(chars[begin:i], starts[begin:i], ends[begin:i]))
            if i < len(chars):
                words.append(_word([chars[i]], [starts[i]], [ends[i]]))
            begin = i + 1
    return words


def _word(chars: list[str], starts: list[int], ends: list[int]) -> Word:
    # Each character its own next source character: a decomposed one (two jamo of one syllable) followed by a
    # dropped control character can have the right total length without being one-to-one.
    one_to_one = all(s == starts[0] + i and e == s + 1 for i, (s, e) in enumerate(zip(starts, ends)))
    if one_to_one:
        return Word("".join(chars), starts[0], ends[-1])
    return Word("".join(chars), starts[0], ends[-1], starts, ends)


class WordpieceTokenizer:
    """Google's WordpieceTokenizer: greedy longest-match-first over a fixed vocabulary."""

    def __init__(self, vocab: dict[str, int], unk_token: str,
                 max_input_chars_per_word: int = MAX_INPUT_CHARS_PER_WORD) -> None:
        self.vocab, self.unk_id, self.max_input_chars_per_word = vocab, vocab[unk_token], max_input_chars_per_word
        # No candidate longer than the longest token can match: skipping them changes nothing and
        # bounds the work per character.
        self.longest = max(map(len, vocab))

    def tokenize(self, word: str) -> list[tuple[int, int, int]]:
        """(id, start, end) of each piece of `word`, start/end indexing `word`; [UNK] for the whole
        word when it is too long or some part of it matches nothing."""
        unknown = [(self.unk_id, 0, len(word))]
        if len(word) > self.max_input_chars_per_word:
            return unknown
        pieces, start = [], 0
        while start < len(word):
            prefix = "##" if start > 0 else ""
            end = min(len(word), start + self.longest)
            while end > start and prefix + word[start:end] not in self.vocab:
                end -= 1
            if end == start:
                return unknown
            pieces.append((self.vocab[prefix + word[start:end]], start, end))
            start = end
        return pieces
