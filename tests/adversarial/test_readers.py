"""Adversarial inputs for the fine-tuning readers (issues 12 and 13): no row is lost without being counted
and named, bad labels are refused at their line, and odd files give a `BertkitError` naming the file
instead of a traceback. Each test here failed on the code before the fix.

The fine-tuned directories are random bert-debug models written by `save_finetuned` (no training), so
every test runs in about a second.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from bertkit.cli import main
from bertkit.config import preset
from bertkit.data.conll import read_conll
from bertkit.data.glue import glue_task, read_glue, read_table
from bertkit.data.squad import read_squad
from bertkit.data.swag import read_choices
from bertkit.errors import BertkitError
from bertkit.model import BertForSequenceClassification
from bertkit.settings import PredictSettings
from bertkit.tasks.classification import ClassificationSettings, ClassificationTask
from bertkit.tasks.finetuned import save_finetuned
from bertkit.tasks.kinds import build_task
from bertkit.tokenizer import MAX_TEXT_CHARS, WordPieceTokenizer
from bertkit.workflows.finetune import read_reporting
from bertkit.workflows.predict import predict_file

WORDS = "the a film was good bad quoted start plain more inner quotes last def x y eu rejects german".split()
# The reproduction of issue 13: row 1's sentence starts with a quote, row 3 has quotes inside.
QUOTED_TSV = ('id\tsentence1\tsentence2\tlabel\n1\t"quoted start\tdef\t1\n2\tplain\tdef\t0\n'
              '3\tmore "inner" quotes\tx\t1\n4\tlast\ty\t0\n')
QUOTED_TEXTS = ['"quoted start', "plain", 'more "inner" quotes', "last"]


def _tokenizer() -> WordPieceTokenizer:
    return WordPieceTokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, '"', "?", "."])


def _classifier(directory: Path, **settings) -> Path:
    """A fine-tuned classification directory as `bertkit finetune` writes it (random weights)."""
    task = ClassificationTask(ClassificationSettings(labels=["0", "1"], max_seq_length=16, **settings))
    tokenizer = _tokenizer()
    model = BertForSequenceClassification(preset("bert-debug", vocab_size=tokenizer.vocab_size,
                                                 **task.config_overrides()))
    save_finetuned(model, task, tokenizer, directory)
    return directory


@pytest.fixture(scope="module")
def pair_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Fine-tuned on a TSV with sentence1/sentence2/label columns, the layout of QUOTED_TSV."""
    return _classifier(tmp_path_factory.mktemp("pair") / "best", text_column="sentence1",
                       text_pair_column="sentence2")


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


# --- issue 13.1: a field that starts with a quote ----------------------------------------------------

def test_tsv_field_starting_with_a_quote_keeps_every_row(tmp_path: Path) -> None:
    path = _write(tmp_path / "q.tsv", QUOTED_TSV)
    examples, skipped = read_table(path, "sentence1", "sentence2", "label")
    assert [e.text for e in examples] == QUOTED_TEXTS and skipped == []
    assert [e.guid for e in examples] == [f"{path}:{n}" for n in (2, 3, 4, 5)]


def test_csv_quote_left_open_is_an_error_naming_its_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = _write(tmp_path / "q.csv", QUOTED_TSV.replace("\t", ","))
    with pytest.raises(BertkitError, match=rf"{path}:2: malformed CSV quoting .* save the file as tab-separated"):
        read_table(path, "sentence1", "sentence2", "label")
    # Standard quoting still reads: commas, doubled quotes and line breaks inside quoted fields; records
    # that span lines are counted in a warning (an open quote that happens to close at a field's end).
    _write(path, 'text,label\n"a, b",1\n"he said ""hi""",0\n"two\nlines",1\n')
    with caplog.at_level(logging.WARNING):
        examples, skipped = read_table(path, "text", None, "label")
    assert [e.text for e in examples] == ["a, b", 'he said "hi"', "two\nlines"] and skipped == []
    assert f"{path}: 1 records hold line breaks inside quoted fields (the first starts at line 4)" in caplog.text


