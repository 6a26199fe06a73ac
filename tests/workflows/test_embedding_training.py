"""`bertkit finetune embedding`: sentence-embedding training with in-batch negatives on a tiny synthetic
retrieval task (bert-debug, a 40-token vocabulary, seconds), checked against sentence-transformers itself: the
loss equals its MultipleNegativesRankingLoss on the same batch, and the written directory loads in
`SentenceTransformer` with the vectors bertkit computes (and that `bertkit extract` and the server give)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from sentence_transformers import SentenceTransformer
from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

from bertkit.cli import main
from bertkit.config import preset
from bertkit.errors import BertkitError
from bertkit.inference.batching import pad_batch
from bertkit.model import BertModel
from bertkit.serve.predictor import load_predictor
from bertkit.settings import EmbeddingSettings, ExtractSettings, FinetuneSettings
from bertkit.tasks.embedding import (
    SentenceEncoder,
    encode_texts,
    multiple_negatives_ranking_loss,
    pair_features,
    pair_loss,
    retrieval_metrics,
)
from bertkit.tokenizer import WordPieceTokenizer
from bertkit.workflows.embedding import run_embedding_training, save_sentence_transformers
from bertkit.workflows.extract import extract_features

TOPICS = 16
ANCHOR_WORDS = [f"a{i}" for i in range(TOPICS)]
POSITIVE_WORDS = [f"b{i}" for i in range(TOPICS)]
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "is", "where", *ANCHOR_WORDS, *POSITIVE_WORDS]
TEXTS = ["where is a3", "the b7", "a1 a2 a3 a4 a5 a6 a7 a8 a9 a10 a11", "", "is the b0 where"]


def _tokenizer() -> WordPieceTokenizer:
    return WordPieceTokenizer(VOCAB, do_lower_case=True)


def _rows(negatives: bool = True) -> list[dict[str, str]]:
    """Anchor word a_i matches positive word b_perm(i): nothing but training links them."""
    perm = list(range(TOPICS))
    random.Random(0).shuffle(perm)
    rows = []
    for i in range(TOPICS):
        row = {"anchor": f"where is {ANCHOR_WORDS[i]}", "positive": f"the {POSITIVE_WORDS[perm[i]]}"}
        if negatives:
            row["negative"] = f"the {POSITIVE_WORDS[perm[(i + 1) % TOPICS]]}"
        rows.append(row)
    return rows


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _encoder(pooling: str = "mean", normalize: bool = False, seed: int = 0) -> SentenceEncoder:
    torch.manual_seed(seed)
    bert = BertModel(preset("bert-debug", vocab_size=len(VOCAB), hidden_dropout_prob=0.0,
                            attention_probs_dropout_prob=0.0))
    return SentenceEncoder(bert, pooling, normalize).eval()


@pytest.fixture(scope="module")
def vocab(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _tokenizer().save_pretrained(tmp_path_factory.mktemp("vocab"))


@pytest.fixture(scope="module")
def trained(vocab: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """One training run with hard negatives, normalised vectors: (output directory, eval_results.json)."""
    root = tmp_path_factory.mktemp("run")
    train = _jsonl(root / "train.jsonl", _rows())
    cfg = FinetuneSettings.of(model="bert-debug", tokenizer=str(vocab), output=root / "out", max_steps=24,
                              eval_every=12, batch_size=8, learning_rate=2e-3, warmup_ratio=0.0, dropout=0.0,
                              precision="fp32", device="cpu")
    settings = EmbeddingSettings(max_seq_length=8, normalize=True, negative_column="negative")
    return root / "out", run_embedding_training(train, [train], cfg, settings)


def test_training_lowers_the_loss_and_raises_recall(trained, vocab):
    output, results = trained
    assert results["recall@1"] >= results["before_recall@1"] + 0.5 and results["recall@1"] >= 0.75
    assert results["mrr@10"] > results["before_mrr@10"] and results["skipped_train"] == 0
    assert (results["train_pairs"], results["dev_pairs"], results["dev_candidates"]) == (TOPICS, TOPICS, TOPICS)
    assert results["scale"] == 20.0 and results["pooling"] == "mean" and results["normalize"] is True
    assert json.loads((output / "eval_results.json").read_text())["recall@1"] == results["recall@1"]
    # the loss over the whole training set, before (the seeded initial model) and after (the saved one)
    tokenizer = WordPieceTokenizer.from_pretrained(vocab)
    features, _ = pair_features(_read_pairs(), tokenizer, 8)
    batch = pad_batch(features, tokenizer.pad_token_id)
    torch.manual_seed(1)  # the run's seed, set just before it builds the model
    before = SentenceEncoder(BertModel(preset("bert-debug", vocab_size=len(VOCAB))), "mean", True).eval()
    after = SentenceEncoder(BertModel.from_pretrained(output / "best"), "mean", True).eval()
    with torch.no_grad():
        loss_before, loss_after = (pair_loss(20.0)(m, batch)[0].item() for m in (before, after))
    assert loss_after < loss_before - 0.5, (loss_before, loss_after)


def _read_pairs():
    from bertkit.data.pairs import PairExample

    return [PairExample(str(i), r["anchor"], r["positive"], r["negative"]) for i, r in enumerate(_rows())]


def test_directory_loads_in_sentence_transformers_and_bertkit_with_equal_vectors(trained, tmp_path):
    output, _ = trained
    best = output / "best"
    modules = json.loads((best / "modules.json").read_text())
    assert [m["type"].rpartition(".")[2] for m in modules] == ["Transformer", "Pooling", "Normalize"]
    assert not (best / "bertkit_task.json").exists()
    model = SentenceTransformer(str(best), device="cpu")
    assert model.max_seq_length == 8
    expected = model.encode(TEXTS)
    ours = SentenceEncoder(BertModel.from_pretrained(best), "mean", True).eval()
    np.testing.assert_allclose(encode_texts(ours, _tokenizer(), TEXTS, 8, 2, torch.device("cpu")), expected,
                               atol=1e-5)
    np.testing.assert_allclose(load_predictor(best, batch_size=2).embed(TEXTS), expected, atol=1e-5)
    lines = tmp_path / "lines.txt"
    lines.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    extract_features(ExtractSettings(best, lines, tmp_path / "vectors.npy", batch_size=2))
    np.testing.assert_allclose(np.load(tmp_path / "vectors.npy"), expected, atol=1e-5)


@pytest.mark.parametrize(("pooling", "normalize"), [("mean", False), ("cls", True), ("cls", False), ("max", False)])
def test_every_pooling_is_saved_as_sentence_transformers_computes_it(pooling, normalize, tmp_path):
    encoder = _encoder(pooling, normalize)
    save_sentence_transformers(encoder, _tokenizer(), 6, tmp_path / "st")  # some texts are longer than 6 tokens
    assert (tmp_path / "st" / "2_Normalize").is_dir() == normalize
    expected = SentenceTransformer(str(tmp_path / "st"), device="cpu").encode(TEXTS)
    np.testing.assert_allclose(encode_texts(encoder, _tokenizer(), TEXTS, 6, 3, torch.device("cpu")), expected,
                               atol=1e-5)


@pytest.mark.parametrize("scale", [20.0, 7.5])
def test_loss_equals_sentence_transformers_multiple_negatives_ranking_loss(scale, tmp_path):
    """On random vectors (value and gradients), and on a whole batch of texts through the model."""
    generator = torch.Generator().manual_seed(0)
    anchors, positives, negatives = (torch.randn(6, 16, generator=generator, requires_grad=True) for _ in range(3))
    save_sentence_transformers(_encoder(), _tokenizer(), 8, tmp_path / "st")
    st_model = SentenceTransformer(str(tmp_path / "st"), device="cpu").eval()
    reference = MultipleNegativesRankingLoss(st_model, scale=scale)
    expected = reference.compute_loss_from_embeddings([anchors, positives, negatives], None)
    expected_grads = torch.autograd.grad(expected, (anchors, positives, negatives))
    ours = multiple_negatives_ranking_loss(anchors, torch.cat([positives, negatives]), scale)
    torch.testing.assert_close(ours, expected)
    for got, want in zip(torch.autograd.grad(ours, (anchors, positives, negatives)), expected_grads):
        torch.testing.assert_close(got, want)

    pairs = _read_pairs()[:5]
    features, _ = pair_features(pairs, _tokenizer(), 8)
    with torch.no_grad():
        got = pair_loss(scale)(_encoder(), pad_batch(features, 0))[0]
        columns = [[p.anchor for p in pairs], [p.positive for p in pairs], [p.negative for p in pairs]]
        want = reference([st_model.preprocess(texts) for texts in columns], None)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_every_trainable_parameter_gets_a_gradient():
    """DistributedDataParallel (torchrun, even one process) fails on its second step when a trainable parameter
    got no gradient: BERT's pooler, which a sentence encoder never uses, is frozen."""
    encoder = _encoder().train()
    features, _ = pair_features(_read_pairs()[:4], _tokenizer(), 8)
    pair_loss(20.0)(encoder, pad_batch(features, 0))[0].backward()
    without = [name for name, p in encoder.named_parameters() if p.requires_grad and p.grad is None]
    assert without == []
    assert encoder.bert.pooler is not None and not encoder.bert.pooler.weight.requires_grad


