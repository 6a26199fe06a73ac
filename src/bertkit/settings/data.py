"""The settings of `bertkit data pretraining` (what changes the instances, recorded in the manifest, and how the
command runs) and of `bertkit tokenizer train | extend | encode`.

Design decision: each command's library function takes its object here and nothing computes a setting's value
elsewhere: a default that depends on another setting (`--dupe-factor` on `--masking`, `--packing` on `--no-nsp`) is
None in the field and resolved by the settings class (`InstanceSettings.resolved`), so the command line, Python
callers and the manifest see one rule.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from bertkit.errors import BertkitError
from bertkit.settings.fields import Settings, sequence_length_field

# --- pre-training data (bertkit data pretraining) ------------------------------------------------------

MASKINGS = ("static", "dynamic")
"""The values of --masking: masks stored in the shards, or drawn by the training loader."""
DATA_RNGS = ("numpy", "python")
"""The values of `bertkit data pretraining --rng`."""
PACKINGS = ("full-sentences", "doc-sentences", "contiguous")
"""The values of `bertkit data pretraining --packing` (bertkit.data.packing), for --no-nsp data; the first is the
default."""
DUPE_FACTORS = {"static": 10, "dynamic": 1}
"""--dupe-factor by --masking when it is not given: dynamic masking draws new masks every epoch, so one pass
suffices."""
MAX_INSTANCE_TOKENS = 65535
"""The longest instance the shards hold (their lengths and masked positions are uint16)."""
VOCABULARY_INITS = ("mean", "random")
"""The values of `bertkit tokenizer extend --init` (bertkit.workflows.adapt)."""


@dataclass(frozen=True)
class InstanceSettings(Settings):
    """Every setting that changes the produced data (all recorded in the manifest;
    bertkit.data.pretraining.build_pretraining_data)."""

    max_seq_length: int = sequence_length_field(128, pairs=True, most=MAX_INSTANCE_TOKENS)
    """Longest instance in tokens, [CLS] and [SEP]s included."""
    masked_lm_prob: float = 0.15
    """Fraction of each instance's tokens to predict."""
    max_predictions_per_seq: int = dataclasses.field(default=20, metadata={"min": 1})
    """Most predicted tokens per instance."""
    dupe_factor: int | None = dataclasses.field(default=None, metadata={"min": 1})
    """Passes over the corpus with different pairs and masks; unset: 10 with static masking, 1 with dynamic."""
    short_seq_prob: float = 0.1
    """Probability of a shorter target length for a document."""
    nsp: bool = True
    """Next-sentence pairs [CLS] A [SEP] B [SEP] (Google's rules, half with a random B); --no-nsp: one-segment
    masked-LM instances packed by --packing, for `bertkit pretrain --no-nsp` (--short-seq-prob is unused)."""
    packing: str | None = dataclasses.field(default=None, metadata={"choices": PACKINGS})
    """How --no-nsp instances are filled up to --max-seq-length: full-sentences (RoBERTa's: whole sentences,
    crossing documents with a [SEP] between them), doc-sentences (whole sentences of one document),
    contiguous (the token stream cut at the length, splitting sentences); a sentence longer than an
    instance is split, never dropped; unset: full-sentences."""
    whole_word_masking: bool = False
    """Mask all WordPiece pieces of a word together."""
    masking: str = dataclasses.field(default="dynamic", metadata={"choices": MASKINGS})
    """dynamic: unmasked instances stored once, masked by the training loader from (seed, epoch, index), so the
    short recipe can choose its masking rate (the combination measured to pay); static: masks stored in the
    shards, as Google's create_pretraining_data.py (with --dupe-factor 10 copies)."""
    seed: int = dataclasses.field(default=12345, metadata={"min": 0})
    """Random seed; same seed and inputs give byte-identical shards."""
    split_sentences: bool = False
    """Split each line into sentences (pysbd) first."""
    rng: str = dataclasses.field(default="numpy", metadata={"choices": DATA_RNGS})
    """numpy: pair rules and masking vectorised per block (fast); python: the original script's
    per-document draws and order (about 10x slower)."""
    shuffle_buffer_mb: float = 4.0
    """MiB of text per block: the pool random-next sentences come from, and the shuffle window."""

    def check(self) -> None:
        if not 0.0 < self.masked_lm_prob < 1.0:
            raise BertkitError(f"--masked-lm-prob must be in (0, 1), got {self.masked_lm_prob}")
        if not 0.0 <= self.short_seq_prob <= 1.0:
            raise BertkitError(f"--short-seq-prob must be in [0, 1], got {self.short_seq_prob}")
        if self.nsp and self.packing is not None:
            raise BertkitError("--packing applies to --no-nsp data only (NSP data is Google's sentence pairs); "
                               "add --no-nsp or drop --packing")
        if not self.nsp and self.rng == "python":
            raise BertkitError("--rng python reproduces Google's NSP pairs; --no-nsp data is packed by one "
                               "deterministic rule and masked by the numpy rules, so drop --rng python")
        if not self.shuffle_buffer_mb > 0:
            raise BertkitError(f"--shuffle-buffer-mb must be positive, got {self.shuffle_buffer_mb}")

    def resolved(self) -> InstanceSettings:
        """These settings with the defaults that follow other settings filled in (what the data is built with
        and the manifest records): --dupe-factor by --masking, --packing full-sentences for --no-nsp data."""
        return dataclasses.replace(
            self, dupe_factor=self.dupe_factor or DUPE_FACTORS[self.masking],
            packing=self.packing or (None if self.nsp else PACKINGS[0]))