def test_evaluate_and_predict_file_read_every_quoted_row(pair_model: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture) -> None:
    path = _write(tmp_path / "q.tsv", QUOTED_TSV)
    assert main(["evaluate", "--model", str(pair_model), "--input", str(path), "--output", str(tmp_path / "eval"),
                 "--device", "cpu"]) == 0
    metrics = json.loads(capsys.readouterr().out)
    assert metrics["examples"] == 4 and metrics["skipped"] == 0
    counts = predict_file(PredictSettings(pair_model, path, tmp_path / "pred", device="cpu"))
    assert counts["examples"] == 4 and counts["skipped"] == 0
    assert [p["id"] for p in _jsonl(tmp_path / "pred" / "predictions.jsonl")] == ["1", "2", "3", "4"]


def test_line_separator_characters_inside_a_text_keep_the_row(tmp_path: Path) -> None:
    texts = ["a\u2028b", "c\x85d", "e\x0cf"]  # str.splitlines would cut each of these rows in two
    path = _write(tmp_path / "seps.tsv", "text\tlabel\n" + "".join(f"{t}\t1\n" for t in texts))
    examples, skipped = read_table(path, "text", None, "label")
    assert [e.text for e in examples] == texts and skipped == []


def test_row_with_an_extra_tab_is_skipped_and_named_not_shifted(tmp_path: Path) -> None:
    path = _write(tmp_path / "tabs.tsv", "text\tlabel\ngood\t1\ntab\tinside\t0\n")
    examples, skipped = read_table(path, "text", None, "label")
    assert [(e.text, e.label) for e in examples] == [("good", "1")]
    assert skipped == [f"{path}:3: 3 tab-separated fields, the header has 2"]


# --- issue 12.5: bad labels ----------------------------------------------------------------------

def test_empty_label_is_an_error_naming_file_and_line(tmp_path: Path) -> None:
    train = _write(tmp_path / "train.tsv", "text\tlabel\ngood\t1\nbad\t\nfine\t0\n")
    options = {"text_column": "text", "label_column": "label"}
    with pytest.raises(BertkitError, match=rf"{train}:3: empty label"):
        build_task("classification", train, options)
    glue = _write(tmp_path / "sst.tsv", "sentence\tlabel\ngood\t1\nbad\t \n")
    with pytest.raises(BertkitError, match=rf"{glue}:3: empty label"):
        build_task("classification", glue, {"glue_task": "sst2"}).read(glue, training=True)


@pytest.mark.parametrize(("row", "said"), [
    ('{"text": ["a", "b"], "label": "x"}', "'text' is a list; write a string"),
    ('{"text": {"x": "y"}, "label": "x"}', "'text' is an object; write a string"),
    ('{"text": true, "label": "x"}', "'text' is a boolean (true/false); write a string"),
    ('{"text": 123, "label": "x"}', "'text' is a number; write a string"),
    ('{"text": "fine", "label": 1e400}', "'label' is a number too large to read; write a string or a number"),
    ('{"text": "fine", "label": ["x"]}', "'label' is a list; write a string or a number"),
    ('{"text": "fine", "label": "x", "id": {"a": 1}}', "'id' is an object; write a string or a number")])
def test_a_json_value_that_is_not_text_is_an_error_naming_its_line(tmp_path: Path, row: str, said: str) -> None:
    """str() read these as Python's text of them ("['a', 'b']", "True", "inf", "{'a': 1}"): predicted silently."""
    path = _write(tmp_path / "in.jsonl", '{"text": "good", "label": "x", "id": 7}\n' + row + "\n")
    with pytest.raises(BertkitError, match=rf"^{path}:2: {said}$".replace("(", r"\(").replace(")", r"\)")):
        read_table(path, "text", None, "label")
    if "'label'" in said:
        assert len(read_table(path, "text")[0]) == 2  # unlabelled (predict): the label is not read
    else:
        with pytest.raises(BertkitError, match=rf"{path}:2: "):
            read_table(path, "text")  # unlabelled (predict): the text and id still checked