def test_retrieval_metrics_by_hand():
    anchors = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    candidates = np.array([[1.0, 0.1], [0.1, 1.0], [-1.0, 0.0]])
    metrics = retrieval_metrics(anchors, candidates, np.array([0, 0, 2]))  # ranks 1, 2, 3
    assert metrics["recall@1"] == pytest.approx(1 / 3) and metrics["recall@5"] == 1.0
    assert metrics["mrr@10"] == pytest.approx((1 + 1 / 2 + 1 / 3) / 3)


def _cli(vocab: Path, out: Path, train: Path, dev: Path, *extra: str) -> int:
    return main(["finetune", "embedding", "--model", "bert-debug", "--tokenizer", str(vocab), "--train", str(train),
                 "--dev", str(dev), "--output", str(out), "--max-steps", "4", "--batch-size", "4",
                 "--learning-rate", "1e-3", "--precision", "fp32", "--device", "cpu", "--max-seq-length", "8", *extra])


def test_cli_end_to_end_tsv_with_a_skipped_row_and_parquet_dev(vocab, tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = _rows(negatives=False)
    train = tmp_path / "train.tsv"
    train.write_text("query\tdoc\n" + "".join(f"{r['anchor']}\t{r['positive']}\n" for r in rows) + "broken\n",
                     encoding="utf-8")
    dev = tmp_path / "dev.parquet"
    pq.write_table(pa.table({"query": [r["anchor"] for r in rows[:8]], "doc": [r["positive"] for r in rows[:8]]}),
                   dev)
    code = _cli(vocab, tmp_path / "out", train, dev, "--anchor-column", "query", "--positive-column", "doc",
                "--pooling", "cls")
    out = capsys.readouterr().out
    assert code == 0
    assert "before training: mrr@10" in out and "seed 1: mrr@10" in out and "skipped train rows: 1" in out
    results = json.loads((tmp_path / "out" / "eval_results.json").read_text())
    assert results["skipped_train"] == 1 and results["dev_pairs"] == 8 and results["step"] in (4,)
    assert {"before_recall@1", "before_recall@5", "before_recall@10", "before_mrr@10"} <= set(results)
    pooling = json.loads((tmp_path / "out" / "best" / "1_Pooling" / "config.json").read_text())
    assert pooling["pooling_mode"] == "cls" and not (tmp_path / "out" / "best" / "2_Normalize").exists()


@pytest.mark.parametrize(("content", "extra", "message"), [
    ("anchor\tdoc\nwhere is a1\tthe b1\n", (), r"train\.tsv:1: no column 'positive' \(--positive-column\); the "
                                              r"columns are 'anchor', 'doc'"),
    ("anchor\tpositive\nwhere is a1\tthe b1\n \tthe b2\n", (), r"train\.tsv:3: empty anchor text \(--anchor-column\)"),
    ("anchor\tpositive\nwhere is a1\tthe b1\nwhere is a2\tthe b2\n", ("--batch-size", "1"),
     r"--batch-size 1 gives micro-batches of 1 pair: the loss takes the other pairs"),
    ("anchor\tpositive\nwhere is a1\tthe b1\n", (), r"train\.tsv: 1 pair; in-batch negatives need at least 2"),
    ("anchor\tpositive\nwhere is a1\tthe b1\nwhere is a2\tthe b2\n", ("--negative-column", "neg"),
     r"no column 'neg' \(--negative-column\)"),
    ("where is a1\tthe b1\nwhere is a2\tthe b2\n", (),
     r"train\.tsv:1: no header row with 'anchor' or 'positive' .* takes --no-header and column numbers"),
    ("where is a1\tthe b1\nwhere is a2\tthe b2\n", ("--no-header",),
     r"--no-header reads columns by number .* --anchor-column 'anchor' is a name"),
    ("anchor\tpositive\nwhere is a1\tthe b1\nwhere is a2\tthe b2\n", ("--freeze-encoder",),
     r"--freeze-encoder trains a task head .* leave it out"),
    ("anchor\tpositive\nwhere is a1\tthe b1\nwhere is a2\tthe b2\n", ("--scale", "0"),
     r"--scale must be a positive number, got 0"),
])
def test_bad_input_is_one_line_error(vocab, tmp_path, capsys, content, extra, message):
    train = tmp_path / "train.tsv"
    train.write_text(content, encoding="utf-8")
    assert _cli(vocab, tmp_path / "out", train, train, *extra) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("bertkit: error: ") and "\n" not in error and "Traceback" not in error
    assert __import__("re").search(message, error), error


def test_headerless_columns_by_number_and_triplets(tmp_path):
    from bertkit.data.pairs import read_pairs

    path = tmp_path / "t.csv"
    path.write_text('"where is a1, or b",the b1,the b2\nx,y\nwhere is a2,the b2,the b3\n', encoding="utf-8")
    pairs, skipped = read_pairs(path, "0", "1", "-1", header=False)
    assert [(p.anchor, p.positive, p.negative) for p in pairs] == [("where is a1, or b", "the b1", "the b2"),
                                                                   ("where is a2", "the b2", "the b3")]
    assert len(skipped) == 1 and skipped[0].startswith(f"{path}:2: 2 comma-separated fields")
    with pytest.raises(BertkitError, match=r"t\.jsonl:2: empty positive text \(--positive-column\)"):
        read_pairs(_jsonl(tmp_path / "t.jsonl", [{"anchor": "a", "positive": "b"}, {"anchor": "a", "positive": ""}]),
                   "anchor", "positive")
    with pytest.raises(BertkitError, match=r"t2\.jsonl:2: the positive text \(--positive-column\) is a list; write a"):
        rows = [{"anchor": "a", "positive": "b"}, {"anchor": "a", "positive": ["b"]}]
        read_pairs(_jsonl(tmp_path / "t2.jsonl", rows), "anchor", "positive")  # str() read it as "['b']"
