"""Learning a WordPiece vocabulary from a corpus, read exactly as `bertkit data pretraining` reads it.

`train_vocabulary` runs the `tokenizers` WordPiece trainer over the sentences of a corpus (text or JSONL,
plain, gzip or zstd; Parquet; `datasets` directories) and returns the tokens in id order: [PAD], [UNK],
[CLS], [SEP], [MASK], the alphabet sorted by code point, then every other piece by how often it occurs in the
corpus (most often first, ties by the piece itself), never more than `vocab_size`.

The vocabulary is a function of the corpus and the settings alone. The trainer's own is not, in two ways
(huggingface/tokenizers#1794), and ids are what a model is trained on, so a vocabulary rebuilt from the same
corpus must be the same file:

- its order: pieces get their ids in hash-map order. Here the order is set after training, by counts from a
  pass that encodes the corpus with the learned pieces (the Rust pipeline, about the trainer's own cost again);
- the pieces themselves where merges tie: the trainer breaks a tie by the pieces' ids, and gives each `##c`
  (a character continuing a word) its id in the order it meets words in a hash map, so a tie went another way
  from run to run. Here a first pass over the corpus (`_alphabet`) chooses the alphabet (the most frequent
  characters, ties by code point) and its `##` pieces before training, and the trainer is given them, the
  `##` pieces as special tokens, so their ids, and every tie, are the same in every run.

Design decision: the files are read by `bertkit.io.textlines.read_documents`, the corpus reader data
creation uses, so both see the same text: a JSONL file's "text" fields (never its keys, quotes and
braces), glob patterns expanded, a byte order mark dropped; and the same rules and counts (lines cut at
MAX_LINE_BYTES bytes, invalid UTF-8 replaced, binary files, corrupt gzip data and JSONL lines without
a "text" skipped, empty files named; `strict` raises instead). Words over MAX_INPUT_CHARS_PER_WORD
characters are left out (they encode as [UNK] and cost the trainer the square of their length). Each
is counted in `TrainingStats` and logged. The trainer counts words with the Rust normalizer, which
differs from Google's rules only on the rare characters of `engine.HAZARD_RANGES`; encoding with the
result is exact.

References: Schuster & Nakajima 2012 (WordPiece); Hugging Face `tokenizers` documentation
(trainers.WordPieceTrainer).
"""

from __future__ import annotations

import functools
import itertools
import logging
import re
import sys
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

from bertkit.errors import BertkitError
from bertkit.io.textlines import MAX_LINE_BYTES, CorpusStats, expand_inputs, read_documents
from bertkit.settings.data import VocabularySettings
from bertkit.tokenizer.engine import bert_normalizer
from bertkit.tokenizer.google import MAX_INPUT_CHARS_PER_WORD, SEPARATORS, _is_punctuation
from bertkit.tokenizer.vocab import SPECIAL_TOKENS, UNK

logger = logging.getLogger(__name__)


@dataclass
class TrainingStats(CorpusStats):
    """What `WordPieceTokenizer.train` read, and what it did about bad input (files, lines and JSONL records
    counted by `bertkit.io.textlines`, as for `bertkit data pretraining`)."""

    long_words: int = 0
    """Words over MAX_INPUT_CHARS_PER_WORD characters, left out (they encode as [UNK])."""
    documents: int = 0
    sentences: int = 0
    """Documents and sentences fed to the trainer (a JSONL record or table row is a document)."""