def test_a_column_the_header_names_twice_is_an_error_naming_it(tmp_path: Path) -> None:
    """`predict` read the last of two `text` columns silently."""
    from bertkit.data.pairs import read_pairs

    path = _write(tmp_path / "in.tsv", "text\ttext\tlabel\nA\tB\tx\n")
    with pytest.raises(BertkitError, match=rf"^{path}:1: the header names column 'text' 2 times; rename the others"):
        read_table(path, "text", None, "label")
    assert read_table(_write(tmp_path / "ok.tsv", "text\tnote\tnote\tlabel\nA\tn\tm\tx\n"), "text", None,
                      "label")[0][0].text == "A"  # an unread column named twice is no harm
    pairs = _write(tmp_path / "pairs.tsv", "anchor\tpositive\tpositive\na\tb\tc\n")
    with pytest.raises(BertkitError, match=r"pairs\.tsv:1: the header names column 'positive' 2 times"):
        read_pairs(pairs, "anchor", "positive")


def test_empty_texts_are_kept_counted_and_said_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """predict and evaluate classified an empty text (read as [CLS] [SEP]) without a word."""
    path = _write(tmp_path / "in.tsv", "text\tlabel\n\tx\ngood\ty\n  \tz\n")
    with caplog.at_level(logging.WARNING, logger="bertkit.data.glue"):
        examples, _ = read_table(path, "text", None, "label")
    assert len(examples) == 3  # every row still gets its prediction
    said = [r.getMessage() for r in caplog.records]
    assert said == [f"{path}: 2 of 3 rows have an empty text (first: {path}:2); each is read as [CLS] [SEP] alone, "
                    "so its prediction says nothing about it: fill them in or drop them"]


def test_json_numbers_and_booleans_stay_labels_and_ids(tmp_path: Path) -> None:
    path = _write(tmp_path / "in.jsonl", '{"text": "a", "label": 1, "id": 7}\n{"text": "b", "label": true}\n'
                  '{"text": "c", "label": 2.5, "id": 3.0}\n')  # (pandas writes integer ids with a gap as 3.0)
    examples, _ = read_table(path, "text", None, "label")
    assert [e.label for e in examples] == ["1", "True", "2.5"]  # as str() always read them
    assert [e.id for e in examples] == ["7", None, "3.0"]


@pytest.mark.parametrize("scheme, tag", [("BIO", "X-FOO"), ("BIO", "E-PER"), ("IOB1", "S-PER"), ("BIOES", "PER")])
def test_tag_outside_the_scheme_is_an_error_naming_file_and_line(tmp_path: Path, scheme: str, tag: str) -> None:
    train = _write(tmp_path / "train.conll", f"EU B-ORG\nrejects O\n\nGerman {tag}\n")
    with pytest.raises(BertkitError, match=rf"{train}:4: label '{tag}' is not a {scheme} tag"):
        build_task("tagging", train, {"tag_scheme": scheme})


def test_bioes_tags_are_accepted_under_bioes(tmp_path: Path) -> None:
    train = _write(tmp_path / "train.conll", "EU S-ORG\nrejects O\nPeter B-PER\nBlackburn E-PER\n")
    assert build_task("tagging", train, {"tag_scheme": "BIOES"}).settings.labels == ["O", "B-PER", "E-PER", "S-ORG"]


