"""Choosing the WordPieces a vocabulary lacks for a domain: the pieces that save the most tokens on its text.

`choose_new_pieces(tokenizer, files, add)` reads a domain corpus as `bertkit data pretraining` reads it,
counts its words (BERT's normalisation and pre-tokenisation, as the vocabulary trainer counts them) and
returns the `add` pieces to append to the vocabulary, each with the tokens it saves, and the corpus's
tokens per word before and after.

Design decision: a candidate is either a whole word of the corpus (seen at least `min_count` times) or a
piece of a WordPiece vocabulary trained on the corpus (`train_vocabulary`, as large as the model's, so
stems and endings such as `##eth` compete with whole words), that the vocabulary lacks. A candidate's score
is the tokens it saves on the corpus: Google's greedy longest-match WordPiece re-run on every word it can
change (a word-initial piece only changes words it starts; a `##` piece only words that hold it after their
first character), times the word's count. Savings overlap (`begat` and a `##at` both shorten `begat`), so
pieces are chosen greedily, each the one that saves the most given those chosen before it (lazy greedy:
a score can only fall as pieces are added, so a piece is re-scored when it reaches the top of the heap and
taken if it still beats the next one's older score; ties by token). The scores of the chosen pieces then
add up to the tokens the extension saves. New pieces are appended after the last id: every existing id
keeps its token, [unused*] slots included (users put their own markers there).

References: Schuster & Nakajima 2012 (WordPiece); google-research/bert's GitHub thread #9 (adding domain words);
Tai et al. 2020, "exBERT" (Findings of EMNLP); Gururangan et al. 2020, "Don't Stop Pretraining".
"""

from __future__ import annotations

import bisect
import heapq
import logging
from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tokenizers import pre_tokenizers

from bertkit.errors import BertkitError
from bertkit.io.textlines import CorpusStats, expand_inputs, read_documents
from bertkit.settings.data import VocabularySettings
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
    """Tokens each piece saves on the corpus given the pieces before it (same order; they add up to
    tokens_before - tokens_after)."""
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
    paths = expand_inputs([str(f) for f in files], stats, flag="--corpus")
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
    trained = train_vocabulary(VocabularySettings(
        inputs=tuple(Path(f) for f in files), text_column=text_column, vocab_size=len(tokens), cased=not do_lower_case,
        min_frequency=min_count, progress=False, strict=strict))
    candidates |= {t for t in trained if t not in vocab and t not in SPECIAL_TOKENS}
    useful = [(-saved, c) for c in candidates if (saved := _saved(c, split, counts, lengths, vocab)) > 0]
    if not useful:
        raise BertkitError(f"{', '.join(map(str, files))}: no new words - every word of the corpus is one piece "
                           "of the vocabulary already (or [UNK]), so no piece would save a token; nothing to add")
    if add > len(useful):
        raise BertkitError(f"--add {add}: only {len(useful)} pieces the vocabulary lacks save tokens on this corpus "
                           f"(the best saves {-min(useful)[0]:,}); use --add {len(useful)} or fewer, or a larger "
                           "corpus")
    chosen = _greedy(useful, add, split, counts, lengths, vocab)
    if len(chosen) < add:
        raise BertkitError(f"--add {add}: once the best {len(chosen)} pieces are in, no other piece the vocabulary "
                           f"lacks saves a token on this corpus; use --add {len(chosen)} or fewer, or a larger corpus")
    logger.info("%d candidate pieces save tokens; the %d chosen save %s to %s tokens each (given those before)",
                len(useful), len(chosen), f"{chosen[-1][0]:,}", f"{chosen[0][0]:,}")
    return Extension([p for _, p in chosen], [s for s, _ in chosen], words, before, candidates=len(useful),
                     stats={k: v for k, v in vars(stats).items() if isinstance(v, int)})


def _greedy(scored: list[tuple[int, str]], add: int, split: list[str], counts: Counter[str], lengths: dict[str, int],
            vocab: set[str]) -> list[tuple[int, str]]:
    """Up to `add` (tokens saved, piece), each the piece that saves the most given the pieces chosen before it
    (lazy greedy: a piece's saving can only have been overstated by the choices since it was scored, so it is
    re-scored when it reaches the top and taken if it still beats the next one's stale score). Updates
    `lengths` and `vocab`. Fewer than `add` only if the rest save nothing once the others are in."""
    heap = list(scored)  # (-saved, piece)
    heapq.heapify(heap)
    chosen: list[tuple[int, str]] = []
    while heap and len(chosen) < add:
        _, piece = heapq.heappop(heap)
        saved = _saved(piece, split, counts, lengths, vocab)
        if heap and saved < -heap[0][0]:
            if saved > 0:
                heapq.heappush(heap, (-saved, piece))
            continue
        if saved <= 0:
            break
        chosen.append((saved, piece))
        vocab.add(piece)
        for word in _affected(piece, split):
            lengths[word] = _length(word, vocab)
    return chosen


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


def _affected(candidate: str, split: list[str]) -> list[str]:
    """The words of `split` (sorted) whose WordPiece `candidate` can change."""
    if candidate.startswith(CONTINUATION) and len(candidate) > len(CONTINUATION):
        body = candidate[len(CONTINUATION):]
        return [w for w in split if body in w[1:]]
    # a word-initial piece only matches at the start of a word: the words it prefixes, by bisection
    first = bisect.bisect_left(split, candidate)
    return split[first:bisect.bisect_left(split, candidate + "\U0010ffff")]


def _saved(candidate: str, split: list[str], counts: Counter[str], lengths: dict[str, int],
           vocab: Collection[str]) -> int:
    """Tokens the corpus loses when `candidate` joins `vocab` (whose words have `lengths`)."""
    return sum(counts[w] * (lengths[w] - _length(w, vocab, candidate)) for w in _affected(candidate, split))
