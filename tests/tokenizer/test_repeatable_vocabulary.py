"""`bertkit tokenizer train` is repeatable (issue 40): the same corpus and settings give a byte-identical
vocab.txt in every run and at any thread count, so data built with a rebuilt vocabulary is the same data.
The trainer's own order changed from run to run (huggingface/tokenizers#1794). On real text (here 3,000 lines
of the bundled King James Bible); where the trainer's merges tie (a tiny corpus with --min-frequency 1) the
trainer itself can learn other pieces, which no order fixes (docs/tokenizer.md)."""

from __future__ import annotations

import gzip
import hashlib
import os
import subprocess
import sys
from pathlib import Path

from bertkit.assets import kjv_path
from bertkit.data.pretraining import build_pretraining_data
from bertkit.settings import InstanceSettings
from bertkit.tokenizer import SPECIAL_TOKENS, WordPieceTokenizer


def _train(corpus: Path, out: Path, threads: int) -> bytes:
    done = subprocess.run([sys.executable, "-m", "bertkit.cli", "tokenizer", "train", "--input", str(corpus),
                           "--vocab-size", "1000", "--output", str(out), "--threads",
                           str(threads), "--no-progress"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "RAYON_NUM_THREADS": str(threads)})
    assert done.returncode == 0, done.stderr[-2000:]
    return (out / "vocab.txt").read_bytes()


def test_three_runs_and_two_thread_counts_write_the_same_vocabulary(tmp_path):
    corpus = tmp_path / "kjv.txt"
    with gzip.open(kjv_path("corpus.txt.gz"), "rt", encoding="utf-8") as source:
        corpus.write_text("".join(line for _, line in zip(range(3000), source)), encoding="utf-8")
    runs = [_train(corpus, tmp_path / f"v{i}", threads) for i, threads in enumerate((1, 2, 2))]
    assert runs[0] == runs[1] == runs[2]
    tokens = runs[0].decode().split("\n")[:-1]
    assert tokens[:len(SPECIAL_TOKENS)] == list(SPECIAL_TOKENS)
    alphabet = [t for t in tokens if len(t) == 1]
    assert alphabet == sorted(alphabet) and tokens[len(SPECIAL_TOKENS):len(SPECIAL_TOKENS) + len(alphabet)] == alphabet

    shards = []
    for run in ("v0", "v1"):
        out = tmp_path / f"data-{run}"
        build_pretraining_data([str(corpus)], WordPieceTokenizer.from_pretrained(tmp_path / run), out,
                               InstanceSettings(max_seq_length=32, dupe_factor=1), workers=1, progress=False)
        shards.append({p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out.iterdir())})
    assert shards[0] == shards[1]