@dataclass(frozen=True)
class PretrainingDataSettings(Settings):
    """How `bertkit data pretraining` runs: its files and the settings that do not change the data."""

    inputs: tuple[str, ...] = dataclasses.field(metadata={"flag": "--input"})
    """Text file(s) (one sentence per line, blank line between documents), .jsonl (a document per line), either
    with .gz or .zst, Parquet or a `datasets` save_to_disk directory (a document per row), or a directory of
    them; repeat the flag, list the files after it (an unquoted glob, as the shell expands it) or give a quoted
    glob pattern."""
    tokenizer: str
    """Tokenizer directory (vocab.txt) from `bertkit tokenizer train`."""
    output: str
    """Output directory for shards and manifest.json."""
    workers: int | None = dataclasses.field(default=None, metadata={"min": 1})
    """Worker processes; unset: all cores."""
    strict: bool = False
    """Fail on invalid UTF-8, binary or corrupt files, bad JSONL lines or rows without a text instead of
    replacing/skipping and counting them."""
    text_column: str = "text"
    """Field of a JSONL record and column of a Parquet/`datasets` table that holds a document."""
    shard_size_mb: float = dataclasses.field(default=64.0, metadata={"min": 0.001})
    """Approximate size of each shard's token ids (MiB)."""
    overwrite: bool = False
    """Replace existing data in --output."""
    quiet: bool = False
    """No progress bar."""
    instances: InstanceSettings = dataclasses.field(default_factory=InstanceSettings)
    """What the instances are (recorded in the manifest)."""

    def check(self) -> None:
        if not self.inputs:
            raise BertkitError("no input files; pass them with --input FILE [FILE ...]")


# --- tokenizer (bertkit tokenizer train / extend / encode) ---------------------------------------------

