"""The formats users keep corpora and labelled data in (issue 24, part 2): Parquet, Hugging Face `datasets`
directories (`save_to_disk`), JSONL and text compressed with gzip or zstd, and directories of them.

Each corpus format must give `bertkit data pretraining` byte-identical shards and `bertkit tokenizer train`
the same vocabulary as the same documents in JSONL; each labelled format must give fine-tuning, predict,
evaluate and extract the same examples as its CSV (or text) equivalent. Bad input is a one-line error naming
the file and the column, or (corpus rows) skipped and counted. Tiny data: the whole file runs in seconds.
"""

from __future__ import annotations

import gzip
import itertools
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from bertkit.cli import main
from bertkit.config import preset
from bertkit.data import InstanceSettings, PretrainingDataSettings, build_pretraining_data
from bertkit.data.glue import read_table
from bertkit.data.swag import read_choices
from bertkit.data.text_inputs import read_lines
from bertkit.errors import BertkitError
from bertkit.io.textlines import CorpusStats, expand_inputs, read_documents
from bertkit.model import BertForSequenceClassification
from bertkit.tasks.classification import ClassificationSettings, ClassificationTask
from bertkit.tasks.finetuned import save_finetuned
from bertkit.tokenizer import WordPieceTokenizer, training

datasets = pytest.importorskip("datasets")  # the dev extra; only to write fixtures, bertkit reads with pyarrow
pandas = pytest.importorskip("pandas")  # (a dependency of datasets)
datasets.disable_progress_bars()  # (they write to stderr, where the tests read bertkit's errors)

WORDS = "dog cat bird horse king queen river mountain tree house boat stone".split()
# Documents of 1-5 sentences (a JSONL "text" or a table row: its lines are its sentences).
DOCUMENTS = ["\n".join(f"the {WORDS[(d + s) % 12]} was seen by {s + 2} people in the city {d}"
                       for s in range(1 + d % 5)) for d in range(24)]


# --- writers ------------------------------------------------------------------------------------------

def write_jsonl(path: Path, documents: list, column: str = "text") -> Path:
    path.write_text("".join(json.dumps({column: d, "id": i}) + "\n" for i, d in enumerate(documents)),
                    encoding="utf-8")
    return path


def write_text(path: Path, documents: list[str]) -> Path:
    """The original layout: a sentence per line, a blank line between documents."""
    path.write_text("\n\n".join(documents) + "\n", encoding="utf-8")
    return path


def write_parquet(path: Path, documents: list, column: str = "text") -> Path:
    # Small row groups: the reader must carry documents across row groups and record batches.
    pq.write_table(pa.table({"id": list(range(len(documents))), column: documents}), path, row_group_size=5)
    return path


def write_dataset(directory: Path, columns: dict, features=None, shards: int = 2) -> Path:
    dataset = datasets.Dataset.from_dict(columns, features=features)
    dataset.save_to_disk(str(directory), num_shards=shards)
    return directory


