"""`bertkit tokenizer`: train a WordPiece vocabulary, or show how a vocabulary encodes a text.

Design decision: flags only; the work is `bertkit.tokenizer.WordPieceTokenizer`. `--input` takes
several paths after one flag (`--input corpus/*.txt` as the shell expands it) as well as repeated
flags, so both spellings users know from other tools work.
"""

from __future__ import annotations

import logging
from pathlib import Path

import click

from bertkit.errors import BertkitError


@click.group(context_settings={"show_default": True})
def tokenizer() -> None:
    """Train or inspect a WordPiece vocabulary."""


@tokenizer.command()
@click.option("--input", "inputs", multiple=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Text file(s) to learn from, plain or .gz; several may follow one --input.")
@click.argument("more_inputs", nargs=-1, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--vocab-size", type=int, default=30522, help="Target vocabulary size, specials included.")
@click.option("--output", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Directory to write vocab.txt and tokenizer_config.json to.")
@click.option("--cased", is_flag=True, default=False,
              help="Keep case and accents (default: lower-case and strip accents, like BERT uncased).")
@click.option("--min-frequency", type=int, default=2, help="Least count for a merged piece to enter the vocabulary.")
@click.option("--limit-alphabet", type=int, default=1000,
              help="Most distinct characters kept as base pieces (at most (--vocab-size - 5) / 2).")
@click.option("--progress/--no-progress", default=True, help="Show the trainer's progress bar.")
@click.option("--strict", is_flag=True, help="Fail on invalid UTF-8, binary or corrupt gzip files instead of "
                                             "replacing/skipping and counting them.")
def train(
    inputs: tuple[Path, ...], more_inputs: tuple[Path, ...], vocab_size: int, output: Path, cased: bool,
    min_frequency: int, limit_alphabet: int, progress: bool, strict: bool,
) -> None:
    """Learn a WordPiece vocabulary from text files ([PAD], [UNK], [CLS], [SEP], [MASK] get ids 0-4).

    Files are read as `bertkit data pretraining` reads them: lines over 1,000,000 bytes are cut, binary
    files skipped, invalid UTF-8 replaced, each counted and reported; words over 100 characters are
    left out (they encode as [UNK]).
    """
    from bertkit.tokenizer import WordPieceTokenizer

    files = list(inputs) + list(more_inputs)
    if not files:
        raise BertkitError("no input files; pass them with --input FILE [FILE ...]")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    tok = WordPieceTokenizer.train(
        files, vocab_size=vocab_size, do_lower_case=not cased, min_frequency=min_frequency,
        limit_alphabet=limit_alphabet, show_progress=progress, strict=strict,
    )
    tok.save_pretrained(output)
    click.echo(f"wrote {output / 'vocab.txt'}: {tok.vocab_size} tokens "
               f"({'cased' if cased else 'uncased'}, sha256 {tok.vocab_hash[:12]})")


@tokenizer.command()
@click.argument("text")
@click.option("--tokenizer", "tokenizer_path", required=True, type=click.Path(exists=True, path_type=Path),
              help="Directory holding vocab.txt (or the vocab.txt file).")
@click.option("--pair", default=None, help="Second text of a pair (segment B).")
@click.option("--max-length", type=int, default=None, help="Truncate to this many tokens, specials included.")
@click.option("--lower-case/--cased", "do_lower_case", default=None,
              help="Override do_lower_case (default: from tokenizer_config.json, else lower-case).")
def encode(text: str, tokenizer_path: Path, pair: str | None, max_length: int | None,
           do_lower_case: bool | None) -> None:
    """Show the tokens, ids, segments and character spans of TEXT."""
    from bertkit.tokenizer import WordPieceTokenizer

    tok = WordPieceTokenizer.from_pretrained(tokenizer_path, do_lower_case=do_lower_case)
    enc = tok.encode(text, pair, max_length=max_length)
    sources = (text, pair)
    click.echo(f"{'id':>7}  {'type':>4}  {'span':>11}  {'token':<20} original")
    for i, token in enumerate(enc.tokens):
        seq = enc.sequence_ids[i]
        start, end = enc.offsets[i]
        original = "" if seq is None else sources[seq][start:end]
        click.echo(f"{enc.input_ids[i]:>7}  {enc.token_type_ids[i]:>4}  {f'{start}:{end}':>11}  {token:<20} {original}")
