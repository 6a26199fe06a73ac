"""Every reader of a user's path bounds what it reads before decoding (issue 50's audit, docs/robustness.md): a
link to /dev/zero, a stream or a file far larger than what it should hold is one line naming the file, never a
MemoryError or RecursionError traceback; kept records that are not what bertkit wrote are skipped or refused."""

from __future__ import annotations

import json
import os

import pytest

from bertkit.cli import main
from bertkit.config import BertConfig
from bertkit.errors import BertkitError
from bertkit.io import jsonfile, textfile
from bertkit.io.jsonfile import read_json, read_json_object
from bertkit.io.textfile import read_text
from bertkit.tokenizer import WordPieceTokenizer
from bertkit.train.reporting import read_metrics, truncate_metrics


@pytest.fixture
def zero(tmp_path):
    link = tmp_path / "zero"
    os.symlink("/dev/zero", link)
    return link


def _deep(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text("[" * 200_000 + "]" * 200_000)
    return path


def test_json_files_are_bounded_and_deep_nesting_is_damage(tmp_path, zero, monkeypatch):
    monkeypatch.setattr(jsonfile, "MAX_JSON_BYTES", 1 << 20)  # the bound's logic, without reading 256 MiB
    sparse = tmp_path / "sparse.json"
    with open(sparse, "wb") as handle:
        handle.truncate(2 << 20)
    with pytest.raises(BertkitError, match="sparse.json: more than 1,048,576 bytes"):
        read_json(sparse)
    with pytest.raises(BertkitError, match="zero: a device, not a file"):  # refused before it is opened
        read_json(zero)
    assert read_json_object(zero, damaged={}) == {}
    with pytest.raises(BertkitError, match="nested deeper"):
        read_json(_deep(tmp_path))


def test_config_json_is_bounded_and_deep_nesting_is_one_line(tmp_path, zero):
    sparse = tmp_path / "config.json"
    with open(sparse, "wb") as handle:
        handle.truncate(17 << 20)
    with pytest.raises(BertkitError, match="no config.json holds"):
        BertConfig.from_json_file(sparse)
    with pytest.raises(BertkitError, match="no config.json holds"):  # a stream given as the file: bounded
        BertConfig.from_json_file(zero)
    with pytest.raises(BertkitError, match="not a valid JSON config"):
        BertConfig.from_json_file(_deep(tmp_path))
    with pytest.raises(BertkitError, match="a directory, not a file"):
        BertConfig.from_json_file(tmp_path)


def test_whole_file_readers_are_bounded(zero, tmp_path, monkeypatch):
    monkeypatch.setattr(textfile, "MAX_DATA_FILE_BYTES", 1 << 20)
    with pytest.raises(BertkitError, match="more than 1,048,576 bytes"):
        read_text(zero)
    with pytest.raises(BertkitError, match="the most bertkit reads of a vocabulary"):
        WordPieceTokenizer.from_pretrained(zero)


def _doctor_refuses_probe_file(path, monkeypatch, capsys) -> str:
    """`bertkit doctor` with BERTKIT_PROBE_FILE=path: exits 2; its stderr."""
    from bertkit.runtime import probe

    monkeypatch.setenv("BERTKIT_PROBE_FILE", str(path))
    probe.reset()  # this process's measurements are read again, from the file
    try:
        assert main(["doctor"]) == 2
    finally:
        monkeypatch.delenv("BERTKIT_PROBE_FILE")
        probe.reset()
    return capsys.readouterr().err


def test_a_stream_as_probe_file_is_one_line(zero, tmp_path, capsys, monkeypatch):

    err = _doctor_refuses_probe_file(zero, monkeypatch, capsys)
    assert "BERTKIT_PROBE_FILE" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_metrics_records_that_are_not_objects_are_skipped(tmp_path):
    """A metrics.jsonl line that is not a JSON object (a number, bytes that are not UTF-8, an overlong line)
    gave AttributeError or UnicodeDecodeError tracebacks on resume (issue 50's audit)."""
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step": 1}\n5\n\xff\xfe\n{"a": "' + b"x" * (2 << 20) + b'"}\n{"step": 2}\n{"step": 3')
    assert read_metrics(path) == [{"step": 1}, {"step": 2}]
    truncate_metrics(path, 2)
    assert [json.loads(line) for line in path.read_text().splitlines()] == [{"step": 1}, {"step": 2}]


@pytest.mark.parametrize("module_path", ["/etc", "../elsewhere", 5])
def test_a_sentence_transformers_module_outside_the_directory_is_refused(tmp_path, module_path):
    from bertkit.interop.sentence_transformers import copy_module_files, read_sentence_transformers

    (tmp_path / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": module_path, "type": "sentence_transformers.models.Pooling"}]))
    with pytest.raises(BertkitError, match="is not a folder inside the model directory"):
        read_sentence_transformers(tmp_path)
    with pytest.raises(BertkitError, match="is not a folder inside the model directory"):
        copy_module_files(tmp_path, tmp_path / "copy")


@pytest.mark.parametrize("field, value", [("rate", 0), ("width", 1e400)])
def test_a_probe_file_with_impossible_measurements_is_one_line(tmp_path, capsys, monkeypatch, field, value):
    """Zero rates divided the choices by zero, and a width of 1e400 overflowed (issue 50's attack pass)."""
    from bertkit.runtime import probe

    measured = probe.Measurements.from_json(json.loads(json.dumps({
        "width": 64, "int8": 1.0, "seconds": 1.0, "steady": True,
        "attention": {p: [[128, 1.0, 1.0]] for p in probe.FLOAT_PRECISIONS},
        **{key: dict.fromkeys(probe.FLOAT_PRECISIONS, 1.0) for key in ("train", "linear", "packed")}})))
    data = {"measurements": measured.to_json()}
    if field == "rate":
        data["measurements"]["linear"] = dict.fromkeys(probe.FLOAT_PRECISIONS, 0)
    else:
        data["measurements"]["width"] = value
    path = tmp_path / "probe.json"
    path.write_text(json.dumps(data).replace("Infinity", "1e400"))
    err = _doctor_refuses_probe_file(path, monkeypatch, capsys)
    assert "not a probe result" in err and "Traceback" not in err


def test_metrics_records_with_a_step_that_is_not_a_number_are_skipped(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"kind": "train", "step": "abc"}\n{"step": null}\n{"step": 2}\n')
    truncate_metrics(path, 5)
    assert read_metrics(path) == [{"step": 1}, {"step": 2}]


@pytest.mark.parametrize("name", ["config.json", "vocab.txt", "tokenizer_config.json", "modules.json",
                                  "model.safetensors"])
@pytest.mark.parametrize("kind", ["fifo", "device", "directory", "dangling link"])
def test_a_file_beside_a_model_that_is_not_a_file_is_refused_naming_it_never_read_as_absent(tmp_path, name, kind):
    """A FIFO was read and waited forever (the weights), and a tokenizer_config.json or modules.json that was not a
    file was taken for absent: the model loaded without its lower-casing or pooling."""
    from bertkit.config import preset
    from bertkit.model import BertForPreTraining, BertModel

    directory = tmp_path / "model"
    BertForPreTraining(preset("bert-debug", vocab_size=7)).save_pretrained(
        directory, tokenizer=WordPieceTokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "good", "bad"]))
    (directory / "modules.json").write_text("[]")
    target = directory / name
    target.unlink()
    {"fifo": lambda: os.mkfifo(target), "device": lambda: os.symlink("/dev/zero", target),
     "directory": target.mkdir, "dangling link": lambda: os.symlink(tmp_path / "gone", target)}[kind]()
    said = {"fifo": "a FIFO, not a file", "device": "a device, not a file", "directory": "a directory, not a file",
            "dangling link": "which does not exist"}[kind]
    with pytest.raises(BertkitError, match=f"{name}: .*{said}"):
        WordPieceTokenizer.from_pretrained(directory)
        BertModel.from_pretrained(directory)
        from bertkit.interop.sentence_transformers import read_sentence_transformers
        read_sentence_transformers(directory)


def test_a_run_record_that_is_a_device_is_refused_on_resume_not_skipped(tmp_path, zero):
    """finetune_run.json as a link to /dev/zero was taken for absent: the resume went on unchecked."""
    from bertkit.workflows import run_output

    os.symlink(zero, tmp_path / run_output.RUN_FILE)
    with pytest.raises(BertkitError, match="finetune_run.json: a device, not a file"):
        run_output._check_same_run(tmp_path, {}, set(), {})
