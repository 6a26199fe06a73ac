"""WordPiece tokenizer: Google's BERT tokenization, at the speed of the `tokenizers` library.

`WordPieceTokenizer` trains a vocabulary, loads/saves `vocab.txt` (ids exactly as the file's line
numbers), and encodes one text or a pair as `[CLS] A [SEP] B [SEP]` with token type ids, attention
mask, character offsets into the original text, word ids and sequence ids.

Design decision: the rules are Google's `tokenization.py`, written out in `google.py`; the class
here only composes the pieces, each with one job:
- `google`: Google's algorithm in pure Python, with offsets (the reference, and the way taken by
  texts the Rust pipeline would get wrong);
- `engine`: each text's encoding by the Rust pipeline, the ASCII chunk path (`chunks`) or `google`;
- `encoding`: `Encoding`, `[CLS] A [SEP] (B [SEP])` cut by Google's `_truncate_seq_pair`;
- `vocab`: vocab.txt / tokenizer.json / tokenizer_config.json, read, checked, written;
- `training`: learning a vocabulary from text files.
Every text, A or B of a pair alike, is encoded alone and cut afterwards, so every cost is linear
in the input. Whether a special token's literal typed in a text ("a [SEP] b") is that token follows the
vocabulary's directory as transformers reads it (`split_special_tokens`, `vocab`), so a model directory gives
bertkit, transformers and sentence-transformers the same ids for a text.

References: Devlin et al. 2018 (arXiv:1810.04805); google-research/bert `tokenization.py` and
`run_classifier.py`; Schuster & Nakajima 2012 (WordPiece); Hugging Face `tokenizers` documentation.
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from bertkit.errors import BertkitError
from bertkit.io.atomic import check_writable
from bertkit.io.bounded import file_present
from bertkit.io.textfile import MAX_TEXT_CHARS
from bertkit.settings.data import TokenizerTrainSettings, VocabularySettings
from bertkit.tokenizer import vocab
from bertkit.tokenizer.encoding import Encoding, truncated_pair_lengths
from bertkit.tokenizer.engine import Engine
from bertkit.tokenizer.google import MAX_INPUT_CHARS_PER_WORD
from bertkit.tokenizer.training import TrainingStats, train_vocabulary
from bertkit.tokenizer.vocab import (
    CLS,
    CONFIG_FILE,
    MASK,
    PAD,
    SEP,
    SPECIAL_TOKENS,
    TOKENIZER_JSON,
    UNK,
    VOCAB_FILE,
)

__all__ = [
    "CLS", "CONFIG_FILE", "MASK", "MAX_INPUT_CHARS_PER_WORD", "MAX_TEXT_CHARS", "PAD", "SEP", "SPECIAL_TOKENS",
    "TOKENIZER_JSON", "UNK", "VOCAB_FILE", "Encoding", "TrainingStats", "WordPieceTokenizer",
    "check_model_vocabulary", "train_tokenizer", "truncated_pair_lengths",
]


class WordPieceTokenizer:
    """BERT's WordPiece tokenizer over a fixed vocabulary (Google's rules, Rust speed).

    Build it with `from_pretrained` (vocab.txt), `train` (text files) or directly from a list of
    tokens in id order. It is immutable and safe to share between threads.

    `split_special_tokens` True (Google's rule, the default of a tokenizer built or trained here): a special
    token's literal in a text is text, "[SEP]" three tokens; False (transformers' default, read from a model
    directory that does not say otherwise): it is the special token.
    """

    def __init__(self, tokens: Sequence[str], do_lower_case: bool = True, *, split_special_tokens: bool = True,
                 source: str = "vocabulary") -> None:
        tokens = list(tokens)
        vocab.check(tokens, source)
        self._tokens = tokens
        self._vocab = {token: i for i, token in enumerate(tokens)}
        self._do_lower_case = bool(do_lower_case)
        self._split_special_tokens = bool(split_special_tokens)
        self._special_ids = tuple(self._vocab[t] for t in SPECIAL_TOKENS)
        self._engine = Engine(self._vocab, self._do_lower_case, self._split_special_tokens)

    # ----------------------------------------------------------------- construction
    @classmethod
    def from_pretrained(cls, path: str | Path, do_lower_case: bool | None = None,
                        split_special_tokens: bool | None = None) -> WordPieceTokenizer:
        """Load a directory holding vocab.txt or a Hugging Face tokenizer.json (+ tokenizer_config.json),
        or the path of either file.

        do_lower_case=None reads it from tokenizer_config.json beside the vocabulary, else from
        tokenizer.json's normalizer, else True. split_special_tokens=None reads it as transformers does:
        tokenizer_config.json's, else False where transformers loads the directory (a tokenizer_config.json,
        tokenizer.json or config.json beside the vocabulary), else (a vocab.txt alone, Google's layout) True.
        """
        tokens, do_lower_case, split_special_tokens, source = vocab.load(path, do_lower_case, split_special_tokens)
        return cls(tokens, do_lower_case, split_special_tokens=split_special_tokens, source=source)

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
        text_column: str = "text",
    ) -> WordPieceTokenizer:
        """Learn a WordPiece vocabulary from a corpus: text files (UTF-8, one or more lines each) or JSONL with
        a `text_column` field, plain, .gz or .zst, Parquet files or `datasets` directories with a `text_column`
        column, paths, directories or glob patterns, read as `bertkit data pretraining` reads them.

        Ids 0..4 are [PAD], [UNK], [CLS], [SEP], [MASK]; then the alphabet (at most
        `limit_alphabet` characters, and at most (vocab_size - 5) / 2 so that it and its `##`
        continuation forms fit) and the learned pieces: never more than `vocab_size` tokens.
        Files are streamed by that reader (`bertkit.io.textlines.read_documents`): lines cut at
        MAX_TEXT_CHARS bytes, invalid UTF-8 replaced, empty files counted, binary files and JSONL lines
        without a "text" skipped (`strict` raises instead); words over MAX_INPUT_CHARS_PER_WORD
        characters are left out. All of it is logged.
        Training counts words with the Rust normalizer, which differs from Google's rules only on
        the rare characters listed in `engine.HAZARD_RANGES`; encoding with the result is exact.
        The same corpus and settings give the same tokens in the same order in every run, at any thread
        count (`bertkit.tokenizer.training`). The keywords are `VocabularySettings`'.
        """
        settings = VocabularySettings(
            inputs=tuple(Path(f) for f in files), text_column=text_column, vocab_size=vocab_size,
            cased=not do_lower_case, min_frequency=min_frequency, limit_alphabet=limit_alphabet,
            progress=show_progress, strict=strict)
        return cls(train_vocabulary(settings), do_lower_case, source="trained vocabulary")

    def save_pretrained(self, directory: str | Path) -> Path:
        """Write vocab.txt and a transformers-compatible tokenizer_config.json; return the directory."""
        return vocab.save(directory, self._tokens, self._do_lower_case, self._split_special_tokens)

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
    def split_special_tokens(self) -> bool:
        """True: "[SEP]" typed in a text is text; False: it is the special token (class docstring)."""
        return self._split_special_tokens

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
        return hashlib.sha256(vocab.vocab_text(self._tokens).encode("utf-8")).hexdigest()

    def __repr__(self) -> str:
        return f"WordPieceTokenizer(vocab_size={self.vocab_size}, do_lower_case={self._do_lower_case})"

    # ----------------------------------------------------------------- tokens and ids
    def tokenize(self, text: str) -> list[str]:
        """WordPiece tokens of `text`, no special tokens."""
        return [self._tokens[i] for i in self.encode_ids([_check_text(text, "text")])[0]]

    def encode_ids(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text, no special tokens, no truncation: the fast path for data creation."""
        return self._engine.encode_ids([_check_text(t, f"texts[{i}]") for i, t in enumerate(texts)])

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
        return self._engine.decode([self._tokens[i] for i in ids])

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
        texts. Large batches of ASCII texts take the engine's chunk path (several times faster);
        their offsets and word ids are computed by the Rust pipeline, for the whole batch, when
        first read. Every field is the same whichever way a text takes.
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
        pieces = self._engine.encode(texts + (text_pairs or []))
        by_text = zip(pieces, pieces[len(texts):]) if text_pairs is not None else ((a,) for a in pieces)
        room, ids = None if limit is None else limit - specials, (self.cls_token_id, self.sep_token_id)
        return [Encoding(parts, room, ids, self._tokens) for parts in by_text]


def train_tokenizer(settings: TokenizerTrainSettings) -> WordPieceTokenizer:
    """`bertkit tokenizer train`: the vocabulary `settings.vocabulary` says (`WordPieceTokenizer.train` gives the
    rules), learned on `settings.threads` threads and written to `settings.output`."""
    if settings.threads is not None:  # read when the tokenizers library first runs in parallel: before training
        os.environ["RAYON_NUM_THREADS"] = str(settings.threads)
    check_writable(settings.output, "--output")  # before the training, whose result would be lost
    if (Path(settings.output) / VOCAB_FILE).exists() and not settings.overwrite:
        raise BertkitError(f"--output {settings.output}: already holds a vocabulary ({VOCAB_FILE}), which data built "
                           "with it and models trained on it need as it is; choose another directory or pass "
                           "--overwrite")
    vocabulary = settings.vocabulary
    tokenizer = WordPieceTokenizer(train_vocabulary(vocabulary), not vocabulary.cased, source="trained vocabulary")
    tokenizer.save_pretrained(settings.output)
    return tokenizer


def _check_text(text: object, name: str) -> str:
    if not isinstance(text, str):
        raise BertkitError(f"{name} must be a str, got {type(text).__name__}")
    if len(text) > MAX_TEXT_CHARS:
        raise BertkitError(f"{name} has {len(text):,} characters, over the {MAX_TEXT_CHARS:,} one call "
                           "accepts; split it into lines, paragraphs or documents first")
    return text


def check_model_vocabulary(tokenizer: WordPieceTokenizer, vocab_size: int, model_dir: str | Path | None,
                           tokenizer_path: str | Path | None = None, flag: str = "--tokenizer") -> None:
    """The one check that `tokenizer` fits the model in `model_dir` (whose config.json says `vocab_size`),
    made wherever a model meets a vocabulary: finetune, predict, evaluate, extract, export and serve.

    Refused, each with a one-line `BertkitError` naming both files and the fix:
    - a vocabulary read from elsewhere (`tokenizer_path`, e.g. --tokenizer) that is not the one in the
      model directory: the model's embedding rows belong to its own tokens, so other tokens with the same
      ids would feed it the wrong words, whatever the sizes (checked when the directory has a vocabulary);
    - more tokens than `vocab_size`: ids from `vocab_size` up have no embedding row.
    A `vocab_size` larger than the vocabulary is accepted: a padded embedding matrix (NVIDIA's and
    MosaicBERT's checkpoints round it up to a multiple of 8) whose extra rows no token reaches.
    `model_dir` None (a model built in Python) checks the size alone.
    """
    model_dir = None if model_dir is None else Path(model_dir)
    own = None if model_dir is None else next(
        (model_dir / name for name in (VOCAB_FILE, TOKENIZER_JSON) if file_present(model_dir / name)), None)
    file = own if tokenizer_path is None else vocab._vocabulary_file(Path(tokenizer_path))
    if own is not None and file is not None and file.resolve() != own.resolve():
        own_tokens = vocab.load(own, True)[0]
        if own_tokens != tokenizer._tokens:
            index = next((i for i, (a, b) in enumerate(zip(own_tokens, tokenizer._tokens)) if a != b),
                         min(len(own_tokens), len(tokenizer._tokens)))
            differs = (f"id {index} is {tokenizer._tokens[index]!r} there, {own_tokens[index]!r} in the model's"
                       if index < min(len(own_tokens), tokenizer.vocab_size) else
                       f"{tokenizer.vocab_size} tokens there, {len(own_tokens)} in the model's")
            raise BertkitError(f"{flag} {file} is not the vocabulary of the model in {model_dir} ({differs} "
                               f"{own.name}); the model's embeddings belong to its own tokens: leave out {flag}, "
                               f"or give the vocabulary it was trained with ({own})")
    if tokenizer.vocab_size > vocab_size:
        config = "the model's config.json" if model_dir is None else model_dir / "config.json"
        fix = f"use the vocabulary it was trained with ({own})" if own is not None and file != own else \
            "use the vocabulary the model was trained with"
        raise BertkitError(f"{file or 'the vocabulary'} has {tokenizer.vocab_size} tokens but {config} says "
                           f"vocab_size {vocab_size}, so ids from {vocab_size} up have no embedding; {fix}")
