"""`bertkit data ...`: build training data from text. Flag parsing only; the work is in bertkit.data.

Design decision: flag names are the original create_pretraining_data.py flags in kebab case
(`--max-seq-length`, `--masked-lm-prob`, `--max-predictions-per-seq`, `--dupe-factor`,
`--short-seq-prob`, `--whole-word-masking`), with the original's defaults.
"""

from __future__ import annotations

import click


@click.group(context_settings={"show_default": True})
def data() -> None:
    """Build training data from text."""


@data.command("pretraining")
@click.option("--input", "inputs", multiple=True, required=True,
              help="Text file(s) (one sentence per line, blank line between documents), .gz, or .jsonl with a "
                   "'text' field; repeat the flag or use glob patterns (quote them).")
@click.option("--tokenizer", required=True, help="Tokenizer directory (vocab.txt) from `bertkit tokenizer train`.")
@click.option("--output", required=True, help="Output directory for shards and manifest.json.")
@click.option("--max-seq-length", default=128, help="Longest instance in tokens, [CLS] and [SEP]s included.")
@click.option("--masked-lm-prob", default=0.15, help="Fraction of each instance's tokens to predict.")
@click.option("--max-predictions-per-seq", default=20, help="Most predicted tokens per instance.")
@click.option("--dupe-factor", type=int, default=None,
              help="Passes over the corpus with different pairs and masks. [default: 10 with static masking, "
                   "1 with dynamic]")
@click.option("--short-seq-prob", default=0.1, help="Probability of a shorter target length for a document.")
@click.option("--whole-word-masking", is_flag=True, help="Mask all WordPiece pieces of a word together.")
@click.option("--masking", type=click.Choice(["static", "dynamic"]), default="static",
              help="static: masks stored in the shards; dynamic: unmasked instances stored once, masked by the "
                   "training loader from (seed, epoch, index).")
@click.option("--seed", default=12345, help="Random seed; same seed and inputs give byte-identical shards.")
@click.option("--workers", type=int, default=None, help="Worker processes. [default: all cores]")
@click.option("--split-sentences", is_flag=True, help="Split each line into sentences (pysbd) first.")
@click.option("--strict", is_flag=True, help="Fail on invalid UTF-8, binary files or bad JSONL lines instead of "
                                             "replacing/skipping and counting them.")
@click.option("--rng", type=click.Choice(["numpy", "python"]), default="numpy",
              help="numpy: pair rules and masking vectorised per block (fast); python: the original script's "
                   "per-document draws and order (about 10x slower).")
@click.option("--shuffle-buffer-mb", default=4.0,
              help="MiB of text per block: the pool random-next sentences come from, and the shuffle window.")
@click.option("--shard-size-mb", default=64.0, help="Approximate size of each shard's token ids (MiB).")
@click.option("--overwrite", is_flag=True, help="Replace existing data in --output.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def pretraining(inputs, tokenizer, output, max_seq_length, masked_lm_prob, max_predictions_per_seq, dupe_factor,
                short_seq_prob, whole_word_masking, masking, seed, workers, split_sentences, strict, rng,
                shuffle_buffer_mb, shard_size_mb, overwrite, quiet) -> None:
    """Create masked-LM + next-sentence instances from text (Google's rules), as memory-mapped shards."""
    from bertkit.data.pretraining import PretrainingDataOptions, build_pretraining_data, format_summary
    from bertkit.data.shards import ids_dtype
    from bertkit.tokenizer import WordPieceTokenizer

    tok = WordPieceTokenizer.from_pretrained(tokenizer)
    options = PretrainingDataOptions(
        max_seq_length=max_seq_length, masked_lm_prob=masked_lm_prob, max_predictions_per_seq=max_predictions_per_seq,
        dupe_factor=dupe_factor if dupe_factor is not None else (10 if masking == "static" else 1),
        short_seq_prob=short_seq_prob, whole_word_masking=whole_word_masking, masking=masking, seed=seed,
        split_sentences=split_sentences, rng=rng, shuffle_buffer_mb=shuffle_buffer_mb)
    max_shard_tokens = max(1, int(shard_size_mb * 2**20) // ids_dtype(tok.vocab_size).itemsize)
    manifest = build_pretraining_data(list(inputs), tok, output, options, workers=workers, strict=strict,
                                      overwrite=overwrite, progress=not quiet, max_shard_tokens=max_shard_tokens)
    click.echo(f"wrote {manifest['num_instances']:,} instances to {output}")
    click.echo(format_summary(manifest))
