"""Fine-tuning readers: GLUE layouts, generic tables, CoNLL, SQuAD and SWAG, including bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bertkit.data.conll import TaggedSentence, read_conll, write_conll
from bertkit.data.glue import GLUE_TASKS, glue_task, read_glue, read_table
from bertkit.data.squad import read_squad
from bertkit.data.swag import read_choices
from bertkit.errors import BertkitError
from bertkit.tasks.classification import ClassificationSettings, ClassificationTask

# One labelled row per GLUE task in its own layout (header rows where the task has one).
GLUE_ROWS = {
    "cola": ("", "gj04\t1\t\tThe book was read.", ("The book was read.", None, "1")),
    "sst2": ("sentence\tlabel", "a gripping film \t1", ("a gripping film ", None, "1")),
    "mrpc": ("Quality\t#1 ID\t#2 ID\t#1 String\t#2 String", "1\t11\t12\tHe said \"hi.\tHe greeted.",
             ("He said \"hi.", "He greeted.", "1")),
    "stsb": ("index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore",
             "0\tmain\tf\t2012\t1\tnone\tnone\tA plane takes off.\tAn air plane is taking off.\t5.000",
             ("A plane takes off.", "An air plane is taking off.", "5.000")),
    "qqp": ("id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate", "7\t1\t2\tWhy?\tHow?\t0", ("Why?", "How?", "0")),
    "mnli": ("h", "0\t1\t2\tg\tb1\tb2\tp1\tp2\tThe cat sat.\tA cat sat.\tentailment\tentailment\tneutral",
             ("The cat sat.", "A cat sat.", "neutral")),
    "qnli": ("index\tquestion\tsentence\tlabel", "0\tWho?\tHim.\tentailment", ("Who?", "Him.", "entailment")),
    "rte": ("index\tsentence1\tsentence2\tlabel", "0\tA.\tB.\tnot_entailment", ("A.", "B.", "not_entailment")),
    "wnli": ("index\tsentence1\tsentence2\tlabel", "0\tA.\tB.\t1", ("A.", "B.", "1")),
}


def test_every_glue_task_has_a_layout_test() -> None:
    assert set(GLUE_ROWS) == set(GLUE_TASKS)
    assert glue_task("stsb").is_regression and glue_task("STS-B").name == "stsb"


@pytest.mark.parametrize("name", sorted(GLUE_ROWS))
def test_glue_layouts(tmp_path: Path, name: str) -> None:
    header, row, expected = GLUE_ROWS[name]
    path = tmp_path / "train.tsv"
    path.write_text("\n".join([header, row] if header else [row]) + "\n", encoding="utf-8")
    examples, skipped = read_glue(path, glue_task(name))
    assert [(e.text, e.text_pair, e.label) for e in examples] == [expected] and skipped == []
    assert examples[0].guid == f"{path}:{2 if header else 1}"


def test_glue_short_row_is_skipped_and_counted_unknown_label_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "dev.tsv"
    path.write_text("index\tq\ts\tlabel\n0\tA\tB\tentailment\n1\tbroken row\n", encoding="utf-8")
    examples, skipped = read_glue(path, glue_task("rte"))
    assert len(examples) == 1 and len(skipped) == 1 and f"{path}:3" in skipped[0]
    path.write_text("index\tq\ts\tlabel\n0\tA\tB\tmaybe\n", encoding="utf-8")
    task = ClassificationTask(ClassificationSettings(labels=["entailment", "not_entailment"], glue_task="rte"))
    with pytest.raises(BertkitError, match=rf"{path}:2: unknown label 'maybe'"):
        task.read(path, training=True)
    path.write_text("index\tq\ts\tlabel\n", encoding="utf-8")
    with pytest.raises(BertkitError, match="no examples"):
        read_glue(path, glue_task("rte"))


@pytest.mark.parametrize("suffix", [".csv", ".tsv", ".jsonl"])
def test_generic_tables(tmp_path: Path, suffix: str) -> None:
    rows = [{"review": "good, really", "other": "x", "stars": "pos"}, {"review": "bad", "other": "y", "stars": "neg"}]
    path = tmp_path / f"data{suffix}"
    if suffix == ".jsonl":
        path.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    else:
        sep = "\t" if suffix == ".tsv" else ","
        lines = [sep.join(rows[0])] + [sep.join(f'"{v}"' if sep in v else v for v in r.values()) for r in rows]
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    examples, _skipped = read_table(path, "review", "other", "stars")
    assert [(e.text, e.text_pair, e.label) for e in examples] == [("good, really", "x", "pos"), ("bad", "y", "neg")]
    with pytest.raises(BertkitError, match="no column 'text'"):
        read_table(path, "text")


def test_a_json_array_of_objects_reads_like_jsonl(tmp_path: Path) -> None:
    rows = [{"review": "good, \"really\"", "stars": "pos", "id": 6}, {"review": "bad", "stars": "neg", "id": 7}]
    for name in ("data.json", "data.jsonl"):  # what json.dump and pandas' to_json(orient="records") write
        path = tmp_path / name
        path.write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
        examples, skipped = read_table(path, "review", None, "stars")
        assert [(e.text, e.label, e.id, e.guid) for e in examples] == [
            ('good, "really"', "pos", "6", f"{path}:2"), ("bad", "neg", "7", f"{path}:7")] and not skipped
    path = tmp_path / "broken.json"
    path.write_text('[{"review": "a", "stars": "pos"},\n {"review": "b", "stars": "neg"} {"review": "c"}]')
    with pytest.raises(BertkitError, match=r"broken.json:2: expected ',' or '\]' after the array's element 2"):
        read_table(path, "review", None, "stars")
    path.write_text('[{"review": "a", "stars": "pos"}, ["not", "an object"]]')
    with pytest.raises(BertkitError, match="broken.json:1: expected a JSON object in the array, got list"):
        read_table(path, "review", None, "stars")


@pytest.mark.parametrize("suffix", [".tsv", ".csv"])
def test_a_file_without_a_header_row_reads_with_no_header_and_column_numbers(tmp_path: Path, suffix: str) -> None:
    sep = "\t" if suffix == ".tsv" else ","
    path = tmp_path / f"data{suffix}"
    path.write_text(sep.join(["7", "the film was good", "1"]) + "\n" + sep.join(["8", "bad", "0"]) + "\n"
                    + "9" + sep + "stray\n", encoding="utf-8")
    examples, skipped = read_table(path, "1", None, "-1", "0", header=False)
    assert [(e.text, e.label, e.id) for e in examples] == [("the film was good", "1", "7"), ("bad", "0", "8")]
    assert skipped == [f"{path}:3: 2 {'tab' if suffix == '.tsv' else 'comma'}-separated fields, the first record "
                       "has 3"]
    # Without --no-header the first row is taken for a header: the error says it looks like data, and how to read it.
    with pytest.raises(BertkitError, match=r"no column 'text'.*looks like data, not a header: for a file without a "
                                           r"header row pass --no-header and give the columns by number"):
        read_table(path, "text", None, "label")
    with pytest.raises(BertkitError, match="--no-header reads columns by number .* --text-column 'text' is a name"):
        read_table(path, "text", None, "label", header=False)
    with pytest.raises(BertkitError, match="--label-column 3 is not a column of a record with 3 fields"):
        read_table(path, "1", None, "3", header=False)


def test_no_header_is_for_tables_only(tmp_path: Path) -> None:
    path = tmp_path / "data.jsonl"
    path.write_text('{"text": "a", "label": "1"}\n', encoding="utf-8")
    with pytest.raises(BertkitError, match="--no-header applies to CSV/TSV files"):
        read_table(path, "text", None, "label", header=False)


CONLL = """-DOCSTART- -X- -X- O