def train_vocabulary(settings: VocabularySettings) -> list[str]:
    """Tokens in id order learned from `settings.inputs` (see `WordPieceTokenizer.train` for the rules)."""
    do_lower_case, strict, text_column = not settings.cased, settings.strict, settings.text_column
    stats = TrainingStats()
    paths = expand_inputs([str(f) for f in settings.inputs], stats)  # globs and directories as data creation takes

    def corpus(counted: TrainingStats) -> Iterator[str]:  # read once per pass; the training pass is counted
        return _training_lines(paths, counted, strict, _ShortWords(do_lower_case), text_column)

    characters, continuing = _alphabet(corpus(TrainingStats()), bert_normalizer(do_lower_case), settings.alphabet())
    trainer = trainers.WordPieceTrainer(
        vocab_size=settings.vocab_size, min_frequency=settings.min_frequency,
        special_tokens=[*SPECIAL_TOKENS, *(f"##{c}" for c in continuing)],  # ids fixed before training
        initial_alphabet=characters, limit_alphabet=settings.alphabet(),
        # tokenizers' bars print bare line breaks to stdout where it is not a terminal (a log, a pipe): shown only
        # to a terminal, so a redirected stdout holds bertkit's lines alone
        continuing_subword_prefix="##", show_progress=settings.progress and sys.stdout.isatty(),
    )
    pipeline = Tokenizer(models.WordPiece(unk_token=UNK, max_input_chars_per_word=MAX_INPUT_CHARS_PER_WORD))
    pipeline.normalizer = bert_normalizer(do_lower_case)
    pipeline.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    pipeline.train_from_iterator(corpus(stats), trainer=trainer)
    _report_training(stats)
    tokens = _canonical_order(pipeline.get_vocab(), do_lower_case, corpus(TrainingStats()))
    if len(tokens) <= len(SPECIAL_TOKENS):
        raise BertkitError(f"no text found in {', '.join(map(str, paths))}; {_why_no_text(stats)}")
    if len(tokens) < settings.vocab_size:  # the trainer stops when no pair is left to merge: say so, with the cause
        logger.warning("the vocabulary has %s tokens, fewer than --vocab-size %s: the corpus has no more pieces to "
                       "learn (seen at least --min-frequency %d times); a larger corpus gives more",
                       f"{len(tokens):,}", f"{settings.vocab_size:,}", settings.min_frequency)
    return tokens


COUNT_BATCH_LINES = 10_000
"""Lines encoded at a time when counting pieces (bounded memory, the Rust pipeline's parallelism)."""


def _batches(lines: Iterator[str]) -> Iterator[list[str]]:
    """`lines` in lists of COUNT_BATCH_LINES."""
    while batch := list(itertools.islice(lines, COUNT_BATCH_LINES)):
        yield batch


def _alphabet(lines: Iterator[str], normalizer: normalizers.Normalizer, limit: int) -> tuple[list[str], list[str]]:
    """The alphabet the trainer keeps, chosen as it would choose it but with ties broken by code point: the
    `limit` most frequent characters of the corpus's words (normalized as the trainer does; whitespace is not
    in words); and those of them that continue a word somewhere (they get a `##` piece): a character after
    another in a run without whitespace, neither of them punctuation (which the trainer's pre-tokenizer
    splits off, as Google's BasicTokenizer does)."""
    counts: Counter[str] = Counter()
    continuing: set[str] = set()
    is_punctuation = functools.cache(_is_punctuation)
    for batch in _batches(lines):  # a newline is whitespace to the normalizer: a batch splits as its lines do
        text = normalizer.normalize_str("\n".join(batch))
        counts.update(text)
        for chunk in set(text.split()):  # each distinct chunk once: the cost is the distinct text's
            for before, character in itertools.pairwise(chunk):
                if character not in continuing and not (is_punctuation(before) or is_punctuation(character)):
                    continuing.add(character)
    characters = [c for c in counts if not c.isspace()]
    kept = sorted(characters, key=lambda character: (-counts[character], character))[:limit]
    return sorted(kept), sorted(c for c in kept if c in continuing)


