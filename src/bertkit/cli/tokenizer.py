"""`bertkit tokenizer`: train a WordPiece vocabulary, extend a model's with a domain's pieces, or show how a
vocabulary encodes a text.

Design decision: flags only; the work is `bertkit.tokenizer` (`train_tokenizer`, `WordPieceTokenizer`) and
`bertkit.workflows.adapt`. The flags are generated (bertkit.cli.options) from `TokenizerTrainSettings`,
`TokenizerExtendSettings` and `TokenizerEncodeSettings` (bertkit.settings, torch-free: `--help` answers at
once). `--input` and `--corpus` take several paths after one flag (`--input corpus/*.txt` as the shell expands
it: the paths after the first are the command's arguments) as well as repeated flags, so both spellings users
know from other tools work.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import click

from bertkit.cli.options import settings_from_flags, settings_options
from bertkit.settings import TokenizerEncodeSettings, TokenizerExtendSettings, TokenizerTrainSettings


@click.group(context_settings={"show_default": True})
def tokenizer() -> None:
    """Train or inspect a WordPiece vocabulary."""


@tokenizer.command()
@settings_options(TokenizerTrainSettings)
@click.argument("more_inputs", nargs=-1, type=click.Path(path_type=Path))
def train(more_inputs: tuple[Path, ...], **flags: Any) -> None:
    """Learn a WordPiece vocabulary from text files ([PAD], [UNK], [CLS], [SEP], [MASK] get ids 0-4).

    Files are read as `bertkit data pretraining` reads them: text or .jsonl (the --text-column field
    only), plain, .gz or .zst, Parquet or `datasets` directories (the --text-column column), directories
    and glob patterns expanded; lines over 1,000,000 bytes are cut, binary files skipped, invalid
    UTF-8 replaced, each counted and reported; words over 100 characters are left out (they encode as
    [UNK]).
    """
    from bertkit.tokenizer import train_tokenizer

    flags["inputs"] = (*flags["inputs"], *more_inputs)
    settings = settings_from_flags(TokenizerTrainSettings, flags)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    tok = train_tokenizer(settings)
    click.echo(f"wrote {settings.output / 'vocab.txt'}: {tok.vocab_size} tokens "
               f"({'cased' if settings.vocabulary.cased else 'uncased'}, sha256 {tok.vocab_hash[:12]})")


@tokenizer.command()
@settings_options(TokenizerExtendSettings)
@click.argument("more_corpus", nargs=-1, type=click.Path(path_type=Path))
def extend(more_corpus: tuple[Path, ...], **flags: Any) -> None:
    """Add the --add most useful WordPieces of a domain corpus to a model's vocabulary (existing ids unchanged,
    new ones appended) and write the model with its embeddings, MLM decoder and bias resized to --output.

    Candidates are the corpus's words and the pieces of a vocabulary trained on it that the model lacks,
    ranked by the tokens each saves on the corpus; new rows are the mean of the rows of the pieces the old
    vocabulary split them into (--init random to compare). Prints tokens per word before and after and
    writes them to OUTPUT/vocabulary_extension.json. A sentence-transformers directory stays one.
    """
    from bertkit.workflows.adapt import REPORT_FILE, extend_model

    flags["corpus"] = (*flags["corpus"], *more_corpus)
    settings = settings_from_flags(TokenizerExtendSettings, flags)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    report = extend_model(settings)
    shown = ", ".join(p["token"] for p in report["pieces"][:12])
    click.echo(f"added {report['added']} pieces (ids {report['first_new_id']}-{report['vocab_size'] - 1}, "
               f"--init {report['init']}): {shown}{' ...' if report['added'] > 12 else ''}")
    click.echo(f"tokens per word on the corpus: {report['tokens_per_word_before']:.3f} -> "
               f"{report['tokens_per_word_after']:.3f} ({report['tokens_before']:,} -> {report['tokens_after']:,} "
               f"tokens, {report['words']:,} words)")
    click.echo(f"wrote {settings.output} ({REPORT_FILE}: every piece and what it saves)")


@tokenizer.command()
@click.argument("text")
@settings_options(TokenizerEncodeSettings)
def encode(text: str, **flags: Any) -> None:
    """Show the tokens, ids, segments and character spans of TEXT."""
    from bertkit.tokenizer import WordPieceTokenizer

    settings = settings_from_flags(TokenizerEncodeSettings, flags)
    tok = WordPieceTokenizer.from_pretrained(settings.tokenizer, do_lower_case=settings.do_lower_case)
    enc = tok.encode(text, settings.pair, max_length=settings.max_length)
    sources = (text, settings.pair or "")  # segment B exists only with a pair
    click.echo(f"{'id':>7}  {'type':>4}  {'span':>11}  {'token':<20} original")
    for i, token in enumerate(enc.tokens):
        seq = enc.sequence_ids[i]
        start, end = enc.offsets[i]
        original = "" if seq is None else sources[seq][start:end]
        click.echo(f"{enc.input_ids[i]:>7}  {enc.token_type_ids[i]:>4}  {f'{start}:{end}':>11}  {token:<20} {original}")