@dataclass(frozen=True)
class VocabularySettings(Settings):
    """What a WordPiece vocabulary is learned from, and how (bertkit.tokenizer.training.train_vocabulary;
    `WordPieceTokenizer.train` takes the same as keywords)."""

    inputs: tuple[Path, ...] = dataclasses.field(default=(), metadata={"flag": "--input", "path": "any"})
    """Corpus file(s) to learn from, read as `data pretraining` reads them: text (one sentence a line), JSONL
    (the --text-column field of each line), either plain, .gz or .zst, Parquet or a `datasets` save_to_disk
    directory (the --text-column column), or a directory of them; several may follow one --input."""
    text_column: str = "text"
    """Field of a JSONL record and column of a Parquet/`datasets` table that holds a document."""
    vocab_size: int = dataclasses.field(default=30522, metadata={"min": 5})
    """Target vocabulary size, specials included."""
    cased: bool = False
    """Keep case and accents (default: lower-case and strip accents, like BERT uncased)."""
    min_frequency: int = dataclasses.field(default=2, metadata={"min": 1})
    """Least count for a merged piece to enter the vocabulary."""
    limit_alphabet: int = dataclasses.field(default=1000, metadata={"min": 0})
    """Most distinct characters kept as base pieces (at most (--vocab-size - 5) / 2)."""
    progress: bool = True
    """Show the trainer's progress bar."""
    strict: bool = False
    """Fail on invalid UTF-8, binary or corrupt files, bad JSONL lines or rows without a text instead of
    replacing/skipping and counting them."""

    def check(self) -> None:
        if not self.inputs:
            raise BertkitError("no input files; pass them with --input FILE [FILE ...]")
        if self.alphabet() < 1:
            raise BertkitError(f"--vocab-size {self.vocab_size} with --limit-alphabet {self.limit_alphabet} leaves no "
                               "room for a single base character beside the 5 special tokens; use --vocab-size 7 or "
                               "more and --limit-alphabet 1 or more")

    def alphabet(self) -> int:
        """Base characters the vocabulary keeps: --limit-alphabet, at most half the room beside the 5 special
        tokens (each character may need its ## form too)."""
        return min(self.limit_alphabet, (self.vocab_size - 5) // 2)


@dataclass(frozen=True)
class TokenizerTrainSettings(Settings):
    """`bertkit tokenizer train`: the vocabulary to learn, where it is written and the trainer's threads
    (bertkit.tokenizer.train_tokenizer)."""

    output: Path = dataclasses.field(metadata={"path": "dir"})
    """Directory to write vocab.txt and tokenizer_config.json to."""
    vocabulary: VocabularySettings
    """What the vocabulary is learned from, and how."""
    threads: int | None = dataclasses.field(default=None, metadata={"min": 1})
    """Threads of the trainer (the tokenizers library's pool, RAYON_NUM_THREADS); unset: one per core."""
    overwrite: bool = False
    """Replace a vocabulary already in --output (data built with it and models trained on it then no longer
    match it)."""


@dataclass(frozen=True)
class TokenizerExtendSettings(Settings):
    """What `bertkit tokenizer extend` adds to a model's vocabulary, and from which text
    (bertkit.workflows.adapt.extend_model)."""

    model: Path = dataclasses.field(metadata={"path": "dir", "exists": True})
    """BERT model directory (config.json, weights, vocab.txt; a sentence-transformers directory too)."""
    output: Path = dataclasses.field(metadata={"path": "dir"})
    """New directory for the extended model (the original is never changed)."""
    add: int = dataclasses.field(metadata={"min": 1})
    """Pieces to add: the ones that save the most tokens on the corpus."""
    corpus: tuple[Path, ...] = dataclasses.field(default=(), metadata={"flag": "--corpus", "path": "any"})
    """Domain text, read as `data pretraining` reads it (text, JSONL, .gz/.zst, Parquet, directories); several
    may follow one --corpus."""
    init: str = dataclasses.field(default="mean", metadata={"choices": VOCABULARY_INITS})
    """New embedding rows: mean of the rows of the pieces the old vocabulary splits the new piece into, or
    random (normal, std initializer_range, as the paper initialises embeddings)."""
    min_count: int = dataclasses.field(default=2, metadata={"min": 1})
    """Least count of a word (or trained piece) in the corpus to be a candidate."""
    seed: int = 0
    """Seed of random rows (--init random, and pieces whose old split is [UNK])."""
    text_column: str = "text"
    """Field of a JSONL record and column of a Parquet/`datasets` table that holds a document."""
    strict: bool = False
    """Fail on invalid UTF-8, binary or corrupt files instead of replacing/skipping and counting them."""

    def check(self) -> None:
        if not self.corpus:
            raise BertkitError("no domain text; pass it with --corpus FILE [FILE ...]")


@dataclass(frozen=True)
class TokenizerEncodeSettings(Settings):
    """How `bertkit tokenizer encode` encodes its TEXT (WordPieceTokenizer.from_pretrained, .encode)."""

    tokenizer: Path = dataclasses.field(metadata={"path": "any", "exists": True})
    """Directory holding vocab.txt (or the vocab.txt file)."""
    pair: str | None = None
    """Second text of a pair (segment B)."""
    max_length: int | None = sequence_length_field(None)
    """Truncate to this many tokens, specials included."""
    do_lower_case: bool | None = dataclasses.field(default=None, metadata={"flag": "--lower-case/--cased"})
    """Override do_lower_case (default: from tokenizer_config.json, else lower-case)."""
