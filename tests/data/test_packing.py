"""Masked-LM-only packing (`bertkit data pretraining --no-nsp`, bertkit.data.packing), issue 24.

The packing rule on hand-made sentence lengths (every token once and in order, lengths, separators,
the fill bound of whole-sentence packing, splits); then the pipeline: the corpus back from the shards,
byte-identical for 1 and 2 workers, static and dynamic masking, the CLI, `bertkit pretrain --no-nsp` on
packed data; and NSP data left byte-identical (a golden hash made before packing existed).
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from bertkit.cli import main
from bertkit.data import InstanceSettings, PretrainingDataset, PretrainingDataSettings, build_pretraining_data
from bertkit.data.packing import CONTIGUOUS, DOC_SENTENCES, FULL_SENTENCES, PackStats, pack_instances
from bertkit.errors import BertkitError
from bertkit.settings import PACKINGS
from bertkit.tokenizer import WordPieceTokenizer

CLS, SEP = 1, 2
ASSETS = Path(__file__).parents[1] / "assets"


def random_block(seed: int, documents: int = 30, longest: int = 40):
    """Flat tokens (ids >= 10, each position's id distinct mod 1000 so order is checkable) of random documents
    of random sentences, some longer than an instance of the tests' lengths."""
    rng = np.random.default_rng(seed)
    per_document = rng.integers(1, 8, documents)
    lengths = rng.integers(1, longest, int(per_document.sum()))
    sentence_offsets = np.concatenate([[0], np.cumsum(lengths)])
    document_offsets = np.concatenate([[0], np.cumsum(per_document)])
    tokens = (10 + np.arange(sentence_offsets[-1]) % 1000).astype(np.uint16)
    return tokens, sentence_offsets, document_offsets


def instances(packed) -> list[np.ndarray]:
    return np.split(packed.ids, np.cumsum(packed.lengths)[:-1])


def test_packing_modes_are_the_settings_choices():
    assert (FULL_SENTENCES, DOC_SENTENCES, CONTIGUOUS) == PACKINGS


def test_full_sentences_layout_by_hand():
    # Documents [[3, 2], [4], [7]] at max_seq_length 8 (room 6): a [SEP] between documents inside an
    # instance, a sentence that does not fit starts the next one, one longer than 6 is split.
    tokens = np.arange(10, 26, dtype=np.uint16)
    stats = PackStats()
    packed = pack_instances(tokens, np.array([0, 3, 5, 9, 16]), np.array([0, 2, 3, 4]), 8, FULL_SENTENCES,
                            CLS, SEP, stats)
    assert [x.tolist() for x in instances(packed)] == [
        [CLS, 10, 11, 12, 13, 14, SEP],
        [CLS, 15, 16, 17, 18, SEP],
        [CLS, 19, 20, 21, 22, 23, 24, SEP],
        [CLS, 25, SEP]]
    assert stats == PackStats(sentences_across_instances=1, document_separators=0)
    packed = pack_instances(tokens, np.array([0, 2, 3, 16]), np.array([0, 1, 2, 3]), 8, FULL_SENTENCES, CLS, SEP,
                            stats := PackStats())
    assert instances(packed)[0].tolist() == [CLS, 10, 11, SEP, 12, SEP]  # two documents, [SEP] between
    assert stats.document_separators == 1


@pytest.mark.parametrize("mode", PACKINGS)
@pytest.mark.parametrize("max_seq_length", [5, 16, 48])
def test_every_token_once_in_order_within_the_length(mode, max_seq_length):
    tokens, sentence_offsets, document_offsets = random_block(max_seq_length)
    stats = PackStats()
    packed = pack_instances(tokens, sentence_offsets, document_offsets, max_seq_length, mode, CLS, SEP, stats)
    rows = instances(packed)
    assert all(len(r) <= max_seq_length and r[0] == CLS and r[-1] == SEP for r in rows)
    bodies = [r[1:-1] for r in rows]
    assert all(len(b) and b[0] != SEP and b[-1] != SEP for b in bodies)  # no empty instance, no stray [SEP]
    stream = np.concatenate(bodies)
    assert np.array_equal(stream[stream != SEP], tokens)  # every token exactly once, in order
    assert int((stream == SEP).sum()) == stats.document_separators
    # Each inner [SEP] stands exactly where a document ends (its next token starts a document).
    document_starts = set(sentence_offsets[document_offsets[:-1]].tolist())
    position_of_next = np.cumsum(stream != SEP)[stream == SEP]  # index in `tokens` of the token after it
    assert set(position_of_next.tolist()) <= document_starts
    if mode == DOC_SENTENCES:
        assert stats.document_separators == 0
    sentence_lengths = np.diff(sentence_offsets)
    if mode != CONTIGUOUS:  # only sentences longer than an instance are split
        assert stats.sentences_across_instances == int((sentence_lengths > max_seq_length - 2).sum())


@pytest.mark.parametrize("seed", range(3))
def test_fill_bounds(seed):
    tokens, sentence_offsets, document_offsets = random_block(seed, documents=60, longest=20)
    longest = int(np.diff(sentence_offsets).max())
    full = pack_instances(tokens, sentence_offsets, document_offsets, 64, FULL_SENTENCES, CLS, SEP, PackStats())
    # An instance is closed only when the next sentence (and maybe a [SEP]) does not fit: the gap is smaller.
    assert (full.lengths[:-1] > 64 - longest - 1).all()
    contiguous = pack_instances(tokens, sentence_offsets, document_offsets, 64, CONTIGUOUS, CLS, SEP, PackStats())
    assert (contiguous.lengths[:-1] >= 63).all()  # full but where a [SEP] would end an instance
    documents = pack_instances(tokens, sentence_offsets, document_offsets, 64, DOC_SENTENCES, CLS, SEP, PackStats())
    assert len(contiguous.lengths) <= len(full.lengths) <= len(documents.lengths)


def test_empty_block_has_no_instance():
    packed = pack_instances(np.zeros(0, np.uint16), np.array([0]), np.array([0]), 16, FULL_SENTENCES, CLS, SEP,
                            PackStats())
    assert len(packed.ids) == len(packed.lengths) == 0


# --- the pipeline ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def corpus(tmp_path_factory, write_toy_corpus) -> Path:
    return write_toy_corpus(tmp_path_factory.mktemp("corpus") / "corpus.txt", documents=120, sentences=(1, 12),
                            words=(3, 30))


@pytest.fixture(scope="module")
def tokenizer(corpus, tmp_path_factory) -> WordPieceTokenizer:
    tok = WordPieceTokenizer.train([corpus], vocab_size=150, min_frequency=1)
    tok.save_pretrained(tmp_path_factory.mktemp("tok"))
    return tok


def build(corpus, tokenizer, output, workers=1, **options):
    options = {"nsp": False, "max_seq_length": 64, "dupe_factor": 1, "masking": "dynamic",
               "shuffle_buffer_mb": 0.004, **options}  # several blocks even for a tiny corpus
    return build_pretraining_data(PretrainingDataSettings(
        (str(corpus),), "(in memory)", str(output), workers=workers, quiet=True, shard_size_mb=4000 * 2 / 2**20,
        instances=InstanceSettings(**options)), tokenizer)  # shards of 4000 uint16 ids


def corpus_documents(corpus: Path, tokenizer) -> list[list[int]]:
    documents = [d.splitlines() for d in corpus.read_text().strip().split("\n\n")]
    return [[t for s in tokenizer.encode_ids(d) for t in s] for d in documents]


def test_shards_hold_the_corpus_in_order(corpus, tokenizer, tmp_path):
    manifest = build(corpus, tokenizer, tmp_path / "out")
    ds = PretrainingDataset(tmp_path / "out")
    assert ds.layout == manifest["options"]["packing"] == "full-sentences" and not ds.nsp
    assert len(manifest["shards"]) > 1 and len(ds) == manifest["num_instances"]
    items = [ds[i] for i in range(len(ds))]
    assert all((x["token_type_ids"] == 0).all() and int(x["nsp_labels"]) == 0 for x in items)
    assert all(len(x["input_ids"]) <= 64 for x in items)
    unmasked = [torch.where(x["mlm_labels"] != -100, x["mlm_labels"], x["input_ids"]).numpy() for x in items]
    stream = np.concatenate([x[1:-1] for x in unmasked])
    documents = corpus_documents(corpus, tokenizer)
    assert stream[stream != tokenizer.sep_token_id].tolist() == [t for d in documents for t in d]
    s = manifest["summary"]
    assert s["truncated_tokens"] == 0 and s["random_next"] == 0 and s["document_separators"] > 20
    assert int((stream == tokenizer.sep_token_id).sum()) == s["document_separators"]
    assert s["instance_tokens"] == s["sentence_tokens"] + s["document_separators"] + 2 * s["instances"]


def test_fill_and_instances_against_nsp_data(corpus, tokenizer, tmp_path):
    # Short documents (1-12 sentences): NSP pairs end with their document, packing crosses it.
    def summary(name, max_seq_length=128, **options):
        return build(corpus, tokenizer, tmp_path / name, max_seq_length=max_seq_length, shuffle_buffer_mb=1,
                     **options)["summary"]

    pairs, full = summary("nsp", nsp=True), summary("full")
    contiguous = summary("contiguous", packing="contiguous")
    assert pairs["fill"] < 0.75 < 0.9 < full["fill"] and contiguous["fill"] > 0.99
    assert contiguous["instances"] <= full["instances"] < pairs["instances"] / 2
    # Sentences short beside the length (RoBERTa's 512 tokens): whole sentences fill it too.
    assert summary("long", max_seq_length=256)["fill"] > 0.95


def test_identical_for_one_and_two_workers(corpus, tokenizer, tmp_path):
    for name, workers in (("a", 1), ("b", 2)):
        build(corpus, tokenizer, tmp_path / name, workers=workers, masking="static", dupe_factor=2,
              packing="contiguous")
    a, b = ({p.name: p.read_bytes() for p in sorted((tmp_path / d).glob("shard-*.bin"))} for d in "ab")
    assert len(a) > 1 and a == b
    assert (json.loads((tmp_path / "a" / "manifest.json").read_text())
            == json.loads((tmp_path / "b" / "manifest.json").read_text()))


def test_static_masking_on_packed_data(corpus, tokenizer, tmp_path):
    build(corpus, tokenizer, tmp_path / "dyn", shuffle_buffer_mb=1)  # one block: pass 0, then pass 1
    manifest = build(corpus, tokenizer, tmp_path / "static", masking="static", dupe_factor=2, whole_word_masking=True,
                     shuffle_buffer_mb=1)
    assert 0.13 < manifest["summary"]["masked_fraction"] < 0.16
    dynamic, static = PretrainingDataset(tmp_path / "dyn"), PretrainingDataset(tmp_path / "static")
    assert len(static) == 2 * len(dynamic)  # each pass packs the same way, with its own masks
    specials = (tokenizer.cls_token_id, tokenizer.sep_token_id)
    different = 0
    for i in range(0, len(dynamic), 5):
        plain = dynamic[i]
        plain_ids = torch.where(plain["mlm_labels"] != -100, plain["mlm_labels"], plain["input_ids"])
        for item in (static[i], static[i + len(dynamic)]):
            labels = item["mlm_labels"]
            assert torch.equal(torch.where(labels != -100, labels, item["input_ids"]), plain_ids)
            assert not np.isin(plain_ids[labels != -100].numpy(), specials).any()  # never [CLS]/[SEP]
        different += not torch.equal(static[i]["mlm_labels"], static[i + len(dynamic)]["mlm_labels"])
    assert different > 0


def test_dynamic_masking_on_packed_data(corpus, tokenizer, tmp_path):
    build(corpus, tokenizer, tmp_path / "dyn")
    ds = PretrainingDataset(tmp_path / "dyn")
    first = [ds[i] for i in range(30)]
    ds.set_epoch(1)
    second = [ds[i] for i in range(30)]
    assert sum(not torch.equal(x["mlm_labels"], y["mlm_labels"]) for x, y in zip(first, second)) > 20
    masked = sum(int((x["mlm_labels"] != -100).sum()) for x in second)
    assert 0.12 < masked / sum(len(x["input_ids"]) for x in second) < 0.16


def test_options_refused(tokenizer, corpus, tmp_path):
    with pytest.raises(BertkitError, match="--packing applies to --no-nsp"):
        build(corpus, tokenizer, tmp_path / "a", nsp=True, packing="contiguous")
    with pytest.raises(BertkitError, match="drop --rng python"):
        build(corpus, tokenizer, tmp_path / "b", rng="python")


def test_cli_no_nsp(corpus, tokenizer, tmp_path, capsys):
    tokenizer.save_pretrained(tmp_path / "tok")
    base = ["data", "pretraining", "--input", str(corpus), "--tokenizer", str(tmp_path / "tok"), "--workers", "1",
            "--quiet", "--max-seq-length", "64"]
    assert main([*base, "--output", str(tmp_path / "out"), "--no-nsp", "--packing", "doc-sentences"]) == 0
    printed = capsys.readouterr().out
    assert "packing          doc-sentences, no NSP" in printed and "NSP random next" not in printed
    options = json.loads((tmp_path / "out" / "manifest.json").read_text())["options"]
    assert options["nsp"] is False and options["packing"] == "doc-sentences" and options["dupe_factor"] == 1
    assert options["masking"] == "dynamic"  # the default: the short recipe chooses its masking rate at load
    assert main([*base, "--output", str(tmp_path / "o2"), "--packing", "contiguous"]) == 2
    assert "--packing applies to --no-nsp data only" in capsys.readouterr().err


def test_pretrain_no_nsp_trains_on_packed_data(corpus, tokenizer, tmp_path):
    tokenizer.save_pretrained(tmp_path / "tok")
    build(corpus, tokenizer, tmp_path / "data", max_seq_length=32)
    assert main(["pretrain", "--data", str(tmp_path / "data"), "--tokenizer", str(tmp_path / "tok"),
                 "--model", "bert-debug", "--output", str(tmp_path / "run"), "--batch-size", "8",
                 "--max-steps", "2", "--eval-examples", "16", "--device", "cpu", "--no-nsp"]) == 0
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"]
    assert [r["step"] for r in train] == [1, 2] and all(np.isfinite(r["mlm_loss"]) for r in train)
    assert "nsp_loss" not in train[0]


def test_pretrain_with_nsp_refuses_packed_data_and_the_recipe_turns_nsp_off(corpus, tokenizer, tmp_path, capsys,
                                                                             caplog):
    tokenizer.save_pretrained(tmp_path / "tok")
    build(corpus, tokenizer, tmp_path / "data", max_seq_length=32)
    base = ["pretrain", "--data", str(tmp_path / "data"), "--tokenizer", str(tmp_path / "tok"), "--model",
            "bert-debug", "--batch-size", "8", "--max-steps", "1", "--eval-examples", "16", "--device", "cpu"]
    assert main([*base, "--output", str(tmp_path / "run"), "--nsp"]) != 0
    assert "has no sentence pairs to learn next sentence prediction from; pass --no-nsp" in capsys.readouterr().err
    with caplog.at_level(logging.INFO, logger="bertkit"):
        # a recipe with NSP (the paper's; the short one has none), NSP not given
        assert main([*base, "--output", str(tmp_path / "auto"), "--recipe", "paper"]) == 0
    assert "masked-LM-only data (full-sentences), so NSP is off" in caplog.text
    evals = [json.loads(line) for line in (tmp_path / "auto" / "metrics.jsonl").read_text().splitlines()]
    assert evals and all("nsp_loss" not in record for record in evals)


# --- NSP data unchanged -----------------------------------------------------------------------------------

NSP_SHARDS_SHA256 = "4609af71c3045e436fbbab2869acdb8356527fd1a67134d1f049a869bf9a1fe8"
"""sha256 of the NSP shards below, made by bertkit before --no-nsp existed (commit ed921fb)."""


def test_nsp_data_byte_identical(tmp_path, write_toy_corpus):
    corpus = write_toy_corpus(tmp_path / "corpus.txt", documents=40, sentences=(2, 10), words=(4, 20))
    tokenizer = WordPieceTokenizer.from_pretrained(ASSETS / "vocab" / "bert-base-uncased")
    build_pretraining_data(PretrainingDataSettings(
        (str(corpus),), "(in memory)", str(tmp_path / "out"), workers=1, quiet=True,
        instances=InstanceSettings(max_seq_length=64, dupe_factor=2, shuffle_buffer_mb=0.004, masking="static")),
        tokenizer)
    shards = sorted((tmp_path / "out").glob("shard-*.bin"))
    assert hashlib.sha256(b"".join(p.read_bytes() for p in shards)).hexdigest() == NSP_SHARDS_SHA256
