"""End to end: text files -> `build_pretraining_data` / `bertkit data pretraining` -> `PretrainingDataset`.

A tiny WordPiece vocabulary is trained inline with the real tokenizer. Covers the item format, the
collate, reproducibility (byte-identical re-runs, independent of --workers), dynamic masking per
epoch, NSP balance, the manifest and summary, atomic output, and the CLI.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from bertkit.cli import main
from bertkit.data import (
    InstanceSettings,
    PretrainingDataset,
    PretrainingDataSettings,
    build_pretraining_data,
    collate_pretraining,
)
from bertkit.data import shards as shards_module
from bertkit.errors import BertkitError
from bertkit.tokenizer import WordPieceTokenizer

WORDS = ("the of and to in is was for that with as on by at from his her they which this be are it an not or "
         "have had one but all were we when there can been has more if no out so said what up its about into "
         "than them only other new some time could these two may first then do any like my now over such our "
         "man me even most made after also did many before must through back years where much your way well "
         "unbelievable wonderfully extraordinary reconsideration").split()


def write_corpus(path: Path, n_documents: int, seed: int = 0, max_sentences: int = 15) -> Path:
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(n_documents):
            for _ in range(rng.randint(1, max_sentences)):
                f.write(" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 25))).capitalize() + ".\n")
            f.write("\n")
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus") / "corpus.txt", 80)


@pytest.fixture(scope="module")
def tokenizer(corpus, tmp_path_factory) -> WordPieceTokenizer:
    tok = WordPieceTokenizer.train([corpus], vocab_size=200, min_frequency=1)
    tok.save_pretrained(tmp_path_factory.mktemp("tok"))
    return tok


def build(inputs, tokenizer, output, workers=1, **options):
    options.setdefault("shuffle_buffer_mb", 0.004)  # several blocks even for a tiny corpus
    options.setdefault("masking", "static")  # Google's pipeline, masks in the shards (the default is dynamic)
    return build_pretraining_data(PretrainingDataSettings(
        tuple(map(str, inputs)), "(in memory)", str(output), workers=workers, quiet=True,
        shard_size_mb=20_000 * 2 / 2**20, instances=InstanceSettings(**options)), tokenizer)  # 20,000 uint16 ids


def shard_bytes(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.glob("shard-*.bin"))}


def test_items_and_collate(corpus, tokenizer, tmp_path):
    manifest = build([corpus], tokenizer, tmp_path / "out", dupe_factor=2, max_seq_length=64)
    ds = PretrainingDataset(tmp_path / "out")
    assert len(ds) == manifest["num_instances"] == manifest["summary"]["instances"] > 100
    assert len(manifest["shards"]) > 1 and ds.vocab_hash == tokenizer.vocab_hash
    assert manifest["ids_dtype"] == "uint16"
    for i in range(0, len(ds), 7):
        item = ds[i]
        ids, types, labels = item["input_ids"], item["token_type_ids"], item["mlm_labels"]
        assert all(t.dtype == torch.int64 for t in item.values()) and item["nsp_labels"].dim() == 0
        assert ids.dim() == 1 and len(ids) <= 64 and len(types) == len(ids) == len(item["attention_mask"])
        assert ids[0] == tokenizer.cls_token_id and ids[-1] == tokenizer.sep_token_id
        a_length = int((types == 0).sum())
        assert ids[a_length - 1] == tokenizer.sep_token_id and (types[a_length:] == 1).all()
        # The specials' places are never predicted (a random replacement may itself be the [SEP] id).
        assert (labels != -100).sum() >= 1 and (labels[[0, a_length - 1, len(ids) - 1]] == -100).all()
    batch = collate_pretraining([ds[0], ds[1], ds[2]], pad_token_id=tokenizer.pad_token_id)
    longest = max(len(ds[i]["input_ids"]) for i in range(3))
    assert batch["input_ids"].shape == (3, longest) and batch["nsp_labels"].shape == (3,)
    for row in range(3):
        n = len(ds[row]["input_ids"])
        assert (batch["attention_mask"][row, n:] == 0).all() and (batch["mlm_labels"][row, n:] == -100).all()
        assert (batch["input_ids"][row, n:] == tokenizer.pad_token_id).all()
        assert torch.equal(batch["mlm_labels"][row, :n], ds[row]["mlm_labels"])


def test_byte_identical_reruns_and_independent_of_workers(corpus, tokenizer, tmp_path):
    build([corpus], tokenizer, tmp_path / "a", workers=1, dupe_factor=2)
    build([corpus], tokenizer, tmp_path / "b", workers=1, dupe_factor=2)
    build([corpus], tokenizer, tmp_path / "c", workers=2, dupe_factor=2)
    a, b, c = (shard_bytes(tmp_path / d) for d in "abc")
    assert len(a) > 1 and a == b == c
    manifests = [json.loads((tmp_path / d / "manifest.json").read_text()) for d in "abc"]
    assert manifests[0] == manifests[1] == manifests[2]
    build([corpus], tokenizer, tmp_path / "d", workers=1, dupe_factor=2, seed=1)
    assert shard_bytes(tmp_path / "d") != a


def test_python_rng_mode_reproducible_across_workers(corpus, tokenizer, tmp_path):
    build([corpus], tokenizer, tmp_path / "a", workers=1, dupe_factor=1, rng="python", whole_word_masking=True)
    build([corpus], tokenizer, tmp_path / "b", workers=2, dupe_factor=1, rng="python", whole_word_masking=True)
    assert shard_bytes(tmp_path / "a") == shard_bytes(tmp_path / "b")
    assert 0.12 < json.loads((tmp_path / "a" / "manifest.json").read_text())["summary"]["masked_fraction"] < 0.16


def test_numpy_mode_whole_word_masking_in_shards(corpus, tokenizer, tmp_path):
    build([corpus], tokenizer, tmp_path / "ww", dupe_factor=2, whole_word_masking=True)
    ds = PretrainingDataset(tmp_path / "ww")
    tokens = tokenizer.convert_ids_to_tokens(list(range(tokenizer.vocab_size)))
    continuation = np.array([t.startswith("##") for t in tokens])
    joined = 0
    for i in range(len(ds)):
        item = ds[i]
        labels, a_length = item["mlm_labels"].numpy(), int((item["token_type_ids"] == 0).sum())
        original = np.where(labels != -100, labels, item["input_ids"].numpy())
        predicted = labels != -100
        # Not after [CLS] or [SEP] (a piece there starts a word, or joins one across [SEP]).
        inner = np.setdiff1d(np.arange(2, len(original)), [a_length - 1, a_length, len(original) - 1])
        piece = inner[continuation[original[inner]]]  # '##' pieces whose previous position is a word piece
        assert (predicted[piece] == predicted[piece - 1]).all()  # a word is predicted whole or not at all
        joined += int(predicted[piece].sum())
    assert joined > 20


def test_dynamic_masking_by_epoch(corpus, tokenizer, tmp_path):
    manifest = build([corpus], tokenizer, tmp_path / "dyn", masking="dynamic", dupe_factor=1, whole_word_masking=True)
    assert "mlm_positions" not in manifest["shards"][0]["arrays"]
    ds, again = PretrainingDataset(tmp_path / "dyn"), PretrainingDataset(tmp_path / "dyn")
    first = [ds[i] for i in range(40)]
    assert all(torch.equal(x["input_ids"], again[i]["input_ids"]) for i, x in enumerate(first))
    ds.set_epoch(1)
    second = [ds[i] for i in range(40)]
    assert sum(not torch.equal(x["mlm_labels"], y["mlm_labels"]) for x, y in zip(first, second)) > 30
    for x, y in zip(first, second):  # same instance, different masks
        unmasked_x = torch.where(x["mlm_labels"] != -100, x["mlm_labels"], x["input_ids"])
        unmasked_y = torch.where(y["mlm_labels"] != -100, y["mlm_labels"], y["input_ids"])
        assert torch.equal(unmasked_x, unmasked_y)
    masked = sum(int((x["mlm_labels"] != -100).sum()) for x in second)
    tokens = sum(len(x["input_ids"]) for x in second)
    assert 0.10 < masked / tokens < 0.16


def test_nsp_balance_and_lengths(tmp_path, tokenizer):
    # Long documents of short sentences: one-sentence chunks (always random) are rare, so ~50/50.
    corpus = write_corpus(tmp_path / "long.txt", 60, seed=5, max_sentences=60)
    manifest = build([corpus], tokenizer, tmp_path / "out", dupe_factor=3, max_seq_length=128, shuffle_buffer_mb=1)
    s = manifest["summary"]
    assert s["instances"] > 500
    assert abs(s["random_next_fraction"] - 0.5) < 4 * np.sqrt(0.25 / s["instances"]) + 0.03
    assert 0.14 < s["masked_fraction"] < 0.16
    ds = PretrainingDataset(tmp_path / "out")
    lengths = np.array([len(ds[i]["input_ids"]) for i in range(len(ds))])
    assert lengths.max() <= 128 and (lengths < 100).mean() > 0.05  # short_seq_prob makes some short


def test_killed_run_leaves_no_usable_half(corpus, tokenizer, tmp_path, monkeypatch):
    build([corpus], tokenizer, tmp_path / "out", dupe_factor=1)
    calls = {"n": 0}
    original_add = shards_module.ShardWriter.add

    def dying_add(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return original_add(self, *args, **kwargs)

    monkeypatch.setattr(shards_module.ShardWriter, "add", dying_add)
    with pytest.raises(KeyboardInterrupt):
        build([corpus], tokenizer, tmp_path / "out2", dupe_factor=1)
    assert not list((tmp_path / "out2").glob(".*tmp"))  # no temp files left behind
    with pytest.raises(BertkitError, match="no manifest.json"):
        PretrainingDataset(tmp_path / "out2")
    with pytest.raises(BertkitError, match="--overwrite"):
        build([corpus], tokenizer, tmp_path / "out", dupe_factor=1)


def test_damaged_shard_is_refused(corpus, tokenizer, tmp_path):
    manifest = build([corpus], tokenizer, tmp_path / "out", dupe_factor=1)
    shard = tmp_path / "out" / manifest["shards"][0]["file"]
    data = bytearray(shard.read_bytes())
    data[10] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(BertkitError, match="sha256"):
        PretrainingDataset(tmp_path / "out").verify()
    shard.write_bytes(bytes(data[:-8]))
    with pytest.raises(BertkitError, match="damaged"):
        PretrainingDataset(tmp_path / "out")


def test_cli(corpus, tokenizer, tmp_path, capsys):
    tok_dir = tmp_path / "tok"
    tokenizer.save_pretrained(tok_dir)
    out = tmp_path / "out"
    code = main(["data", "pretraining", "--input", str(corpus), "--tokenizer", str(tok_dir), "--output", str(out),
                 "--max-seq-length", "64", "--dupe-factor", "2", "--workers", "1", "--quiet", "--seed", "3"])
    printed = capsys.readouterr().out
    assert code == 0 and "instances" in printed and "NSP random next" in printed and "[UNK] rate" in printed
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["options"]["max_seq_length"] == 64 and manifest["options"]["seed"] == 3
    assert manifest["options"]["dupe_factor"] == 2 and manifest["tokenizer"]["vocab_hash"] == tokenizer.vocab_hash
    code = main(["data", "pretraining", "--input", str(tmp_path / "missing*.txt"), "--tokenizer", str(tok_dir),
                 "--output", str(tmp_path / "o2")])
    assert code == 2 and "no file matches" in capsys.readouterr().err


def test_cli_help_lists_original_flags(capsys):
    assert main(["data", "pretraining", "--help"]) == 0
    text = capsys.readouterr().out
    for flag in ("--max-seq-length", "--masked-lm-prob", "--max-predictions-per-seq", "--dupe-factor",
                 "--short-seq-prob", "--whole-word-masking", "--masking", "--seed", "--workers",
                 "--split-sentences", "--strict", "default: 128", "default: 0.15", "default: 12345"):
        assert flag in text
