"""Tokenization throughput: bertkit's WordPieceTokenizer vs transformers' BertTokenizerFast.

Both tokenize the same lines of real text with the same vocab.txt, in one process, alternating
(bertkit, transformers, bertkit, ...) so drift in machine load hits both; the table gives the
median texts/s and MB/s (UTF-8 input bytes) of each and the ratio. Three workloads: ids only (what
data creation uses: `encode_ids` vs `tok(texts, add_special_tokens=False)["input_ids"]`), model
inputs truncated to --max-length (`encode_batch` vs `tok(texts, truncation=True, max_length=...)`,
reading input_ids, token_type_ids and attention_mask), and the same for pairs of consecutive lines
(what sentence-pair fine-tuning uses; texts/s counts pairs, MB/s both texts). The outputs are checked
equal before timing (pairs where neither tokenizer truncates: bertkit truncates pairs by Google's
rule, transformers by the Rust library's, which differ on ties).

A third contender, "no chunk path", is bertkit with its ASCII chunk path (`bertkit.tokenizer.chunks`)
turned off, so every text takes the Rust pipeline: its row says what that fast path buys here, in the
same run ("chunk gain" = its time over bertkit's); the path is kept only while that pays.

Design decision: any UTF-8 text file works as --corpus. docs/tokenizer.md reports the King James
Bible that bertkit bundles (public domain), written out to a file:

    python -c "import gzip; from bertkit.assets import kjv_path; \
               open('/tmp/kjv.txt', 'w').write(gzip.open(kjv_path('corpus.txt.gz'), 'rt').read())"
    RAYON_RS_NUM_CPUS=1 python benchmarks/tokenization.py --corpus /tmp/kjv.txt
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import platform
import re
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import tokenizers
import transformers

from bertkit.runtime import report
from bertkit.tokenizer import WordPieceTokenizer

DEFAULT_VOCAB = Path(__file__).resolve().parent.parent / "tests" / "assets" / "vocab" / "bert-base-uncased"
# Verse labels such as "Ge1:1 " that the bible(1) tool prints before each verse.
VERSE_LABEL = re.compile(r"^\S+\d+:\d+\s+")


def read_lines(path: Path, limit: int) -> list[str]:
    lines = [VERSE_LABEL.sub("", line).strip() for line in path.read_text(encoding="utf-8").splitlines()]
    lines = [line for line in lines if line]
    return lines[:limit] if limit else lines


def batches(lines: list[str], size: int) -> list[list[str]]:
    return [lines[i : i + size] for i in range(0, len(lines), size)]


def time_once(fn: Callable[[list[str]], object], chunks: list[list[str]]) -> float:
    start = time.perf_counter()
    for chunk in chunks:
        fn(chunk)
    return time.perf_counter() - start


def compare(name: str, contenders: dict[str, Callable], chunks: list[list[str]], repeats: int,
            n_texts: int, n_bytes: int) -> None:
    """Time each contender `repeats` times, in turn; print texts/s, MB/s and the ratios of the medians."""
    seconds: dict[str, list[float]] = {who: [] for who in contenders}
    for _ in range(repeats):
        for who, fn in contenders.items():
            seconds[who].append(time_once(fn, chunks))
    median = {who: statistics.median(s) for who, s in seconds.items()}
    for who, s in median.items():
        print(f"| {name:<22} | {who:<15} | {n_texts / s:>10,.0f} | {n_bytes / s / 1e6:>6.2f} |")
    rows = {"ratio": median["transformers"] / median["bertkit"],
            "ratio, no chunk": median["transformers"] / median["no chunk path"],
            "chunk gain": median["no chunk path"] / median["bertkit"]}
    for label, ratio in rows.items():
        print(f"| {name:<22} | {label:<15} | {ratio:>9.2f}x |        |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, required=True, help="UTF-8 text file, one text per line.")
    parser.add_argument("--vocab", type=Path, default=DEFAULT_VOCAB, help="Directory holding vocab.txt.")
    parser.add_argument("--cased", action="store_true", help="Cased tokenization (default uncased).")
    parser.add_argument("--lines", type=int, default=0, help="Use only the first N lines (0 = all).")
    parser.add_argument("--batch-size", type=int, default=1000, help="Texts per call.")
    parser.add_argument("--max-length", type=int, default=128, help="Truncation length of the model-input workload.")
    parser.add_argument("--repeats", type=int, default=5, help="Timed passes per tokenizer (median reported).")
    args = parser.parse_args()

    lines = read_lines(args.corpus, args.lines)
    chunks = batches(lines, args.batch_size)
    n_bytes = sum(len(line.encode("utf-8")) for line in lines)
    ours = WordPieceTokenizer.from_pretrained(args.vocab, do_lower_case=not args.cased)
    no_chunks = WordPieceTokenizer.from_pretrained(args.vocab, do_lower_case=not args.cased)
    no_chunks._engine.chunk_path_min_chars = math.inf  # every text takes the Rust pipeline
    theirs = transformers.BertTokenizerFast(vocab=str(args.vocab / "vocab.txt"), do_lower_case=not args.cased)

    def ids(tok):
        return tok.encode_ids

    def theirs_ids(texts):
        return theirs(texts, add_special_tokens=False)["input_ids"]

    def inputs(tok):
        return lambda texts: [(e.input_ids, e.token_type_ids, e.attention_mask)
                              for e in tok.encode_batch(texts, max_length=args.max_length)]

    def theirs_inputs(texts):
        out = theirs(texts, truncation=True, max_length=args.max_length)
        return list(zip(out["input_ids"], out["token_type_ids"], out["attention_mask"]))

    def pairs(tok):
        return lambda texts: [(e.input_ids, e.token_type_ids, e.attention_mask)
                              for e in tok.encode_batch(texts[:-1], texts[1:], max_length=args.max_length)]

    def theirs_pairs(texts):
        out = theirs(texts[:-1], texts[1:], truncation=True, max_length=args.max_length)
        return list(zip(out["input_ids"], out["token_type_ids"], out["attention_mask"]))

    sample = chunks[0]
    for tok in (ours, no_chunks):
        assert ids(tok)(sample) == theirs_ids(sample), "ids differ: not the same vocabulary or rules"
        assert inputs(tok)(sample) == theirs_inputs(sample), "model inputs differ"
        untruncated = [len(e) <= args.max_length for e in tok.encode_batch(sample[:-1], sample[1:])]
        assert ([x for x, fits in zip(pairs(tok)(sample), untruncated) if fits]
                == [x for x, fits in zip(theirs_pairs(sample), untruncated) if fits]), "pair inputs differ"

    print(f"corpus {args.corpus.name}: {len(lines):,} lines, {n_bytes / 1e6:.1f} MB; batch {args.batch_size}; "
          f"median of {args.repeats}")
    print(report.header())
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"RAYON_RS_NUM_CPUS={os.environ.get('RAYON_RS_NUM_CPUS', 'unset')}; Python {platform.python_version()}, "
          f"tokenizers {tokenizers.__version__}, transformers {transformers.__version__}")
    print("| workload               | tokenizer       |    texts/s |   MB/s |")
    print("|------------------------|-----------------|------------|--------|")
    compare("ids only", {"bertkit": ids(ours), "no chunk path": ids(no_chunks), "transformers": theirs_ids},
            chunks, args.repeats, len(lines), n_bytes)
    compare(f"model inputs (max {args.max_length})",
            {"bertkit": inputs(ours), "no chunk path": inputs(no_chunks), "transformers": theirs_inputs},
            chunks, args.repeats, len(lines), n_bytes)
    pair_bytes = sum(len(a.encode("utf-8")) + len(b.encode("utf-8")) for c in chunks for a, b in itertools.pairwise(c))
    compare(f"pairs (max {args.max_length})",
            {"bertkit": pairs(ours), "no chunk path": pairs(no_chunks), "transformers": theirs_pairs},
            chunks, args.repeats, sum(len(c) - 1 for c in chunks), pair_bytes)


if __name__ == "__main__":
    main()
