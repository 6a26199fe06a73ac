"""Bad input for pre-training data: each rule of the corpus reader (bertkit.io.textlines), counted and never a
traceback.

Invalid UTF-8, empty files and documents, a one-document corpus, one-sentence documents, lines
longer than max_seq_length tokens, a giant line without spaces, binary files, corrupt gzip, bad
JSONL lines; plus the .gz / .jsonl formats and --split-sentences.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import logging
import os
from pathlib import Path

import numpy as np
import pytest

from bertkit.cli import main
from bertkit.data import InstanceSettings, PretrainingDataset, PretrainingDataSettings, build_pretraining_data
from bertkit.errors import BertkitError
from bertkit.io import textlines
from bertkit.tokenizer import WordPieceTokenizer

SENTENCES = [f"the {w} was seen by many people in the city {i}" for i, w in
             enumerate("dog cat bird horse king queen river mountain tree house boat stone".split())]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> WordPieceTokenizer:
    path = tmp_path_factory.mktemp("vocab") / "train.txt"
    path.write_text("\n".join(SENTENCES * 3) + "\n", encoding="utf-8")
    return WordPieceTokenizer.train([path], vocab_size=120, min_frequency=1)


def good_text(n_documents: int = 4, sentences: int = 5) -> str:
    return "\n\n".join("\n".join(SENTENCES[(d + s) % len(SENTENCES)] for s in range(sentences))
                       for d in range(n_documents)) + "\n"


def build(paths, tokenizer, output, strict=False, **options):
    options.setdefault("dupe_factor", 1)
    options.setdefault("max_seq_length", 32)
    return build_pretraining_data(PretrainingDataSettings(
        tuple(map(str, paths)), "(in memory)", str(output), workers=1, strict=strict, quiet=True,
        instances=InstanceSettings(**options)), tokenizer)


def test_invalid_utf8_replaced_and_counted_or_strict_fails(tokenizer, tmp_path):
    path = tmp_path / "bad.txt"
    path.write_bytes(good_text().encode() + b"caf\xe9 au lait\n\xff\xfe broken\n\n" + good_text().encode())
    summary = build([path], tokenizer, tmp_path / "out")["summary"]
    assert summary["invalid_utf8_lines"] == 2 and summary["instances"] > 0
    lineno = good_text().count("\n") + 1
    with pytest.raises(BertkitError, match=rf"bad.txt:{lineno}: invalid UTF-8.*drop --strict"):
        build([path], tokenizer, tmp_path / "strict", strict=True)


def test_empty_files_documents_and_lines(tokenizer, tmp_path):
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "blank.txt").write_text("\n\n   \n\t\n")
    (tmp_path / "good.txt").write_text("\n\n\n" + good_text().replace("\n\n", "\n\n\n\n") + "\x01\x02\u200b\n")
    summary = build([tmp_path / "empty.txt", tmp_path / "blank.txt", tmp_path / "good.txt"], tokenizer,
                    tmp_path / "out")["summary"]
    assert summary["empty_files"] == [str(tmp_path / "empty.txt")]
    assert summary["documents"] == 4  # runs of blank lines make no empty documents
    assert sum(summary["skipped_lines"].values()) == 1  # the control-character line has no tokens
    with pytest.raises(BertkitError, match="no instances"):
        build([tmp_path / "empty.txt", tmp_path / "blank.txt"], tokenizer, tmp_path / "none")


def test_one_document_corpus_and_one_sentence_documents(tokenizer, tmp_path):
    (tmp_path / "one.txt").write_text(good_text(n_documents=1, sentences=12))
    manifest = build([tmp_path / "one.txt"], tokenizer, tmp_path / "one")
    summary = manifest["summary"]
    assert summary["documents"] == 1 and summary["instances"] > 0
    assert summary["random_next_same_document"] == summary["random_next"] > 0  # the original's fallback, counted
    (tmp_path / "single.txt").write_text(good_text(n_documents=6, sentences=1))
    summary = build([tmp_path / "single.txt"], tokenizer, tmp_path / "single")["summary"]
    assert summary["instances"] == 6 and summary["random_next"] == 6  # one sentence: B is always random


def test_lines_longer_than_max_seq_length(tokenizer, tmp_path):
    (tmp_path / "long.txt").write_text(" ".join(SENTENCES * 20) + "\n" + good_text())
    manifest = build([tmp_path / "long.txt"], tokenizer, tmp_path / "out", max_seq_length=32)
    assert manifest["summary"]["truncated_instances"] > 0 and manifest["summary"]["truncated_tokens"] > 1000
    ds = PretrainingDataset(tmp_path / "out")
    assert max(len(ds[i]["input_ids"]) for i in range(len(ds))) <= 32


def test_giant_line_without_spaces_is_cut(tokenizer, tmp_path, monkeypatch):
    monkeypatch.setattr(textlines, "MAX_LINE_BYTES", 4096)
    (tmp_path / "giant.txt").write_text(good_text() + "é" * 150_001 + "\n" + good_text())
    summary = build([tmp_path / "giant.txt"], tokenizer, tmp_path / "out")["summary"]
    assert summary["lines_cut"] == 1 and summary["invalid_utf8_lines"] == 0  # cut on a character boundary
    assert summary["documents"] == 8 - 1  # the giant line joins the last document of the first half


def test_lines_and_jsonl_sentences_over_the_tokenizer_limit_are_cut(tokenizer, tmp_path):
    # Real sizes: a text line of 1 MiB (over the tokenizer's 1,000,000 characters per text) and a
    # JSONL sentence of 1.1 million characters are cut to fit instead of failing the run.
    (tmp_path / "long.txt").write_text(good_text() + "x" * (1 << 20) + "\n\n" + good_text())
    (tmp_path / "long.jsonl").write_text(json.dumps({"text": "a b c.\n" + "y" * 1_100_000 + "\nd e."}) + "\n")
    summary = build([tmp_path / "long.txt", tmp_path / "long.jsonl"], tokenizer, tmp_path / "out")["summary"]
    assert summary["lines_cut"] == 2 and summary["instances"] > 0


@pytest.mark.slow
def test_100_mb_line_without_spaces(tokenizer, tmp_path):
    with open(tmp_path / "huge.txt", "w") as f:
        f.write(good_text())
        for _ in range(100):
            f.write("x" * (1 << 20))
        f.write("\n\n" + good_text())
    summary = build([tmp_path / "huge.txt"], tokenizer, tmp_path / "out")["summary"]
    assert summary["lines_cut"] == 1 and summary["instances"] > 0


def test_binary_and_corrupt_gzip_files_skipped_or_strict(tokenizer, tmp_path):
    (tmp_path / "good.txt").write_text(good_text())
    (tmp_path / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)) * 10)
    (tmp_path / "fake.gz").write_bytes(b"this is not gzip data\n")
    good = gzip.compress(good_text().encode())
    (tmp_path / "truncated.txt.gz").write_bytes(good[: len(good) // 2])
    inputs = [tmp_path / n for n in ("good.txt", "image.png", "fake.gz", "truncated.txt.gz")]
    summary = build(inputs, tokenizer, tmp_path / "out")["summary"]
    skipped = summary["skipped_files"]
    assert skipped["binary file (NUL bytes)"] == [str(tmp_path / "image.png")]
    assert str(tmp_path / "fake.gz") in skipped["unreadable gzip file"]
    assert str(tmp_path / "truncated.txt.gz") in [name for names in skipped.values() for name in names]
    with pytest.raises(BertkitError, match="image.png: binary file"):
        build(inputs, tokenizer, tmp_path / "strict", strict=True)


def test_gzip_and_jsonl_inputs(tokenizer, tmp_path):
    (tmp_path / "a.txt.gz").write_bytes(gzip.compress(good_text().encode()))
    records = [json.dumps({"text": good_text(1, 6), "id": i}) for i in range(3)]
    records += ["not json", json.dumps({"title": "no text"}), json.dumps(["a", "list"]), ""]
    (tmp_path / "b.jsonl").write_text("\n".join(records) + "\n")
    summary = build([tmp_path / "a.txt.gz", tmp_path / "b.jsonl"], tokenizer, tmp_path / "out")["summary"]
    assert summary["documents"] == 4 + 3
    assert summary["skipped_lines"] == {"JSONL line is not valid JSON": 1,
                                        "JSONL record without a string 'text' field": 2}
    with pytest.raises(BertkitError, match=r"b.jsonl:4: JSONL line is not valid JSON"):
        build([tmp_path / "b.jsonl"], tokenizer, tmp_path / "strict", strict=True)


def test_split_sentences(tokenizer, tmp_path):
    paragraph = " ".join(s.capitalize() + "." for s in SENTENCES[:6])
    (tmp_path / "p.txt").write_text(f"{paragraph}\n\n{paragraph}\n")
    summary = build([tmp_path / "p.txt"], tokenizer, tmp_path / "out", split_sentences=True)["summary"]
    assert summary["sentences"] == 12


def test_cli_reports_strict_error_without_traceback(tokenizer, tmp_path, capsys):
    tokenizer.save_pretrained(tmp_path / "tok")
    (tmp_path / "bad.txt").write_bytes(b"fine line\n\xff\n")
    code = main(["data", "pretraining", "--input", str(tmp_path / "bad.txt"), "--tokenizer", str(tmp_path / "tok"),
                 "--output", str(tmp_path / "out"), "--strict", "--workers", "1", "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "bad.txt:2: invalid UTF-8" in err and "Traceback" not in err


def test_a_corpus_without_blank_lines_is_said_once_with_what_it_did_and_the_fix(tokenizer, tmp_path, caplog):
    undivided = tmp_path / "undivided.txt"
    undivided.write_text(good_text(n_documents=8).replace("\n\n", "\n"), encoding="utf-8")
    settings = PretrainingDataSettings((str(undivided),), "(in memory)", str(tmp_path / "nsp"), workers=1, quiet=True,
                                       instances=InstanceSettings(max_seq_length=32, dupe_factor=2))
    with caplog.at_level(logging.WARNING, logger="bertkit.data.pretraining"):
        summary = build_pretraining_data(settings, tokenizer)["summary"]
    assert summary["documents"] == 1 and summary["undivided_files"] == [str(undivided)]
    [said] = [r.getMessage() for r in caplog.records if r.name == "bertkit.data.pretraining"]
    assert said == (f"{undivided}: no blank line between documents, so each file was read as one document: "
                    f"{summary['random_next_same_document']} of {summary['random_next']} random-next sentences came "
                    "from the same document (next-sentence negatives that are not); put a blank line between "
                    "documents, or build --no-nsp data, or give JSONL with one document per line")
    assert summary["random_next_same_document"] > 0
    caplog.clear()
    divided = tmp_path / "divided.txt"
    divided.write_text(good_text(n_documents=8), encoding="utf-8")
    for inputs, name, nsp in (((undivided,), "mlm", False), ((divided,), "docs", True)):
        with caplog.at_level(logging.WARNING, logger="bertkit.data.pretraining"):
            build_pretraining_data(dataclasses.replace(settings, inputs=tuple(map(str, inputs)),
                                                       output=str(tmp_path / name),
                                                       instances=InstanceSettings(max_seq_length=32, nsp=nsp)),
                                   tokenizer)
    assert not caplog.records  # --no-nsp packs across documents; blank lines divide documents


def test_no_instances_names_the_files_skipped_and_why(tokenizer, tmp_path):
    (tmp_path / "notes.txt").write_text(good_text(), encoding="utf-16")
    (tmp_path / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)) * 10)
    why = (r"no instances could be made from 2 file\(s\) \(0 documents with tokens; skipped UTF-16 or UTF-32 text, "
           r"not UTF-8 .*notes\.txt; binary file \(NUL bytes\): .*image\.png")
    with pytest.raises(BertkitError, match=why):
        build([tmp_path / "notes.txt", tmp_path / "image.png"], tokenizer, tmp_path / "out")


def test_bom_less_utf16_in_another_script_is_named_as_utf16_not_as_binary(tokenizer, tmp_path):
    (tmp_path / "ru.txt").write_bytes("Привет, как дела? Это текст на русском языке.\n".encode("utf-16-le") * 60)
    (tmp_path / "zh.txt").write_bytes("太初有道 道与神同在 道就是神\n".encode("utf-16-be") * 60)
    (tmp_path / "weights.bin").write_bytes(np.random.default_rng(0).standard_normal(4096).astype("<f4").tobytes())
    with pytest.raises(BertkitError) as caught:
        build([tmp_path / "ru.txt", tmp_path / "zh.txt", tmp_path / "weights.bin"], tokenizer, tmp_path / "out")
    said = str(caught.value)
    assert "skipped UTF-16 or UTF-32 text" in said and "ru.txt" in said and "zh.txt" in said
    assert "binary file (NUL bytes): " + str(tmp_path / "weights.bin") in said


def test_a_file_of_lines_ended_by_cr_alone_is_skipped_and_named_not_read_as_one_cut_line(tokenizer, tmp_path):
    (tmp_path / "good.txt").write_text(good_text())
    (tmp_path / "mac.txt").write_bytes(good_text().replace("\n", "\r").encode())
    (tmp_path / "windows.txt").write_bytes(good_text().replace("\n", "\r\n").encode())  # CRLF: read
    summary = build([tmp_path / n for n in ("good.txt", "mac.txt", "windows.txt")], tokenizer,
                    tmp_path / "out")["summary"]
    assert summary["skipped_files"] == {textlines.LONE_CR: [str(tmp_path / "mac.txt")]}
    assert "tr '\\r' '\\n'" in textlines.LONE_CR and summary["lines_cut"] == 0


def _children(pid: int) -> list[int]:
    try:
        return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _alive(pid: int) -> bool:
    try:  # a zombie is dead: it holds no memory and no pipes
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="Linux only (prctl)")
def test_workers_die_with_a_parent_killed_outright(tokenizer, tmp_path):
    """kill -9 (the OOM killer) of `data pretraining` leaves no worker behind holding memory and the caller's pipe."""
    import signal
    import subprocess
    import sys
    import time

    tokenizer.save_pretrained(tmp_path / "vocab")
    (tmp_path / "big.txt").write_text(good_text(n_documents=40) * 2000)  # about 30 MB: workers run for a while
    process = subprocess.Popen([sys.executable, "-m", "bertkit", "data", "pretraining", "--input",
                                str(tmp_path / "big.txt"), "--tokenizer", str(tmp_path / "vocab"), "--output",
                                str(tmp_path / "out"), "--workers", "2", "--quiet"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline, workers = time.monotonic() + 60, []
    while time.monotonic() < deadline and len(workers) < 2 and process.poll() is None:
        workers = _children(process.pid)
        time.sleep(0.05)
    assert len(workers) >= 2, "the run ended before its workers were seen"
    process.send_signal(signal.SIGKILL)
    process.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(map(_alive, workers)):
        time.sleep(0.05)
    left = [pid for pid in workers if _alive(pid)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"workers {left} outlived their parent"


def test_a_corpus_the_vocabulary_reads_mostly_as_unk_is_warned_naming_the_tokenizer(tokenizer, tmp_path, caplog):
    (tmp_path / "other.txt").write_text("太初有道 道与神同在。\n道就是神。\n\n" * 20, encoding="utf-8")
    with caplog.at_level(logging.WARNING):
        summary = build([tmp_path / "other.txt"], tokenizer, tmp_path / "out")["summary"]
    assert summary["unk_rate"] > 0.5
    assert "--tokenizer (in memory): " in caplog.text and "of the corpus's tokens are [UNK]" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        build([_good(tmp_path)], tokenizer, tmp_path / "out2")
    assert "[UNK]" not in caplog.text


def _good(tmp_path):
    (tmp_path / "good.txt").write_text(good_text())
    return tmp_path / "good.txt"


def test_a_long_first_line_with_stray_carriage_returns_is_read_not_taken_for_cr_only(tokenizer, tmp_path):
    text = "Intro.\r" + "the cat sat " * 900 + "\r" + "on the mat. " * 100 + "\n\n" + good_text()
    (tmp_path / "web.txt").write_text(text)
    (tmp_path / "bom16.txt").write_bytes("\ufeff".encode("utf-16-le") + ("ab" * 5000).encode("utf-16-le")[:9000:2])
    summary = build([tmp_path / "web.txt", tmp_path / "bom16.txt"], tokenizer, tmp_path / "out")["summary"]
    assert summary["skipped_files"] == {textlines.UTF16_OR_32: [str(tmp_path / "bom16.txt")]}  # a BOM, no NUL
    assert summary["instances"] > 0 and summary["documents"] >= 2
