"""Choosing the WordPieces a vocabulary lacks for a domain: the pieces that save the most tokens on its text.

`choose_new_pieces(tokenizer, files, add)` reads a domain corpus as `bertkit data pretraining` reads it,
counts its words (BERT's normalisation and pre-tokenisation, as the vocabulary trainer counts them) and
returns the `add` pieces to append to the vocabulary, each with the tokens it saves, and the corpus's
tokens per word before and after.

Design decision: a candidate is either a whole word of the corpus (seen at least `min_count` times) or a
piece of a WordPiece vocabulary trained on the corpus (`train_vocabulary`, as large as the model's, so
stems and endings such as `##eth` compete with whole words), that the vocabulary lacks. Each candidate is
scored by the tokens it saves on the corpus when added alone: Google's greedy longest-match WordPiece run
on every word it can change (a word-initial piece only changes words it starts; a `##` piece only words
that hold it after their first character), times the word's count. The `add` best are kept (ties by
token, so the choice is repeatable for a given candidate set). Savings of two pieces overlap (`begat` and
`##at` both shorten `begat`), so the sum of the scores overstates the total; the real total is measured
afterwards with the extended vocabulary and reported. New pieces are appended after the last id: every
existing id keeps its token, [unused*] slots included (users put their own markers there).

References: Schuster & Nakajima 2012 (WordPiece); google-research/bert issue 9 (adding domain words);
Tai et al. 2020, "exBERT" (Findings of EMNLP); Gururangan et al. 2020, "Don't Stop Pretraining".
"""

from __future__ import annotations

import bisect
import logging
from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tokenizers import pre_tokenizers

from bertkit.errors import BertkitError
from bertkit.textlines import CorpusStats, expand_inputs, read_documents
from bertkit.tokenizer.engine import bert_normalizer
from bertkit.tokenizer.google import MAX_INPUT_CHARS_PER_WORD
from bertkit.tokenizer.training import train_vocabulary
from bertkit.tokenizer.vocab import SPECIAL_TOKENS

logger = logging.getLogger(__name__)

CONTINUATION = "##"


@dataclass
class Extension:
    """The pieces to append to a vocabulary for a corpus, and what they change."""

    pieces: list[str]
    """New tokens in the order they are appended (best first)."""
    saved: list[int]
    """Tokens each piece saves on the corpus when added alone (same order)."""
    words: int
    """Words in the corpus (BERT's pre-tokenisation: punctuation marks are words)."""
    tokens_before: int
    """WordPiece tokens of the corpus with the old vocabulary."""
    tokens_after: int = 0
    """... with the extended one (filled in by `measure`)."""
    candidates: int = 0
    """Candidates that save at least one token (the most `add` can be)."""
    stats: dict[str, int] = field(default_factory=dict)
    """What the corpus reader counted (files, lines, skipped ...)."""

    def tokens_per_word(self) -> tuple[float, float]:
        """(before, after)."""
        return self.tokens_before / max(self.words, 1), self.tokens_after / max(self.words, 1)


def word_counts(files: Sequence[str | Path], do_lower_case: bool, strict: bool = False,
                text_column: str = "text") -> tuple[Counter[str], CorpusStats]:
    """Normalised words of a corpus and their counts (words over MAX_INPUT_CHARS_PER_WORD characters left
    out: they encode as [UNK] whatever the vocabulary)."""
    stats = CorpusStats()
    paths = expand_inputs([str(f) for f in files], stats)
    normalizer, splitter = bert_normalizer(do_lower_case), pre_tokenizers.BertPreTokenizer()
    counts: Counter[str] = Counter()
    for document in read_documents(paths, stats, strict, text_column):
        for sentence in document:
            counts.update(w for w, _ in splitter.pre_tokenize_str(normalizer.normalize_str(sentence))
                          if len(w) <= MAX_INPUT_CHARS_PER_WORD)
    return counts, stats