def zst(path: Path, source: Path, frames: int = 1) -> Path:
    """`source` compressed with zstd, in `frames` frames one after another (as zstd -c a b writes them)."""
    data = source.read_bytes()
    cut = [len(data) * i // frames for i in range(frames + 1)]
    compressor = zstandard.ZstdCompressor()
    path.write_bytes(b"".join(compressor.compress(data[a:b]) for a, b in itertools.pairwise(cut)))
    return path


# --- corpora: the same documents, the same shards and vocabulary --------------------------------------

@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> WordPieceTokenizer:
    path = write_text(tmp_path_factory.mktemp("vocab") / "train.txt", DOCUMENTS)
    return WordPieceTokenizer.train([path], vocab_size=120, min_frequency=1, show_progress=False)


def build(inputs: list, tokenizer, output: Path, strict: bool = False, text_column: str = "text") -> dict:
    return build_pretraining_data(PretrainingDataSettings(
        tuple(map(str, inputs)), "(in memory)", str(output), workers=1, strict=strict, text_column=text_column,
        quiet=True, instances=InstanceSettings(dupe_factor=2, max_seq_length=32)), tokenizer)


def shard_bytes(output: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(output.glob("shard-*.bin")))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """The DOCUMENTS in every corpus format, side by side."""
    root = tmp_path_factory.mktemp("corpus")
    write_jsonl(root / "docs.jsonl", DOCUMENTS)
    write_text(root / "docs.txt", DOCUMENTS)
    zst(root / "docs.jsonl.zst", root / "docs.jsonl", frames=3)
    zst(root / "docs.txt.zst", root / "docs.txt")
    (root / "docs.jsonl.gz").write_bytes(gzip.compress((root / "docs.jsonl").read_bytes()))
    write_parquet(root / "docs.parquet", DOCUMENTS)
    write_dataset(root / "dataset", {"text": DOCUMENTS, "id": list(range(len(DOCUMENTS)))}, shards=3)
    return root


@pytest.fixture(scope="module")
def reference(corpus, tokenizer, tmp_path_factory) -> bytes:
    """The shards of the JSONL copy, which every other format must reproduce byte for byte."""
    output = tmp_path_factory.mktemp("reference") / "out"
    build([corpus / "docs.jsonl"], tokenizer, output)
    return shard_bytes(output)


@pytest.mark.parametrize("name", ["docs.txt", "docs.jsonl.zst", "docs.txt.zst", "docs.jsonl.gz", "docs.parquet",
                                  "dataset"])
def test_data_pretraining_makes_the_same_shards_from_every_format(corpus, tokenizer, reference, tmp_path, name):
    summary = build([corpus / name], tokenizer, tmp_path / "out")["summary"]
    assert shard_bytes(tmp_path / "out") == reference
    assert summary["documents"] == len(DOCUMENTS) and not summary["skipped_lines"] and not summary["skipped_files"]


def test_tokenizer_train_learns_from_the_same_sentences_in_every_format(corpus, tmp_path, monkeypatch):
    """The trainer itself breaks frequency ties differently from run to run (the same file twice can give two
    vocabularies), so what must be equal is what it is given: every sentence, in order."""
    given: dict[str, list[str]] = {}
    original = training._training_lines

    def recorded(*args, **kwargs):  # the trainer's pass (a second one counts the learned pieces)
        lines = given.setdefault(name, []) if name not in given else []
        for line in original(*args, **kwargs):
            lines.append(line)
            yield line

    monkeypatch.setattr(training, "_training_lines", recorded)
    for name in ["docs.txt", "docs.jsonl", "docs.jsonl.zst", "docs.txt.zst", "docs.parquet", "dataset"]:
        assert main(["tokenizer", "train", "--input", str(corpus / name), "--vocab-size", "80", "--min-frequency",
                     "1", "--no-progress", "--output", str(tmp_path / name)]) == 0
        assert len((tmp_path / name / "vocab.txt").read_text(encoding="utf-8").split()) == 80
    assert given["docs.txt"] == [sentence for document in DOCUMENTS for sentence in document.split("\n")]
    assert all(lines == given["docs.txt"] for lines in given.values())


def test_text_column_chooses_the_field_and_the_column(tokenizer, reference, tmp_path, capsys):
    jsonl = write_jsonl(tmp_path / "body.jsonl", DOCUMENTS, column="body")
    parquet = write_parquet(tmp_path / "body.parquet", DOCUMENTS, column="body")
    for path in (jsonl, parquet):
        out = tmp_path / f"out-{path.suffix[1:]}"
        assert main(["data", "pretraining", "--input", str(path), "--tokenizer", str(_saved(tokenizer, tmp_path)),
                     "--output", str(out), "--text-column", "body", "--dupe-factor", "2", "--max-seq-length", "32",
                     "--workers", "1", "--quiet"]) == 0
        assert shard_bytes(out) == reference
    assert main(["tokenizer", "train", "--input", str(parquet), "--text-column", "body", "--vocab-size", "80",
                 "--min-frequency", "1", "--no-progress", "--output", str(tmp_path / "vocab")]) == 0
    capsys.readouterr()


def _saved(tokenizer: WordPieceTokenizer, root: Path) -> Path:
    if not (root / "tok" / "vocab.txt").exists():
        tokenizer.save_pretrained(root / "tok")
    return root / "tok"


def test_a_directory_is_its_corpus_files_in_sorted_order_recursively(corpus, tokenizer, tmp_path):
    root = tmp_path / "corpus"
    (root / "b" / "deeper").mkdir(parents=True)
    write_jsonl(root / "a.jsonl", DOCUMENTS[:6])
    write_parquet(root / "b" / "deeper" / "c.parquet", DOCUMENTS[6:12])
    write_dataset(root / "b" / "dataset", {"text": DOCUMENTS[12:18]})
    zst(root / "b" / "z.txt.zst", write_text(tmp_path / "z.txt", DOCUMENTS[18:]))
    (root / "README.md").write_text("# about this corpus\n")
    (root / ".cache").mkdir()
    (root / ".cache" / "x.txt").write_text("not read\n")
    stats = CorpusStats()
    paths = expand_inputs([str(root)], stats)
    assert [p.relative_to(root).as_posix() for p in paths] == [
        "a.jsonl", "b/dataset/data-00000-of-00002.arrow", "b/dataset/data-00001-of-00002.arrow",
        "b/deeper/c.parquet", "b/z.txt.zst"]
    assert stats.skipped_files == {
        "not a corpus format (.txt, .jsonl, .parquet, .arrow, + .gz/.zst) in a directory --input": [
            str(root / "README.md")],
        "hidden (name starts with '.') in a directory --input": [str(root / ".cache")]}
    documents = list(read_documents(paths, stats))
    assert len(documents) == len(DOCUMENTS)  # each source's documents, in the order listed
    summary = build([root], tokenizer, tmp_path / "out")["summary"]
    assert str(root / "README.md") in json.dumps(summary["skipped_files"])
    # A glob matching a file and a directory reaches the same files; a file named twice is read once.
    assert expand_inputs([str(root / "[ab]*"), str(root), str(root / "a.jsonl")], CorpusStats()) == paths


def test_a_datasetdict_is_refused_naming_its_splits(tokenizer, tmp_path, capsys):
    splits = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": DOCUMENTS}),
                                   "validation": datasets.Dataset.from_dict({"text": DOCUMENTS[:3]})})
    splits.save_to_disk(str(tmp_path / "dict"))
    argv = ["data", "pretraining", "--tokenizer", str(_saved(tokenizer, tmp_path)), "--dupe-factor", "1",
            "--workers", "1", "--quiet"]
    assert main([*argv, "--input", str(tmp_path / "dict"), "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "DatasetDict with the splits train, validation; give one split's directory" in err
    assert str(tmp_path / "dict" / "train") in err and "Traceback" not in err and err.count("\n") == 1
    assert main([*argv, "--input", str(tmp_path / "dict" / "train"), "--output", str(tmp_path / "out")]) == 0


def test_an_arrow_file_and_state_json_written_without_datasets(tokenizer, reference, tmp_path):
    """The layout `save_to_disk` writes, by hand, with the Arrow IPC *file* format in one shard."""
    directory = tmp_path / "by_hand"
    directory.mkdir()
    table = pa.table({"text": DOCUMENTS})
    with pa.ipc.new_stream(directory / "data-00000-of-00002.arrow", table.schema) as writer:
        writer.write_table(table.slice(0, 10), max_chunksize=4)
    with pa.ipc.new_file(directory / "data-00001-of-00002.arrow", table.schema) as writer:
        writer.write_table(table.slice(10), max_chunksize=4)
    (directory / "state.json").write_text(json.dumps({"_data_files": [
        {"filename": "data-00000-of-00002.arrow"}, {"filename": "data-00001-of-00002.arrow"}]}))
    build([directory], tokenizer, tmp_path / "out")
    assert shard_bytes(tmp_path / "out") == reference


def test_a_parquet_row_group_is_read_in_bounded_memory(tmp_path):
    """One row group of 24 MB (pyarrow's writer puts up to a million rows in one): Arrow's allocations while
    the corpus reader streams it stay at a few pages and batches, not the row group (or the file)."""
    path = tmp_path / "big.parquet"
    random = np.random.default_rng(0)
    texts = [f"{DOCUMENTS[i % 24]}\n{random.bytes(400).hex()}" for i in range(30_000)]  # (hex: no compression)
    pq.write_table(pa.table({"text": texts}), path, row_group_size=len(texts))
    del texts
    peak, documents = 0, 0
    for _ in read_documents([path], CorpusStats()):
        documents += 1
        if documents % 1000 == 0:
            peak = max(peak, pa.total_allocated_bytes())
    # Measured 4.8 MB (the 1 MiB read buffer, a page, a batch); pyarrow's default reading allocates 28 MB here,
    # the row group's whole column chunk at once.
    assert documents == 30_000 and peak < 8 << 20


# --- corpora: bad input -------------------------------------------------------------------------------

def _data_error(tokenizer, tmp_path, capsys, *inputs: Path, flags: tuple[str, ...] = ()) -> str:
    argv = ["data", "pretraining", "--tokenizer", str(_saved(tokenizer, tmp_path)), "--output", str(tmp_path / "o"),
            "--workers", "1", "--quiet", "--overwrite", *flags]
    for path in inputs:
        argv += ["--input", str(path)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("bertkit: error: ") and err.count("\n") == 1 and "Traceback" not in err
    return err


def test_a_missing_or_non_string_text_column_names_the_file_and_the_columns(tokenizer, tmp_path, capsys):
    path = write_parquet(tmp_path / "body.parquet", DOCUMENTS, column="body")
    err = _data_error(tokenizer, tmp_path, capsys, path)
    assert f"{path}: no column 'text' (--text-column); the columns are 'id', 'body'" in err
    err = _data_error(tokenizer, tmp_path, capsys, path, flags=("--text-column", "id"))
    assert f"{path}: column 'id' (--text-column) holds int64, not strings" in err
    listed = write_dataset(tmp_path / "listed", {"text": [[d] for d in DOCUMENTS]}, shards=1)
    err = _data_error(tokenizer, tmp_path, capsys, listed)
    assert f"{listed / 'data-00000-of-00001.arrow'}: column 'text' (--text-column) holds list<item: string>" in err
    # tokenizer train reads with the same rules
    assert main(["tokenizer", "train", "--input", str(path), "--output", str(tmp_path / "v"), "--no-progress"]) == 2
    assert f"{path}: no column 'text' (--text-column)" in capsys.readouterr().err


def test_null_texts_are_skipped_and_counted_or_strict_names_the_row(tokenizer, tmp_path, capsys):
    path = write_parquet(tmp_path / "nulls.parquet", [*DOCUMENTS[:7], None, *DOCUMENTS[7:], None])
    summary = build([path], tokenizer, tmp_path / "out")["summary"]
    assert summary["skipped_lines"] == {"table row with a null 'text'": 2}
    assert summary["documents"] == len(DOCUMENTS)
    err = _data_error(tokenizer, tmp_path, capsys, path, flags=("--strict",))
    assert f"{path}: row 8 (the first is 1) has no text: column 'text' is null" in err and "drop --strict" in err


def test_corrupt_tables_are_skipped_and_named_or_strict_fails(tokenizer, tmp_path, capsys):
    good = write_parquet(tmp_path / "good.parquet", DOCUMENTS)
    fake = tmp_path / "fake.parquet"
    fake.write_bytes(b"PAR1 this is not a parquet file \x00\x01" * 10)
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(good.read_bytes()[:-30])  # the footer is gone
    arrow = tmp_path / "fake.arrow"
    arrow.write_bytes(b"\xff\xff\xff\xff garbage" * 10)
    summary = build([fake, cut, arrow, good], tokenizer, tmp_path / "out")["summary"]
    assert summary["skipped_files"] == {"unreadable Parquet file": [str(fake), str(cut)],
                                        "unreadable Arrow file": [str(arrow)]}
    assert summary["documents"] == len(DOCUMENTS)
    err = _data_error(tokenizer, tmp_path, capsys, cut, flags=("--strict",))
    assert f"{cut}: unreadable Parquet file; remove it from --input" in err


def test_damaged_row_group_skips_the_rest_of_the_file(tokenizer, tmp_path, capsys):
    path = tmp_path / "damaged.parquet"
    pq.write_table(pa.table({"text": DOCUMENTS}), path, row_group_size=12, compression="snappy")
    data = bytearray(path.read_bytes())
    second = pq.ParquetFile(path).metadata.row_group(1).column(0)
    start = second.dictionary_page_offset or second.data_page_offset
    data[start:start + 6] = b"\xff" * 6  # the second row group's first page header: not a header any more
    path.write_bytes(bytes(data))
    summary = build([path], tokenizer, tmp_path / "out")["summary"]
    assert summary["skipped_files"] == {"corrupt Parquet/Arrow data (rest of file)": [str(path)]}
    assert summary["documents"] == 12  # the first row group's
    err = _data_error(tokenizer, tmp_path, capsys, path, flags=("--strict",))
    assert f"{path}: not a readable Parquet file" in err


def test_corrupt_zstd_is_skipped_and_named_or_strict_fails(corpus, tokenizer, tmp_path, capsys):
    # Cut in its last 128 KiB block, after the 8 KiB every file is sniffed for NUL bytes in.
    numbered = [f"{d} {n}" for n, d in enumerate(DOCUMENTS * 100)]
    data = zst(tmp_path / "long.jsonl.zst", write_jsonl(tmp_path / "long.jsonl", numbered)).read_bytes()
    truncated = tmp_path / "truncated.jsonl.zst"
    truncated.write_bytes(data[:len(data) - 10])
    garbage = tmp_path / "garbage.txt.zst"
    garbage.write_bytes(b"this is not zstd data" * 5)
    summary = build([truncated, garbage, corpus / "docs.txt"], tokenizer, tmp_path / "out")["summary"]
    assert summary["skipped_files"] == {"corrupt zstd data (rest of file)": [str(truncated)],
                                        "unreadable zstd file": [str(garbage)]}
    assert 1000 < summary["documents"] < 2400 + len(DOCUMENTS)  # the documents before the damage are read
    err = _data_error(tokenizer, tmp_path, capsys, truncated, flags=("--strict",))
    assert f"{truncated}: corrupt zstd data (the file ends inside a frame (cut short))" in err


# --- labelled data: Parquet and datasets directories read as their CSV -------------------------------

PAIRS = [("the dog", "was seen", "yes", "r1"), ("a cat", "ran away", "no", "r2"), ("the bird", "flew", "yes", "r3"),
         ("a king", "sat", "no", "r4"), ("the queen", "spoke", "yes", "r5")]


def _pairs_csv(path: Path) -> Path:
    path.write_text("id,premise,hypothesis,gold\n" + "".join(f"{i},{a},{b},{y}\n" for a, b, y, i in PAIRS))
    return path


def _pairs_columns() -> dict:
    return {"id": [p[3] for p in PAIRS], "premise": [p[0] for p in PAIRS], "hypothesis": [p[1] for p in PAIRS],
            "gold": [p[2] for p in PAIRS]}


@pytest.fixture
def labelled(tmp_path) -> dict[str, Path]:
    """The PAIRS as CSV, Parquet (from pandas) and a `datasets` directory whose label is a ClassLabel."""
    csv = _pairs_csv(tmp_path / "pairs.csv")
    parquet = tmp_path / "pairs.parquet"
    pandas.DataFrame(_pairs_columns()).to_parquet(parquet)  # as users write it
    features = datasets.Features({"id": datasets.Value("string"), "premise": datasets.Value("string"),
                                  "hypothesis": datasets.Value("string"),
                                  "gold": datasets.ClassLabel(names=["no", "yes"])})
    columns = {**_pairs_columns(), "gold": [["no", "yes"].index(y) for y in _pairs_columns()["gold"]]}
    return {"csv": csv, "parquet": parquet, "dataset": write_dataset(tmp_path / "pairs", columns, features)}


def test_read_table_gives_the_csv_examples_from_parquet_and_datasets(labelled):
    def examples(path):
        rows, skipped = read_table(path, "premise", "hypothesis", "gold")
        assert skipped == []
        return [(e.text, e.text_pair, e.label, e.id) for e in rows]

    assert examples(labelled["parquet"]) == examples(labelled["dataset"]) == examples(labelled["csv"])
    numbers, _ = read_table(labelled["dataset"], "premise", "hypothesis", "gold", label_names=False)
    assert [e.label for e in numbers] == ["1", "0", "1", "0", "1"]  # a ClassLabel as stored
    assert [e.guid for e in numbers][:2] == [f"{labelled['dataset']}:1", f"{labelled['dataset']}:2"]  # rows from 1


def test_compressed_labelled_files_read_as_the_plain_ones(labelled, tmp_path):
    jsonl = tmp_path / "pairs.jsonl"
    jsonl.write_text("".join(json.dumps({"id": i, "premise": a, "hypothesis": b, "gold": y}) + "\n"
                             for a, b, y, i in PAIRS))
    packed = tmp_path / "pairs.csv.gz"
    packed.write_bytes(gzip.compress(labelled["csv"].read_bytes()))

    def examples(path):
        return [(e.text, e.text_pair, e.label, e.id) for e in read_table(path, "premise", "hypothesis", "gold")[0]]

    assert examples(packed) == examples(zst(tmp_path / "pairs.jsonl.zst", jsonl)) == examples(labelled["csv"])
    cut = tmp_path / "cut.jsonl.zst"
    cut.write_bytes((tmp_path / "pairs.jsonl.zst").read_bytes()[:-5])
    with pytest.raises(BertkitError, match=rf"{cut}: corrupt zst data \(the file ends inside a frame"):
        read_table(cut, "premise", "hypothesis", "gold")


def _classifier(directory: Path, **settings) -> Path:
    """A fine-tuned classification directory as `bertkit finetune` writes it (random weights, no training)."""
    words = sorted({w for a, b, _, _ in PAIRS for w in f"{a} {b}".split()})
    tokenizer = WordPieceTokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words])
    task = ClassificationTask(ClassificationSettings(labels=["no", "yes"], max_seq_length=16, **settings))
    model = BertForSequenceClassification(preset("bert-debug", vocab_size=tokenizer.vocab_size,
                                                 **task.config_overrides()))
    save_finetuned(model, task, tokenizer, directory)
    return directory


def test_predict_and_evaluate_read_parquet_and_datasets_as_csv(labelled, tmp_path, capsys):
    model = _classifier(tmp_path / "best", text_column="premise", text_pair_column="hypothesis", label_column="gold")
    outputs = {}
    for kind, path in labelled.items():
        assert main(["predict", "--model", str(model), "--input", str(path), "--output", str(tmp_path / kind),
                     "--device", "cpu"]) == 0
        outputs[kind] = (tmp_path / kind / "predictions.jsonl").read_text()
        assert main(["evaluate", "--model", str(model), "--input", str(path), "--output", str(tmp_path / f"e{kind}"),
                     "--device", "cpu"]) == 0
        metrics = json.loads(capsys.readouterr().out.split("\n", 1)[1])
        assert metrics["examples"] == len(PAIRS) and metrics["skipped"] == 0
    assert outputs["parquet"] == outputs["dataset"] == outputs["csv"]  # ids from the id column, same scores
    assert json.loads(outputs["csv"].splitlines()[0])["id"] == "r1"


def test_finetune_trains_on_parquet_with_a_datasets_dev_split(labelled, tmp_path, capsys):
    vocab = _classifier(tmp_path / "model")  # its vocab.txt
    assert main(["finetune", "classification", "--model", "bert-debug", "--tokenizer", str(vocab),
                 "--train", str(labelled["parquet"]), "--dev", str(labelled["dataset"]), "--dev", str(labelled["csv"]),
                 "--text-column", "premise", "--text-pair-column", "hypothesis", "--label-column", "gold",
                 "--output", str(tmp_path / "out"), "--epochs", "1", "--batch-size", "2", "--precision", "fp32",
                 "--device", "cpu"]) == 0
    results = json.loads((tmp_path / "out" / "eval_results.json").read_text())
    assert json.loads((tmp_path / "out" / "best" / "config.json").read_text())["id2label"] == {"0": "no", "1": "yes"}
    dev = json.dumps(results)
    assert "skipped_dev" not in dev or '"skipped_dev": 0' in dev
    capsys.readouterr()


def test_glue_pair_task_reads_a_datasets_directory_by_column(tmp_path):
    """`datasets`' glue/mnli numbers its labels (0 entailment); the task's label names are read."""
    features = datasets.Features({"premise": datasets.Value("string"), "hypothesis": datasets.Value("string"),
                                  "label": datasets.ClassLabel(names=["entailment", "neutral", "contradiction"])})
    path = write_dataset(tmp_path / "mnli", {"premise": ["a", "b", "c"], "hypothesis": ["x", "y", "z"],
                                             "label": [0, 1, 2]}, features, shards=1)
    mnli = ClassificationTask(ClassificationSettings(labels=["contradiction", "entailment", "neutral"],
                                                     glue_task="mnli", text_column="premise",
                                                     text_pair_column="hypothesis"))
    examples, skipped = mnli.read(path)
    assert [e.label for e in examples] == ["entailment", "neutral", "contradiction"] and skipped == []
    # sst2's labels are the numbers themselves, as `datasets`' glue/sst2 stores them (1 = positive).
    features = datasets.Features({"sentence": datasets.Value("string"),
                                  "label": datasets.ClassLabel(names=["negative", "positive"])})
    path = write_dataset(tmp_path / "sst2", {"sentence": ["good", "bad"], "label": [1, 0]}, features, shards=1)
    sst2 = ClassificationTask(ClassificationSettings(labels=["0", "1"], glue_task="sst2", text_column="sentence"))
    assert [e.label for e in sst2.read(path)[0]] == ["1", "0"]


def test_multiple_choice_tables_in_either_layout(tmp_path):
    rows = [{"context": "the dog", "question": "it", "endings": ["ran", "sat", "flew"], "label": 1},
            {"context": "a cat", "question": "it", "endings": ["slept", "spoke", "swam"], "label": 0}]
    jsonl = tmp_path / "mc.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    parquet = tmp_path / "mc.parquet"
    pq.write_table(pa.Table.from_pylist(rows), parquet)
    swag = write_dataset(tmp_path / "swag", {
        "sent1": [r["context"] for r in rows], "sent2": [r["question"] for r in rows],
        **{f"ending{i}": [r["endings"][i] for r in rows] for i in range(3)}, "label": [r["label"] for r in rows]},
        shards=1)

    def choices(path):
        return [(e.context, e.start, e.endings, e.label) for e in read_choices(path)]

    assert choices(parquet) == choices(swag) == choices(jsonl)
    assert [e.label for e in read_choices(parquet, labelled=False)] == [None, None]
    with pytest.raises(BertkitError, match=r"needs 'context' and 'endings' \(a list\).*the columns are 'id', 'x'"):
        read_choices(write_parquet(tmp_path / "x.parquet", ["a"], column="x"))


def test_extract_reads_a_table_as_its_lines(tmp_path):
    text = tmp_path / "lines.txt"
    text.write_text("the dog ||| was seen\na cat ||| ran away\n")
    parquet = tmp_path / "lines.parquet"
    pq.write_table(pa.table({"a": ["the dog", "a cat"], "b": ["was seen", "ran away"]}), parquet)
    assert read_lines(parquet, text_column="a", text_pair_column="b") == read_lines(text)
    model = _classifier(tmp_path / "model")
    for source, flags in ((text, []), (parquet, ["--text-column", "a", "--text-pair-column", "b"])):
        assert main(["extract", "--model", str(model), "--input", str(source), "--output",
                     str(tmp_path / f"{source.suffix[1:]}.npy"), *flags]) == 0
    assert np.array_equal(np.load(tmp_path / "txt.npy"), np.load(tmp_path / "parquet.npy"))
    pq.write_table(pa.table({"a": ["the dog", None]}), parquet)
    with pytest.raises(BertkitError, match=rf"{parquet}:2: column 'a' \(--text-column\) is null in row 2"):
        read_lines(parquet, text_column="a")


# --- labelled data: bad input -------------------------------------------------------------------------

def test_labelled_bad_input_is_one_line_naming_file_and_column(labelled, tmp_path, capsys):
    model = _classifier(tmp_path / "best", text_column="premise", text_pair_column="hypothesis", label_column="gold")

    def error(path: Path, *flags: str) -> str:
        assert main(["evaluate", "--model", str(model), "--input", str(path), "--output", str(tmp_path / "e"),
                     "--device", "cpu", *flags]) == 2
        err = capsys.readouterr().err
        assert err.startswith("bertkit: error: ") and err.count("\n") == 1 and "Traceback" not in err
        return err

    assert (f"{labelled['parquet']}: no column 'label' (--label-column); the columns are 'id', 'premise', "
            "'hypothesis', 'gold'; choose with --label-column") in error(labelled["parquet"], "--label-column", "label")
    shard = labelled["dataset"] / "data-00000-of-00002.arrow"
    assert f"{shard}: column 'gold' (--text-column) holds int64, not strings" in error(
        labelled["dataset"], "--text-column", "gold")
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(labelled["parquet"].read_bytes()[:100])
    assert f"{broken}: not a readable Parquet file" in error(broken)
    assert "--no-header applies to CSV/TSV files" in error(labelled["parquet"], "--no-header")
    plain = tmp_path / "plain_dir"
    plain.mkdir()
    assert f"{plain}: is a directory, but not one written by Dataset.save_to_disk" in error(plain)
    splits = datasets.DatasetDict({"train": datasets.load_from_disk(str(labelled["dataset"])),
                                   "test": datasets.load_from_disk(str(labelled["dataset"]))})
    splits.save_to_disk(str(tmp_path / "dict"))
    assert "DatasetDict with the splits train, test; give one split's directory" in error(tmp_path / "dict")


def test_null_values_in_a_labelled_table_are_skipped_and_named(tmp_path):
    path = tmp_path / "nulls.parquet"
    pq.write_table(pa.table({"text": ["a", None, "c"], "label": ["x", "y", None]}), path)
    examples, skipped = read_table(path, "text", None, "label")
    assert [e.text for e in examples] == ["a"]
    assert skipped == [f"{path}:2: missing 'text'", f"{path}:3: missing 'label'"]
