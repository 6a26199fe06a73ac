"""Token tagging and SQuAD from the tables users keep (issue 24): JSONL (.gz/.zst), Parquet and `datasets`
save_to_disk directories, in Hugging Face's conll2003 (tokens, ner_tags) and squad/squad_v2 (id, question,
context, answers) layouts.

Each table must read as the same examples as its CoNLL or SQuAD JSON equivalent, so fine-tuning gives the same
label map and evaluation the same scores; a conll2003-style ClassLabel tag column is read as its names. Bad
input is a one-line error naming the file, the row or column and the flag; a row that is not a sentence is
skipped and counted. Tiny data, a bert-debug model: seconds.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from bertkit.cli import main
from bertkit.config import preset
from bertkit.data.squad import read_squad
from bertkit.errors import BertkitError
from bertkit.io.columnar import class_names
from bertkit.model import BertForQuestionAnswering, BertForTokenClassification
from bertkit.tasks.finetuned import save_finetuned
from bertkit.tasks.squad import SquadSettings, SquadTask
from bertkit.tasks.tagging import TaggingSettings, TaggingTask, read_tagged
from bertkit.tokenizer import WordPieceTokenizer

datasets = pytest.importorskip("datasets")  # the dev extra; only to write fixtures, bertkit reads with pyarrow
datasets.disable_progress_bars()  # (they write to stderr, where the tests read bertkit's errors)

NAMES = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC"]  # conll2003's ClassLabel
SENTENCES = [("EU rejects German call".split(), ["B-ORG", "O", "B-MISC", "O"]),
             ("Peter Blackburn".split(), ["B-PER", "I-PER"]),
             ("the film was good in Paris".split(), ["O", "O", "O", "O", "O", "B-LOC"]),
             ("Berlin is the capital of Germany".split(), ["B-LOC", "O", "O", "O", "O", "B-LOC"])]
WORDS = sorted({w.lower() for tokens, _ in SENTENCES for w in tokens} | {"where", "who", "sings", "?", ".", "france"})
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


@pytest.fixture(scope="module")
def vocab(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("vocab")
    WordPieceTokenizer([*SPECIAL, *WORDS]).save_pretrained(directory)
    return directory


def _rows() -> list[dict]:
    return [{"id": str(i), "tokens": tokens, "ner_tags": tags} for i, (tokens, tags) in enumerate(SENTENCES)]


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _zst(path: Path, source: Path) -> Path:
    path.write_bytes(zstandard.ZstdCompressor().compress(source.read_bytes()))
    return path


def _conll_dataset(directory: Path, rows: list[dict], shards: int = 2) -> Path:
    """conll2003's features: tokens a list of strings, ner_tags a list of ClassLabel (stored as numbers)."""
    features = datasets.Features({"id": datasets.Value("string"), "tokens": datasets.Sequence(datasets.Value("string")),
                                  "ner_tags": datasets.Sequence(datasets.ClassLabel(names=NAMES))})
    columns = {"id": [r["id"] for r in rows], "tokens": [r["tokens"] for r in rows],
               "ner_tags": [[NAMES.index(t) for t in r["ner_tags"]] for r in rows]}
    datasets.Dataset.from_dict(columns, features=features).save_to_disk(str(directory), num_shards=shards)
    return directory


@pytest.fixture
def tagged(tmp_path) -> dict[str, Path]:
    """The SENTENCES as CoNLL text and as every table: JSONL (plain, .gz, .zst), Parquet with string tags
    (pyarrow), Parquet with ClassLabel numbers (`Dataset.to_parquet`), a `datasets` directory."""
    conll = tmp_path / "train.txt"
    conll.write_text("-DOCSTART- O\n\n" + "\n".join("".join(f"{w} {t}\n" for w, t in zip(*s)) for s in SENTENCES))
    jsonl = _jsonl(tmp_path / "train.jsonl", _rows())
    gz = tmp_path / "train.jsonl.gz"
    gz.write_bytes(gzip.compress(jsonl.read_bytes()))
    parquet = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(_rows()), parquet)
    dataset = _conll_dataset(tmp_path / "conll_hf", _rows())
    numbered = tmp_path / "numbered.parquet"
    datasets.load_from_disk(str(dataset)).to_parquet(str(numbered))
    return {"conll": conll, "jsonl": jsonl, "gz": gz, "zst": _zst(tmp_path / "train.jsonl.zst", jsonl),
            "parquet": parquet, "numbered": numbered, "dataset": dataset}