def wordpiece(word: str, vocab: Collection[str], extra: str | None = None) -> list[str] | None:
    """Google's greedy longest-match-first WordPiece of one normalised word over `vocab` (+ `extra`);
    None when some part has no match (the word is [UNK]). A word given as `##xyz` is split as a
    continuation (every piece `##`-prefixed), as the pieces of a new `##` token are."""
    start, pieces = 0, []
    prefix = ""
    if word.startswith(CONTINUATION) and len(word) > len(CONTINUATION):
        word, prefix = word[len(CONTINUATION):], CONTINUATION
    while start < len(word):
        for end in range(len(word), start, -1):
            piece = (CONTINUATION if start or prefix else "") + word[start:end]
            if piece in vocab or piece == extra:
                pieces.append(piece)
                start = end
                break
        else:
            return None
    return pieces


def choose_new_pieces(tokens: Sequence[str], do_lower_case: bool, files: Sequence[str | Path], add: int,
                      min_count: int = 2, strict: bool = False, text_column: str = "text") -> Extension:
    """The `add` pieces that save the most tokens on `files` among those `tokens` lacks (module docstring);
    BertkitError when the corpus has no word the vocabulary lacks, or fewer useful pieces than `add`."""
    if add < 1:
        raise BertkitError(f"--add {add}: give the number of pieces to add (1 or more)")
    counts, stats = word_counts(files, do_lower_case, strict, text_column)
    if not counts:
        raise BertkitError(f"no text found in {', '.join(map(str, files))}; give the domain corpus with --corpus")
    vocab = set(tokens)
    lengths = {w: _length(w, vocab) for w in counts}
    words, before = sum(counts.values()), sum(counts[w] * n for w, n in lengths.items())
    # Only words of two or more pieces can get shorter ([UNK] words are one token already).
    split = sorted(w for w, n in lengths.items() if n > 1)
    candidates = {w for w in split if counts[w] >= min_count}
    trained = train_vocabulary(files, len(tokens), do_lower_case, min_count, 1000, False, strict, text_column)
    candidates |= {t for t in trained if t not in vocab and t not in SPECIAL_TOKENS}
    scored = sorted(((_saved(c, split, counts, lengths, vocab), c) for c in candidates), key=lambda s: (-s[0], s[1]))
    useful = [(saved, piece) for saved, piece in scored if saved > 0]
    if not useful:
        raise BertkitError(f"{', '.join(map(str, files))}: no new words - every word of the corpus is one piece "
                           "of the vocabulary already (or [UNK]), so no piece would save a token; nothing to add")
    if add > len(useful):
        raise BertkitError(f"--add {add}: only {len(useful)} pieces the vocabulary lacks save tokens on this corpus "
                           f"(the best saves {useful[0][0]:,}); use --add {len(useful)} or fewer, or a larger corpus")
    chosen = useful[:add]
    logger.info("%d candidate pieces save tokens; the %d best save %s to %s tokens each (alone)", len(useful), add,
                f"{chosen[-1][0]:,}", f"{chosen[0][0]:,}")
    return Extension([p for _, p in chosen], [s for s, _ in chosen], words, before, candidates=len(useful),
                     stats={k: v for k, v in vars(stats).items() if isinstance(v, int)})


def measure(extension: Extension, tokens: Sequence[str], files: Sequence[str | Path], do_lower_case: bool,
            strict: bool = False, text_column: str = "text") -> Extension:
    """Fill in `tokens_after`: the corpus's tokens with `tokens` + the extension's pieces."""
    counts, _ = word_counts(files, do_lower_case, strict, text_column)
    vocab = set(tokens) | set(extension.pieces)
    extension.tokens_after = sum(counts[w] * _length(w, vocab) for w in counts)
    return extension


def _length(word: str, vocab: Collection[str], extra: str | None = None) -> int:
    pieces = wordpiece(word, vocab, extra)
    return 1 if pieces is None else len(pieces)


def _saved(candidate: str, split: list[str], counts: Counter[str], lengths: dict[str, int],
           vocab: Collection[str]) -> int:
    """Tokens the corpus loses when `candidate` alone joins `vocab`."""
    if candidate.startswith(CONTINUATION) and len(candidate) > len(CONTINUATION):
        body = candidate[len(CONTINUATION):]
        affected = [w for w in split if body in w[1:]]
    else:  # a word-initial piece only matches at the start of a word: the words it prefixes, by bisection
        first = bisect.bisect_left(split, candidate)
        last = bisect.bisect_left(split, candidate + "\U0010ffff")
        affected = split[first:last]
    return sum(counts[w] * (lengths[w] - _length(w, vocab, candidate)) for w in affected)
