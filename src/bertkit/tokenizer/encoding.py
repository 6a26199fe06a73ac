"""`Encoding`: one text or pair as BERT's model sees it, `[CLS] A [SEP]` or `[CLS] A [SEP] B [SEP]`,
cut to a length by Google's rule.

Design decision: an Encoding is built from each text encoded alone (a `Piece`, from the engine)
and the number of its tokens kept, so its cost is linear in the texts whatever the truncation
(the Rust library's own pair truncation pairs every overflowing piece of A with every piece of B).
A pair is cut by Google's `_truncate_seq_pair`, in closed form (`truncated_pair_lengths`). The
model inputs are built at once; tokens, word and sequence ids and offsets on first access, so
batch encoding pays only for what the caller reads.

References: google-research/bert `run_classifier.py` (`_truncate_seq_pair`, `convert_single_example`).
"""

from __future__ import annotations

import functools
from typing import Protocol

from bertkit.tokenizer.vocab import CLS, SEP


class Piece(Protocol):
    """One text's WordPiece tokens, no specials, never truncated: what the engine gives per text
    (a `tokenizers` Encoding, `google.WordPieces` or `chunks.ChunkPiece`)."""

    @property
    def ids(self) -> list[int]: ...

    @property
    def offsets(self) -> list[tuple[int, int]]: ...

    @property
    def word_ids(self) -> list[int | None]: ...

    def __len__(self) -> int: ...


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


class Encoding:
    """One encoded text or pair, `[CLS] A [SEP]` or `[CLS] A [SEP] B [SEP]`; every list has one entry
    per token, specials included. `num_truncated` tells how many tokens truncation removed.
    """

    def __init__(self, pieces: tuple[Piece, ...], room: int | None, specials: tuple[int, int],
                 vocabulary: list[str]) -> None:
        """`pieces`: A, or A and B; `room`: tokens they may keep beside the specials (None: all);
        `specials`: the ids of [CLS] and [SEP]."""
        lengths = tuple(map(len, pieces))
        if room is None:
            kept = lengths
        elif len(pieces) == 1:
            kept = (min(lengths[0], room),)
        else:
            kept = truncated_pair_lengths(lengths[0], lengths[1], room)
        self._pieces, self._kept, self._vocabulary = pieces, kept, vocabulary
        cls, sep = specials
        self.input_ids: list[int] = [cls, *pieces[0].ids[: kept[0]], sep]
        if len(pieces) == 2:
            self.input_ids += pieces[1].ids[: kept[1]]
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
        return self._framed([[self._vocabulary[i] for i in ids] for ids in self._kept_of("ids")], CLS, SEP)

    @functools.cached_property
    def word_ids(self) -> list[int | None]:
        """Index of the pre-tokenized word (within its sequence) of each token; None for specials."""
        return self._framed(self._kept_of("word_ids"), None, None)

    @functools.cached_property
    def sequence_ids(self) -> list[int | None]:
        """0 for tokens of A, 1 for tokens of B, None for specials."""
        return self._framed([[k] * n for k, n in enumerate(self._kept)], None, None)

    @functools.cached_property
    def offsets(self) -> list[tuple[int, int]]:
        """Character span of each token in its original text (A or B); (0, 0) for specials."""
        return self._framed(self._kept_of("offsets"), (0, 0), (0, 0))

    def _kept_of(self, field: str) -> list[list]:
        """The kept part of one field of each piece."""
        return [getattr(piece, field)[:n] for piece, n in zip(self._pieces, self._kept)]

    @property
    def num_truncated(self) -> int:
        """Tokens of A and B that truncation removed (0 when the text or pair fit)."""
        return sum(map(len, self._pieces)) - sum(self._kept)

    @property
    def truncated(self) -> bool:
        return self.num_truncated > 0

    def __len__(self) -> int:
        return len(self.input_ids)

    def __repr__(self) -> str:
        return f"Encoding(tokens={self.tokens!r})"