# --- tagging: the same sentences, the same label map, predictions --------------------------------------

def test_every_tagging_table_reads_as_its_conll(tagged):
    def sentences(path):
        found, skipped = read_tagged(path, "BIO", "tokens", "ner_tags")
        assert skipped == []
        return [(s.words, s.labels) for s in found]

    expected = sentences(tagged["conll"])
    assert expected == [(tokens, tags) for tokens, tags in SENTENCES]
    for name, path in tagged.items():
        assert sentences(path) == expected, name  # ClassLabel numbers read as their names
    rows = read_tagged(tagged["dataset"], "BIO", "tokens", "ner_tags")[0]
    assert [(s.location, s.id) for s in rows[:2]] == [(f"{tagged['dataset']}:1", "0"), (f"{tagged['dataset']}:2", "1")]
    unlabelled = read_tagged(tagged["parquet"], "BIO", "tokens", None)[0]  # predict: no tags column needed
    assert [s.labels for s in unlabelled] == [None] * len(SENTENCES)


def test_class_names_of_a_list_of_classlabel_in_every_spelling_of_datasets():
    def schema(feature):
        metadata = {"huggingface": json.dumps({"info": {"features": {"ner_tags": feature}}})}
        return pa.schema([("ner_tags", pa.list_(pa.int64()))], metadata=metadata)

    label = {"names": NAMES, "_type": "ClassLabel"}
    for feature in ({"feature": label, "_type": "List"}, {"feature": label, "_type": "Sequence"}, [label]):
        assert class_names(schema(feature)) == {"ner_tags": NAMES}
    assert class_names(schema({"feature": {"dtype": "string", "_type": "Value"}, "_type": "List"})) == {}


def _finetune(kind: str, vocab: Path, out: Path, train: Path, dev: Path, *extra: str) -> dict:
    assert main(["finetune", kind, "--model", "bert-debug", "--tokenizer", str(vocab), "--train", str(train),
                 "--dev", str(dev), "--output", str(out), "--epochs", "1", "--batch-size", "4",
                 "--learning-rate", "1e-3", "--precision", "fp32", "--device", "cpu", "--max-seq-length", "32",
                 *extra]) == 0
    return json.loads((out / "eval_results.json").read_text())


def test_finetune_on_the_datasets_copy_has_the_conll_label_map_then_predict_and_evaluate(tagged, vocab, tmp_path,
                                                                                          capsys):
    conll = _finetune("tagging", vocab, tmp_path / "conll", tagged["conll"], tagged["conll"])
    table = _finetune("tagging", vocab, tmp_path / "table", tagged["dataset"], tagged["parquet"])
    for name in ("config.json", "bertkit_task.json"):
        saved = [json.loads((tmp_path / run / "best" / name).read_text()) for run in ("conll", "table")]
        key = "id2label" if name == "config.json" else "labels"
        assert saved[0][key] == saved[1][key]
    assert json.loads((tmp_path / "table" / "best" / "config.json").read_text())["id2label"] == {
        "0": "O", "1": "B-LOC", "2": "B-MISC", "3": "B-ORG", "4": "B-PER", "5": "I-PER"}  # names, not numbers
    assert table["skipped_train"] == table["skipped_dev"] == 0 and conll["f1"] >= 0.0
    dev_predictions = [json.loads(line) for line in (tmp_path / "table" / "predictions.jsonl").read_text().splitlines()]
    assert [p["id"] for p in dev_predictions] == ["0", "1", "2", "3"]  # the dev table's id column
    model = tmp_path / "table" / "best"
    assert main(["predict", "--model", str(model), "--input", str(tagged["zst"]), "--output", str(tmp_path / "p"),
                 "--device", "cpu"]) == 0
    predictions = [json.loads(line) for line in (tmp_path / "p" / "predictions.jsonl").read_text().splitlines()]
    assert [(p["id"], p["tokens"], len(p["tags"])) for p in predictions] == [
        (str(i), tokens, len(tokens)) for i, (tokens, _) in enumerate(SENTENCES)]
    assert {t for p in predictions for t in p["tags"]} <= set(NAMES)
    scores = {}
    for name in ("conll", "numbered", "dataset"):
        assert main(["evaluate", "--model", str(model), "--input", str(tagged[name]), "--output",
                     str(tmp_path / f"e-{name}"), "--device", "cpu"]) == 0
        scores[name] = json.loads((tmp_path / f"e-{name}" / "eval_results.json").read_text())
    assert scores["conll"] == scores["numbered"] == scores["dataset"]  # the same examples, the same scores
    capsys.readouterr()