EU NNP B-NP B-ORG
rejects VBZ B-VP O
German JJ B-NP B-MISC

Peter NNP B-NP B-PER
Blackburn NNP I-NP I-PER
"""


def test_conll_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "train.txt"
    path.write_text(CONLL, encoding="utf-8")
    sentences = read_conll(path)
    assert [s.words for s in sentences] == [["EU", "rejects", "German"], ["Peter", "Blackburn"]]
    assert sentences[1].labels == ["B-PER", "I-PER"] and sentences[1].location == f"{path}:7"
    out = tmp_path / "pred.txt"
    write_conll(out, sentences, [["B-ORG", "O", "O"], ["B-PER", "I-PER"]])
    lines = out.read_text(encoding="utf-8").splitlines()
    assert lines[:3] == ["-DOCSTART- -X- -X- O O", "", "EU NNP B-NP B-ORG B-ORG"]
    assert lines[-1] == "Blackburn NNP I-NP I-PER I-PER" and len(lines) == len(CONLL.splitlines())  # line for line


def test_conll_missing_label_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.txt"
    path.write_text("EU B-ORG\nrejects\n", encoding="utf-8")
    with pytest.raises(BertkitError, match=rf"{path}:2: token line 'rejects' has no label"):
        read_conll(path)
    assert read_conll(path, labelled=False)[0].words == ["EU", "rejects"]


def _squad(tmp_path: Path, qas: list[dict]) -> Path:
    path = tmp_path / "squad.json"
    document = {"version": "v2.0", "data": [{"title": "t", "paragraphs": [{"context": "Paris is in France.",
                                                                         "qas": qas}]}]}
    path.write_text(json.dumps(document), encoding="utf-8")
    return path


def test_squad_reader_skips_and_reports_mismatched_answers(tmp_path: Path) -> None:
    path = _squad(tmp_path, [
        {"id": "ok", "question": "Where?", "answers": [{"text": "France", "answer_start": 12}]},
        {"id": "bad", "question": "Where?", "answers": [{"text": "France", "answer_start": 3}]},
        {"id": "none", "question": "Who?", "answers": [], "is_impossible": True},
    ])
    examples, skipped = read_squad(path, training=True, version_2_with_negative=True)
    assert [e.qid for e in examples] == ["ok", "none"]
    assert len(skipped) == 1 and "'bad'" in skipped[0] and "does not match the context at character 3" in skipped[0]
    examples, skipped = read_squad(path, training=True, version_2_with_negative=False)
    assert [e.qid for e in examples] == ["ok"] and len(skipped) == 2
    examples, skipped = read_squad(path, training=False, version_2_with_negative=True)
    assert len(examples) == 3 and skipped == []


def test_squad_structure_errors(tmp_path: Path) -> None:
    path = _squad(tmp_path, [{"id": "q", "answers": []}])
    message = r"data\[0\].paragraphs\[0\].qas\[0\] \(id 'q'\) needs a str field 'question'"
    with pytest.raises(BertkitError, match=message):
        read_squad(path, training=False, version_2_with_negative=True)
    path = _squad(tmp_path, [{"question": "a"}])
    with pytest.raises(BertkitError, match=r"qas\[0\] needs a str or int field 'id'"):
        read_squad(path, training=False, version_2_with_negative=True)
    path = _squad(tmp_path, [{"id": "q", "question": "a"}, {"id": "q", "question": "b"}])
    with pytest.raises(BertkitError, match="appears twice"):
        read_squad(path, training=False, version_2_with_negative=True)


def test_swag_csv_and_jsonl(tmp_path: Path) -> None:
    path = tmp_path / "train.csv"
    path.write_text(",video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3,label\n"
                    "0,v,1,x,Someone sits down.,He,gold,eats.,flies.,\"sings, loudly.\",swims.,2\n", encoding="utf-8")
    [example] = read_choices(path)
    assert (example.context, example.start, example.endings, example.label) == \
        ("Someone sits down.", "He", ("eats.", "flies.", "sings, loudly.", "swims."), 2)
    jsonl = tmp_path / "dev.jsonl"
    jsonl.write_text(json.dumps({"context": "c", "endings": ["a", "b"], "label": 5}) + "\n", encoding="utf-8")
    with pytest.raises(BertkitError, match=rf"{jsonl}:1: label 5 is outside 0..1"):
        read_choices(jsonl)


@pytest.mark.parametrize("reader", ["conll", "glue", "squad", "swag"])
def test_readers_report_missing_directory_and_non_utf8_files(tmp_path, reader):
    read = {"conll": read_conll, "glue": lambda p: read_table(p, "text", None, "label"),
            "squad": lambda p: read_squad(p, training=False, version_2_with_negative=False),
            "swag": read_choices}[reader]
    suffix = {"conll": ".conll", "glue": ".tsv", "squad": ".json", "swag": ".csv"}[reader]
    with pytest.raises(BertkitError, match="file not found"):
        read(tmp_path / f"missing{suffix}")
    (tmp_path / f"dir{suffix}").mkdir()
    with pytest.raises(BertkitError, match="is a directory"):
        read(tmp_path / f"dir{suffix}")
    (tmp_path / f"latin1{suffix}").write_bytes(b"caf\xe9\n")
    with pytest.raises(BertkitError, match=r"line 1 \(byte 3\): not valid UTF-8"):
        read(tmp_path / f"latin1{suffix}")
    # the line, and the byte in the whole file, past the decoder's first chunk (it reads 8 KiB at a time)
    (tmp_path / f"late{suffix}").write_bytes(b"plain line\n" * 1000 + b"caf\xe9\n")
    with pytest.raises(BertkitError, match=r"line 1001 \(byte 11003\): not valid UTF-8"):
        read(tmp_path / f"late{suffix}")


def test_conll_predictions_keep_every_input_line_for_paste(tmp_path: Path) -> None:
    """Runs of blank and whitespace-only lines collapsed into one and a blank was added at the end, so the
    predictions no longer lined up with the input (docs/formats.md: every input line kept)."""
    text = "And NN O O\n\n\n\nGod NN O B-PER\n \nsaid NN O O\n"
    path = tmp_path / "in.txt"
    path.write_text(text, encoding="utf-8")
    sentences = read_conll(path)
    out = tmp_path / "pred.txt"
    write_conll(out, sentences, [["O"], ["B-PER"], ["O"]])
    assert out.read_text(encoding="utf-8") == "And NN O O O\n\n\n\nGod NN O B-PER B-PER\n\nsaid NN O O O\n"
    path.write_text("-DOCSTART- O\n\nEU B-ORG\n\t\n\n", encoding="utf-8")  # a marker, blank lines at the end
    write_conll(out, read_conll(path), [["B-ORG"]])  # the marker as many fields as a token line, for conlleval
    assert out.read_text(encoding="utf-8") == "-DOCSTART- O O\n\nEU B-ORG B-ORG\n\n\n"
    path.write_text("-DOCSTART- O\nEU B-ORG\n", encoding="utf-8")  # no blank line after the marker: none added
    write_conll(out, read_conll(path), [["B-ORG"]])
    assert out.read_text(encoding="utf-8") == "-DOCSTART- O O\nEU B-ORG B-ORG\n"
    made = [TaggedSentence(["a"], None, "x:1", ["a"]), TaggedSentence(["b"], None, "x:2", ["b"])]
    write_conll(out, made, [["O"], ["O"]])  # sentences not read from a file still get conlleval's boundary
    assert out.read_text(encoding="utf-8") == "a O\n\nb O\n"
