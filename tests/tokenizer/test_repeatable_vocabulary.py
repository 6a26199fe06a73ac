"""`bertkit tokenizer train` is repeatable (issue 40): the same corpus and settings give a byte-identical
vocab.txt in every run and at any thread count, so data built with a rebuilt vocabulary is the same data.
The trainer's own order changed from run to run (huggingface/tokenizers#1794), and where its merges tied (400
lines of the bundled King James Bible: 4 different vocabularies in 5 runs before the fix) it learned other
pieces: the alphabet and its `##` pieces are now fixed before training, so every tie goes the same way."""

from __future__ import annotations

import gzip
import hashlib
import os
import subprocess
import sys
from pathlib import Path

from bertkit.assets import kjv_path
from bertkit.data.pretraining import build_pretraining_data
from bertkit.settings import InstanceSettings, PretrainingDataSettings
from bertkit.tokenizer import SPECIAL_TOKENS
from bertkit.tokenizer.engine import bert_normalizer
from bertkit.tokenizer.training import _alphabet


def _kjv_lines(path: Path, count: int) -> Path:
    with gzip.open(kjv_path("corpus.txt.gz"), "rt", encoding="utf-8") as source:
        path.write_text("".join(line for _, line in zip(range(count), source)), encoding="utf-8")
    return path


def _train(corpus: Path, out: Path, threads: int, *extra: str) -> bytes:
    done = subprocess.run([sys.executable, "-m", "bertkit.cli", "tokenizer", "train", "--input", str(corpus),
                           "--vocab-size", "1000", *extra, "--output", str(out), "--threads",
                           str(threads), "--no-progress"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "RAYON_NUM_THREADS": str(threads)})
    assert done.returncode == 0, done.stderr[-2000:]
    return (out / "vocab.txt").read_bytes()


def test_three_runs_and_two_thread_counts_write_the_same_vocabulary(tmp_path):
    corpus = _kjv_lines(tmp_path / "kjv.txt", 3000)
    runs = [_train(corpus, tmp_path / f"v{i}", threads) for i, threads in enumerate((1, 2, 2))]
    assert runs[0] == runs[1] == runs[2]
    tokens = runs[0].decode().split("\n")[:-1]
    assert tokens[:len(SPECIAL_TOKENS)] == list(SPECIAL_TOKENS)
    alphabet = [t for t in tokens if len(t) == 1]
    assert alphabet == sorted(alphabet) and tokens[len(SPECIAL_TOKENS):len(SPECIAL_TOKENS) + len(alphabet)] == alphabet

    shards = []
    for run in ("v0", "v1"):
        out = tmp_path / f"data-{run}"
        build_pretraining_data(PretrainingDataSettings(
            (str(corpus),), str(tmp_path / run), str(out), workers=1, quiet=True,
            instances=InstanceSettings(max_seq_length=32, dupe_factor=1)))
        shards.append({p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out.iterdir())})
    assert shards[0] == shards[1]


def test_where_the_trainers_merges_tie_every_run_learns_the_same_pieces(tmp_path):
    """Each run is a new process (the trainer's hash maps are seeded per process); on main these 400 lines gave
    4 different vocabularies in 5 runs, differing in 1-6 pieces."""
    corpus = _kjv_lines(tmp_path / "kjv400.txt", 400)
    runs = {_train(corpus, tmp_path / f"v{i}", threads) for i, threads in enumerate((1, 2, 2, 2))}
    assert len(runs) == 1
    ties = {_train(corpus, tmp_path / f"m{i}", 2, "--min-frequency", "1", "--vocab-size", "600") for i in range(3)}
    assert len(ties) == 1


def test_the_alphabet_breaks_ties_by_code_point_and_continues_only_words():
    lines = iter(["ab ba cd, dc!", "zy yz"])  # a b c d y z twice each; ',' and '!' once, never inside a word
    characters, continuing = _alphabet(lines, bert_normalizer(True), 4)
    assert characters == ["a", "b", "c", "d"]  # six tie at 2: the first four by code point, in every run
    assert continuing == ["a", "b", "c", "d"]
    characters, continuing = _alphabet(iter(["x.y x-y"]), bert_normalizer(True), 10)
    assert characters == ["-", ".", "x", "y"] and continuing == []  # punctuation splits words, as the trainer's