def test_column_flags_choose_other_columns(tagged, vocab, tmp_path, capsys):
    other = _jsonl(tmp_path / "words.jsonl", [{"words": r["tokens"], "labels": r["ner_tags"]} for r in _rows()])
    _finetune("tagging", vocab, tmp_path / "out", other, tagged["conll"], "--tokens-column", "words",
              "--tags-column", "labels")
    task = json.loads((tmp_path / "out" / "best" / "bertkit_task.json").read_text())
    assert (task["tokens_column"], task["tags_column"]) == ("words", "labels")
    # predict/evaluate take the saved columns, or the flags for the file at hand
    assert main(["evaluate", "--model", str(tmp_path / "out" / "best"), "--input", str(tagged["dataset"]),
                 "--output", str(tmp_path / "e"), "--device", "cpu", "--tokens-column", "tokens",
                 "--tags-column", "ner_tags"]) == 0
    assert json.loads((tmp_path / "e" / "eval_results.json").read_text())["examples"] == len(SENTENCES)
    capsys.readouterr()


# --- tagging: bad input ----------------------------------------------------------------------------------

def _tagger(directory: Path, vocab: Path, **settings) -> Path:
    """A fine-tuned tagging directory as `bertkit finetune` writes it (random weights, no training)."""
    tokenizer = WordPieceTokenizer.from_pretrained(vocab)
    task = TaggingTask(TaggingSettings(labels=NAMES, max_seq_length=32, **settings))
    model = BertForTokenClassification(preset("bert-debug", vocab_size=tokenizer.vocab_size, **task.config_overrides()))
    save_finetuned(model, task, tokenizer, directory)
    return directory