def test_unseen_dev_label_is_skipped_counted_and_named(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    train = _write(tmp_path / "train.tsv", "text\tlabel\ngood\tpos\nbad\tneg\n")
    dev = _write(tmp_path / "dev.tsv", "text\tlabel\nfine\tpos\nmeh\tneutral\nawful\tneg\n")
    task = build_task("classification", train, {"text_column": "text", "label_column": "label"})
    report: dict = {}
    with caplog.at_level(logging.WARNING):
        examples = read_reporting(task, dev, False, report, "dev")
    assert [e.label for e in examples] == ["pos", "neg"] and report["skipped_dev"] == 1
    assert f"{dev}:3: unknown label 'neutral'" in caplog.text
    with pytest.raises(BertkitError, match=rf"{dev}:3: unknown label 'neutral'"):
        task.read(dev, training=True)  # in a training file it is an error


def test_unseen_dev_tag_skips_its_sentence_counted_and_named(tmp_path: Path) -> None:
    train = _write(tmp_path / "train.conll", "EU B-ORG\nrejects O\n")
    dev = _write(tmp_path / "dev.conll", "EU B-ORG\n\nPeter O\nBlackburn B-PER\n")
    task = build_task("tagging", train, {"tag_scheme": "BIO"})
    report: dict = {}
    sentences = read_reporting(task, dev, False, report, "dev")
    assert [s.words for s in sentences] == [["EU"]] and report["skipped_dev"] == 1
    assert task.read(dev)[1] == [f"{dev}:4: label 'B-PER' is not one of the model's labels (B-ORG, O), "
                                 "which come from the training file"]


# --- issue 12.6: huge fields, deep JSON, too-long texts ----------------------------------------------

@pytest.mark.parametrize("suffix", [".tsv", ".csv"])
def test_field_over_128_kib_is_read(tmp_path: Path, suffix: str) -> None:
    big = "good " * 40_000  # 200,000 characters; csv's default field limit is 131,072
    sep = "\t" if suffix == ".tsv" else ","
    path = _write(tmp_path / f"big{suffix}", f"text{sep}label\n{big}{sep}1\nbad{sep}0\n")
    examples, skipped = read_table(path, "text", None, "label")
    assert [e.text for e in examples] == [big, "bad"] and skipped == []


@pytest.mark.parametrize("suffix", [".tsv", ".csv", ".jsonl"])
def test_text_longer_than_the_tokenizer_takes_names_file_and_line(pair_model: Path, tmp_path: Path,
                                                                    suffix: str) -> None:
    huge = "a" * (MAX_TEXT_CHARS + 1)
    rows = [("fine", "x"), (huge, "y")]
    if suffix == ".jsonl":
        text = "".join(json.dumps({"sentence1": a, "sentence2": b}) + "\n" for a, b in rows)
    else:
        sep = "\t" if suffix == ".tsv" else ","
        text = f"sentence1{sep}sentence2\n" + "".join(f"{a}{sep}{b}\n" for a, b in rows)
    path = _write(tmp_path / f"long{suffix}", text)
    line = 2 if suffix == ".jsonl" else 3
    with pytest.raises(BertkitError, match=rf"{path}:{line}: ") as error:
        predict_file(PredictSettings(pair_model, path, tmp_path / "out", device="cpu"))
    assert "texts[" not in str(error.value) and "1,000,000" in str(error.value)


def test_squad_question_longer_than_the_tokenizer_takes_names_its_id(tmp_path: Path) -> None:
    qa = {"id": "q7", "question": "?" * (MAX_TEXT_CHARS + 1), "answers": []}
    path = _write(tmp_path / "squad.json", json.dumps({"data": [{"paragraphs": [{"context": "c", "qas": [qa]}]}]}))
    with pytest.raises(BertkitError, match=rf"{path}: id 'q7': the question has 1,000,001 characters"):
        read_squad(path, training=False, version_2_with_negative=False)


def test_json_nested_100k_deep_is_a_bertkit_error(tmp_path: Path) -> None:
    path = _write(tmp_path / "deep.json", "[" * 100_000 + "]" * 100_000)
    with pytest.raises(BertkitError, match=rf"{path}: JSON nested too deeply"):
        read_squad(path, training=True, version_2_with_negative=False)
    rows = _write(tmp_path / "deep.jsonl", '{"text": "ok", "label": "1"}\n' + '{"a": ' * 100_000 + "1" + "}" * 100_000)
    with pytest.raises(BertkitError, match=rf"{rows}:2: JSON nested too deeply"):
        read_table(rows, "text", None, "label")


# --- issue 13.5: inputs shaped like the user's files ----------------------------------------------

def test_wrong_format_training_file_is_named(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    vocab = tmp_path / "vocab"
    _tokenizer().save_pretrained(vocab)
    squad = {"version": "v1.1", "data": [{"title": "t", "paragraphs": [{"context": "Paris is in France.", "qas": [
        {"id": "1", "question": "Where?", "answers": [{"text": "France", "answer_start": 12}]}]}]}]}
    train = _write(tmp_path / "qa.json", json.dumps(squad))
    dev = _write(tmp_path / "dev.conll", "EU B-ORG\nrejects O\n")
    argv = ["finetune", "tagging", "--model", "bert-debug", "--tokenizer", str(vocab), "--train", str(train),
            "--dev", str(dev), "--output", str(tmp_path / "out")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    # A .json file is read as tagging rows (issue 24): the error names the file and the columns it has.
    assert f"{train}: no column 'tokens' (--tokens-column); the columns are 'version', 'data'" in err
    assert str(dev) not in err
    conll = _write(tmp_path / "qa.txt", json.dumps(squad))  # under another name, read as CoNLL: not a tag
    assert main([*argv[:-5], str(conll), *argv[-4:]]) == 2
    err = capsys.readouterr().err
    assert f"{conll}:1: label " in err and "is not a BIO tag" in err and str(dev) not in err


def test_predict_and_evaluate_take_column_flags_and_write_the_id_column(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture) -> None:
    model = _classifier(tmp_path / "best", text_column="text", text_pair_column="text_pair")
    path = _write(tmp_path / "mine.tsv", "uid\tpremise\thypothesis\tgold\nr-17\tthe film\twas good\t1\n"
                                         "r-18\tthe film\twas bad\t0\n")
    columns = ["--text-column", "premise", "--text-pair-column", "hypothesis", "--id-column", "uid"]
    assert main(["predict", "--model", str(model), "--input", str(path), "--output", str(tmp_path / "pred"),
                 "--device", "cpu", *columns]) == 0
    assert [p["id"] for p in _jsonl(tmp_path / "pred" / "predictions.jsonl")] == ["r-17", "r-18"]
    assert main(["evaluate", "--model", str(model), "--input", str(path), "--output", str(tmp_path / "eval"),
                 "--device", "cpu", *columns, "--label-column", "gold"]) == 0
    metrics = json.loads(capsys.readouterr().out.split("\n", 1)[1])  # after predict's one-line summary
    assert metrics["examples"] == 2 and metrics["skipped"] == 0 and 0.0 <= metrics["accuracy"] <= 1.0
    # Without the flags, the error names the columns and flags that predict does have.
    assert main(["predict", "--model", str(model), "--input", str(path), "--output", str(tmp_path / "p2")]) == 2
    err = capsys.readouterr().err
    assert f"{path}:1: no column 'text'" in err and "--text-column" in err


def test_column_flags_are_refused_where_they_do_not_apply(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    single = _classifier(tmp_path / "single")
    path = _write(tmp_path / "in.tsv", "text\tother\nthe film\tgood\n")
    with pytest.raises(BertkitError, match="--text-pair-column 'other': this model was fine-tuned on single texts"):
        predict_file(PredictSettings(single, path, tmp_path / "out", device="cpu", text_pair_column="other"))
    with pytest.raises(BertkitError, match=r"no column 'nope'.*--id-column"):
        predict_file(PredictSettings(single, path, tmp_path / "out", device="cpu", id_column="nope"))


# --- issue 29.3: a UTF-8 byte order mark and Windows line ends ---------------------------------------

def _squad_text() -> str:
    context = 'He said "good film", then left.'
    return json.dumps({"version": "v2.0", "data": [{"title": "t", "paragraphs": [{"context": context, "qas": [
        {"id": "q1", "question": "what did he say?", "answers": [{"text": '"good film"', "answer_start": 8}]}]}]}]},
        indent=1) + "\n"


def _read_corpus(path: Path) -> list:
    from bertkit.data.corpus import CorpusStats, read_documents

    return list(read_documents([path], CorpusStats()))


def _train_vocab(path: Path) -> list[str]:
    """What the vocabulary trainer is fed (its vocabulary breaks ties between merges differently each run)."""
    from bertkit.tokenizer.training import TrainingStats, _ShortWords, _training_lines

    return [line.strip() for line in _training_lines([path], TrainingStats(), False, _ShortWords(True))]


def _extract_lines(path: Path) -> list:
    from bertkit.data.text_inputs import read_lines

    return read_lines(path)


def _predict_rows(path: Path) -> list:
    """What `bertkit predict` reads from a table (a model fine-tuned by column name)."""
    task = ClassificationTask(ClassificationSettings(labels=["0", "1"], text_column="sentence"))
    return task.read(path, labelled=False)[0]


# (reader, file name, content): each file holds quotes, and the first column's name is what a BOM would hide.
BOM_CASES = [
    ("glue-tsv", "train.tsv", 'sentence\tlabel\n"quoted start\t1\nplain "inner" text\t0\n',
     lambda p: read_glue(p, glue_task("sst2"))),
    ("glue-tsv-no-header", "train.tsv", 'src\t1\t*\t"quoted start\nsrc\t0\t*\tplain\n',
     lambda p: read_glue(p, glue_task("cola"))),
    ("generic-csv", "train.csv", 'sentence,label\n"a ""quoted"" word, comma",1\nplain,0\n',
     lambda p: read_table(p, "sentence", None, "label")),
    ("generic-tsv", "train.tsv", 'sentence\tlabel\n"quoted start\t1\nplain\t0\n',
     lambda p: read_table(p, "sentence", None, "label")),
    ("generic-jsonl", "train.jsonl",
     '{"sentence": "a \\"quoted\\" word", "label": "1"}\n{"sentence": "b", "label": "0"}\n',
     lambda p: read_table(p, "sentence", None, "label")),
    ("predict-tsv", "new.tsv", 'sentence\n"quoted start\nplain\n', _predict_rows),
    ("conll", "train.conll", "-DOCSTART- O\n\nEU B-ORG\nrejects O\n\"German\" B-MISC\n\n", read_conll),
    ("squad-json", "dev.json", _squad_text(),
     lambda p: read_squad(p, training=True, version_2_with_negative=False)),
    ("swag-csv", "train.csv", "sent1,sent2,ending0,ending1,label\n"
     '"He said ""hi"".",He,eats.,"sings, loudly.",1\n', read_choices),
    ("swag-jsonl", "train.jsonl", '{"context": "c \\"q\\"", "endings": ["a", "b"], "label": 1}\n',
     read_choices),
    ("pretraining-text", "corpus.txt", 'The "first" sentence.\nThe second.\n\nA new document.\n', _read_corpus),
    ("pretraining-jsonl", "corpus.jsonl", '{"text": "The \\"first\\" sentence.\\nThe second."}\n'
     '{"text": "A new document."}\n', _read_corpus),
    ("tokenizer-training", "corpus.txt", 'Zebra "quoted" words.\nzebra crossing.\n', _train_vocab),
    ("extract-input", "sentences.txt", 'He said "hi". ||| She left.\nplain\n', _extract_lines),
]


@pytest.mark.parametrize(("name", "filename", "content", "read"), BOM_CASES, ids=[c[0] for c in BOM_CASES])
def test_every_reader_takes_a_utf8_bom_and_crlf_line_ends(tmp_path: Path, name: str, filename: str,
                                                           content: str, read) -> None:
    """A file as Excel or Notepad saves it (a UTF-8 byte order mark, CRLF line ends) reads exactly as the
    same file without them: no column '\\ufeffsentence', no 'Unexpected UTF-8 BOM', no '\\r' in a label."""
    plain, windows = tmp_path / "plain", tmp_path / "windows"
    plain.mkdir(), windows.mkdir()
    (plain / filename).write_bytes(content.encode("utf-8"))
    (windows / filename).write_bytes(b"\xef\xbb\xbf" + content.replace("\n", "\r\n").encode("utf-8"))
    expected = repr(read(plain / filename)).replace(str(plain), "DIR")
    assert "\\ufeff" not in expected and "\\r" not in expected
    assert repr(read(windows / filename)).replace(str(windows), "DIR") == expected