def _canonical_order(learned: dict[str, int], do_lower_case: bool, lines: Iterator[str]) -> list[str]:
    """The `learned` pieces in an order that depends on the corpus alone: the special tokens, the alphabet (single
    characters) by code point, then the rest by their count in `lines` encoded with them (descending), ties by
    the piece."""
    pipeline = Tokenizer(models.WordPiece(learned, unk_token=UNK, max_input_chars_per_word=MAX_INPUT_CHARS_PER_WORD))
    pipeline.normalizer = bert_normalizer(do_lower_case)
    pipeline.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    pipeline.add_special_tokens(list(SPECIAL_TOKENS))  # the `##` pieces are plain pieces here, never cut from text
    counts = np.zeros(len(learned), dtype=np.int64)
    for batch in _batches(lines):
        for encoding in pipeline.encode_batch(batch, add_special_tokens=False):
            np.add.at(counts, np.asarray(encoding.ids, dtype=np.int64), 1)
    specials = [token for token in SPECIAL_TOKENS if token in learned]
    alphabet = sorted(token for token in learned if len(token) == 1 and token not in specials)
    rest = sorted((token for token in learned if token not in specials and token not in alphabet),
                  key=lambda token: (-int(counts[learned[token]]), token))
    return [*specials, *alphabet, *rest]


def _training_lines(paths: Sequence[Path], stats: TrainingStats, strict: bool, words: _ShortWords,
                    text_column: str = "text") -> Iterator[str]:
    """The sentences of the corpus as `bertkit data pretraining` reads them (`read_documents`), long
    words left out."""
    for document in read_documents(list(paths), stats, strict, text_column):
        stats.documents += 1
        stats.sentences += len(document)
        for sentence in document:
            yield words(sentence, stats)


# A run of more than MAX_INPUT_CHARS_PER_WORD characters between BERT's word separators: it may hold a
# word too long for WordPiece.
_LONG_RUN_RE = re.compile(f"[^{SEPARATORS}]{{{MAX_INPUT_CHARS_PER_WORD + 1},}}")


class _ShortWords:
    """A training line without its words over MAX_INPUT_CHARS_PER_WORD characters (normalized).

    They encode as [UNK], so they have nothing to teach the vocabulary, and the trainer's cost grows
    with the square of a word's length (one 1M-character word runs for hours). Only runs between
    separators longer than the cap are looked at, by the Rust normalizer and pre-tokenizer the
    trainer uses; the rest of the line is left as it is.
    """

    def __init__(self, do_lower_case: bool) -> None:
        self.normalizer = bert_normalizer(do_lower_case)
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


def _why_no_text(stats: TrainingStats) -> str:
    """What left a corpus without a word to train on, from what reading it counted."""
    why = [f"skipped {stats.skipped_said()}"] if stats.skipped_files else []
    if stats.long_words:
        why.append(f"its {stats.long_words:,} word(s) are all over {MAX_INPUT_CHARS_PER_WORD} characters, left out "
                   "(text without spaces? split it into words)")
    if stats.empty_files:
        why.append(f"empty: {', '.join(stats.empty_files[:3])}")
    return "; ".join(why) if why else "the files hold only whitespace and control characters"


def _report_training(stats: TrainingStats) -> None:
    logger.info("read %d documents, %d sentences (%.1f MB) from %d file(s)", stats.documents, stats.sentences,
                stats.text_bytes / 1e6, stats.files)
    if stats.empty_files:
        logger.warning("%d empty file(s): %s", len(stats.empty_files), ", ".join(stats.empty_files))
    for reason, files in stats.skipped_files.items():
        logger.warning("skipped %d file(s), %s: %s (pass --strict to stop instead)", len(files), reason,
                       ", ".join(files))
    if stats.invalid_utf8_lines:
        logger.warning("%d line(s) held bytes that are not UTF-8; they were read with U+FFFD, which "
                       "BERT's text cleaning drops", stats.invalid_utf8_lines)
    for reason, count in sorted(stats.skipped_lines.items()):
        logger.warning("skipped %d line(s): %s (pass --strict to stop instead)", count, reason)
    if stats.lines_cut:
        logger.warning("%d line(s) over %s bytes were cut there (as `bertkit data pretraining` cuts them)",
                       stats.lines_cut, f"{MAX_LINE_BYTES:,}")
    if stats.long_words:
        logger.warning("left out %d word(s) over %d characters: they encode as [UNK]", stats.long_words,
                       MAX_INPUT_CHARS_PER_WORD)