def _error(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("bertkit: error: ") and err.count("\n") == 1 and "Traceback" not in err
    return err


def test_tagging_bad_input_is_one_line_naming_file_row_and_column(vocab, tmp_path, capsys):
    model = _tagger(tmp_path / "best", vocab)

    def error(path: Path, *flags: str) -> str:
        return _error(capsys, ["evaluate", "--model", str(model), "--input", str(path), "--output",
                               str(tmp_path / "e"), "--device", "cpu", *flags])

    parquet = tmp_path / "words.parquet"
    pq.write_table(pa.table({"id": ["a"], "words": [["EU"]], "labels": [["B-ORG"]]}), parquet)
    assert (f"{parquet}: no column 'tokens' (--tokens-column); the columns are 'id', 'words', 'labels'; choose "
            "with --tokens-column") in error(parquet)
    assert f"{parquet}: no column 'ner_tags' (--tags-column); the columns are" in error(parquet, "--tokens-column",
                                                                                         "words")
    jsonl = _jsonl(tmp_path / "words.jsonl", [{"words": ["EU"], "labels": ["B-ORG"]}])
    assert f"{jsonl}: no column 'tokens' (--tokens-column); the columns are 'words', 'labels'" in error(jsonl)

    strings = tmp_path / "strings.parquet"  # a sentence as one string, not a list of tokens
    pq.write_table(pa.table({"tokens": ["EU rejects"], "ner_tags": [["B-ORG", "O"]]}), strings)
    assert f"{strings}: column 'tokens' (--tokens-column) holds string, not lists of strings" in error(strings)
    text = _jsonl(tmp_path / "text.jsonl", [{"tokens": "EU rejects", "ner_tags": ["B-ORG", "O"]}])
    assert f"{text}:1: column 'tokens' (--tokens-column) holds str, not a list of strings" in error(text)
    floats = _jsonl(tmp_path / "floats.jsonl", [{"tokens": ["EU"], "ner_tags": [0.5]}])
    assert f"{floats}:1: column 'ner_tags' (--tags-column) holds a list holding float, not a list of tags" in \
        error(floats)

    numbers = tmp_path / "numbers.parquet"  # integer tags, no ClassLabel names
    pq.write_table(pa.table({"tokens": [["EU", "rejects"]], "ner_tags": [[3, 0]]}), numbers)
    assert f"{numbers}:1: column 'ner_tags' (--tags-column) holds the integer tag 3 without a name" in error(numbers)
    numbered = _jsonl(tmp_path / "numbered.jsonl", [{"tokens": ["EU"], "ner_tags": [3]}])
    assert "holds the integer tag 3 without a name; write the tags as strings" in error(numbered)
    pos = _jsonl(tmp_path / "pos.jsonl", [{"tokens": ["EU", "rejects"], "ner_tags": ["NNP", "VBZ"]}])
    assert f"{pos}:1: tag 'NNP' (token 1 of column 'ner_tags') is not a BIO tag (O, B-TYPE, I-TYPE)" in error(pos)
    assert "--text-column applies to classification models; this is a tagging model" in error(pos, "--text-column", "x")


def test_rows_that_are_not_a_sentence_are_skipped_counted_and_named(vocab, tmp_path, capsys, caplog):
    rows = [*_rows(), {"id": "x", "tokens": ["EU", "rejects"], "ner_tags": ["B-ORG"]},
            {"id": "y", "tokens": None, "ner_tags": ["O"]}, {"id": "z", "tokens": [], "ner_tags": []}]
    path = _conll_dataset(tmp_path / "mixed", [r for r in rows if r["tokens"] is not None])
    sentences, skipped = read_tagged(path, "BIO", "tokens", "ner_tags")
    assert len(sentences) == len(SENTENCES)
    assert skipped == [f"{path}:5: 2 tokens in 'tokens' but 1 tags in 'ner_tags'; every token needs one tag",
                       f"{path}:6: no tokens in 'tokens'"]
    jsonl = _jsonl(tmp_path / "mixed.jsonl", rows)
    assert read_tagged(jsonl, "BIO", "tokens", "ner_tags")[1][1] == f"{jsonl}:6: missing 'tokens'"
    _finetune("tagging", vocab, tmp_path / "out", jsonl, path)
    results = json.loads((tmp_path / "out" / "eval_results.json").read_text())
    assert (results["skipped_train"], results["skipped_dev"]) == (3, 2)
    assert f"{jsonl}: skipped 3 of 7 records" in caplog.text and f"{jsonl}:5: 2 tokens" in caplog.text
    model = _tagger(tmp_path / "best", vocab)
    assert main(["evaluate", "--model", str(model), "--input", str(jsonl), "--output", str(tmp_path / "e"),
                 "--device", "cpu"]) == 0
    assert json.loads((tmp_path / "e" / "eval_results.json").read_text())["skipped"] == 3
    capsys.readouterr()


# --- SQuAD: the datasets squad layout reads and scores as its JSON -------------------------------------

CONTEXT = "Paris is the capital of France. Berlin is the capital of Germany."


def _squad_json(path: Path) -> Path:
    """A v2.0 file: answerable questions (one with two gold answers) and an unanswerable one per paragraph."""
    paragraphs = []
    for p in range(2):
        paragraphs.append({"context": CONTEXT, "qas": [
            {"id": f"q1-{p}", "question": "where is paris?",
             "answers": [{"text": "France", "answer_start": 24}, {"text": "France.", "answer_start": 24}]},
            {"id": f"q2-{p}", "question": "where is berlin?", "answers": [{"text": "Germany", "answer_start": 57}]},
            {"id": f"q3-{p}", "question": "who sings?", "answers": [], "is_impossible": True}]})
    path.write_text(json.dumps({"version": "v2.0", "data": [{"title": "cities", "paragraphs": paragraphs}]}))
    return path


def _squad_rows(path: Path) -> list[dict]:
    """SQuAD JSON converted to the `datasets` squad_v2 layout, as `datasets`' squad script converts it."""
    data = json.loads(path.read_text())["data"]
    return [{"id": qa["id"], "title": article["title"], "context": paragraph["context"], "question": qa["question"],
             "answers": {"text": [a["text"] for a in qa["answers"]],
                         "answer_start": [a["answer_start"] for a in qa["answers"]]}}
            for article in data for paragraph in article["paragraphs"] for qa in paragraph["qas"]]


@pytest.fixture
def squad(tmp_path) -> dict[str, Path]:
    source = _squad_json(tmp_path / "dev.json")
    rows = _squad_rows(source)
    jsonl = _jsonl(tmp_path / "dev.jsonl", rows)
    parquet = tmp_path / "dev.parquet"
    pq.write_table(pa.Table.from_pylist(rows), parquet)  # answers: a struct of two lists
    features = datasets.Features({"id": datasets.Value("string"), "title": datasets.Value("string"),
                                  "context": datasets.Value("string"), "question": datasets.Value("string"),
                                  "answers": datasets.Sequence({"text": datasets.Value("string"),
                                                                "answer_start": datasets.Value("int32")})})
    dataset = tmp_path / "squad_hf"
    datasets.Dataset.from_list(rows, features=features).save_to_disk(str(dataset), num_shards=2)
    return {"json": source, "jsonl": jsonl, "zst": _zst(tmp_path / "dev.jsonl.zst", jsonl), "parquet": parquet,
            "dataset": dataset}


@pytest.mark.parametrize("training, version_2", [(False, True), (True, True), (True, False)])
def test_every_squad_table_reads_as_its_json(squad, training, version_2):
    def examples(path):
        found, skipped = read_squad(path, training=training, version_2_with_negative=version_2)
        return found, [s.split(": ", 1)[1] for s in skipped]  # (the file named differs)

    expected = examples(squad["json"])
    assert len(expected[0]) == (4 if training and not version_2 else 6)  # v1.1 training skips the unanswerable
    for name, path in squad.items():
        assert examples(path) == expected, name
    unlabelled = read_squad(squad["parquet"], training=False, version_2_with_negative=True, labelled=False)[0]
    assert [(e.qid, e.answers, e.is_impossible) for e in unlabelled][:1] == [("q1-0", (), False)]


def _squad_model(directory: Path, vocab: Path) -> Path:
    """A fine-tuned SQuAD 2.0 directory (random weights, no training)."""
    tokenizer = WordPieceTokenizer.from_pretrained(vocab)
    task = SquadTask(SquadSettings(max_seq_length=32, doc_stride=8, max_query_length=8, version_2_with_negative=True))
    model = BertForQuestionAnswering(preset("bert-debug", vocab_size=tokenizer.vocab_size))
    save_finetuned(model, task, tokenizer, directory)
    return directory


def test_evaluate_and_predict_score_a_squad_table_as_its_json(squad, vocab, tmp_path, capsys):
    model = _squad_model(tmp_path / "best", vocab)
    results, predictions = {}, {}
    for name, path in squad.items():
        assert main(["evaluate", "--model", str(model), "--input", str(path), "--output", str(tmp_path / name),
                     "--device", "cpu"]) == 0
        results[name] = json.loads((tmp_path / name / "eval_results.json").read_text())
        predictions[name] = (tmp_path / name / "predictions.json").read_text()
    assert {"exact_match", "f1", "best_f1", "HasAns_exact", "NoAns_exact"} <= set(results["json"])
    for name in squad:
        assert results[name] == results["json"] and predictions[name] == predictions["json"], name
    unlabelled = tmp_path / "questions.parquet"  # predict: no answers column
    pq.write_table(pa.Table.from_pylist([{k: v for k, v in r.items() if k != "answers"}
                                         for r in _squad_rows(squad["json"])]), unlabelled)
    assert main(["predict", "--model", str(model), "--input", str(unlabelled), "--output", str(tmp_path / "p"),
                 "--device", "cpu"]) == 0
    assert (tmp_path / "p" / "predictions.json").read_text() == predictions["json"]
    capsys.readouterr()


def test_finetune_squad_on_a_datasets_directory_as_on_its_json(squad, vocab, tmp_path, capsys):
    args = ("--doc-stride", "8", "--max-query-length", "8", "--version-2-with-negative")
    from_json = _finetune("squad", vocab, tmp_path / "json", squad["json"], squad["json"], *args)
    from_table = _finetune("squad", vocab, tmp_path / "table", squad["dataset"], squad["parquet"], *args)
    for results in (from_json, from_table):  # the process's peak memory only grows from one run to the next
        del results["peak_memory"]
    assert from_table == from_json  # the same examples in the same order: the same run
    capsys.readouterr()


def test_squad_table_bad_input_is_one_line(squad, vocab, tmp_path, capsys):
    model = _squad_model(tmp_path / "best", vocab)

    def error(path: Path) -> str:
        return _error(capsys, ["evaluate", "--model", str(model), "--input", str(path), "--output",
                               str(tmp_path / "e"), "--device", "cpu"])

    rows = _squad_rows(squad["json"])
    missing = tmp_path / "missing.parquet"
    pq.write_table(pa.Table.from_pylist([{k: v for k, v in r.items() if k != "answers"} for r in rows]), missing)
    assert (f"{missing}: no column 'answers' (the `datasets` squad layout); the columns are 'id', 'title', "
            "'context', 'question'") in error(missing)
    flat = _jsonl(tmp_path / "flat.jsonl", [{**rows[0], "answers": "France"}])
    assert f"{flat}:1: 'answers' must be {{\"text\": [strings], \"answer_start\": [integers]}}" in error(flat)
    uneven = _jsonl(tmp_path / "uneven.jsonl", [{**rows[0], "answers": {"text": ["France"], "answer_start": []}}])
    assert f"{uneven}:1: 'answers' must be" in error(uneven)
    null = _jsonl(tmp_path / "null.jsonl", [{**rows[0], "question": None}])
    assert f"{null}:1: no 'question' value" in error(null)
    twice = _jsonl(tmp_path / "twice.jsonl", [rows[0], rows[0]])
    assert f"{twice}: question id 'q1-0' appears twice" in error(twice)
    lines = tmp_path / "lines.json"  # JSON lines under a .json name (`Dataset.to_json` writes them)
    lines.write_bytes(squad["jsonl"].read_bytes())
    assert "name the file .jsonl" in error(lines)


def test_other_task_column_flags_are_refused(squad, vocab, tmp_path, capsys):
    model = _squad_model(tmp_path / "best", vocab)
    assert "--tokens-column applies to tagging models; this is a squad model" in _error(capsys, [
        "predict", "--model", str(model), "--input", str(squad["json"]), "--output", str(tmp_path / "p"),
        "--tokens-column", "words"])
    with pytest.raises(BertkitError, match="--no-header applies to classification models; this is a tagging"):
        TaggingTask(TaggingSettings(labels=NAMES)).with_columns(header=False)
