"""Vocabulary training reads its files as data creation does: one reader (`bertkit.io.textlines`), one set of counts,
the same text (a JSONL file's "text" fields, not its keys and braces).

The same inputs - good text, an empty file, a binary file, a gzip file cut short, a line of invalid
UTF-8 - give `bertkit tokenizer train` (`TrainingStats`) and `bertkit data pretraining`
(`CorpusStats`) the same file counts; `--strict` stops both with the same message. The lines a
corrupt gzip file held before the damage still train the vocabulary.
"""

from __future__ import annotations

import gzip
import json

import pytest

from bertkit.data.corpus import CorpusStats, read_documents
from bertkit.errors import BertkitError
from bertkit.io.textlines import FileCounts
from bertkit.tokenizer.training import TrainingStats, _ShortWords, _training_lines

SHARED = ("files", "input_bytes", "empty_files", "skipped_files", "invalid_utf8_lines")


@pytest.fixture
def inputs(tmp_path):
    (tmp_path / "good.txt").write_bytes(b"the cat sat\n\nthe dog \xff ran\n")
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00" + bytes(range(256)))
    packed = gzip.compress(("".join(f"line {i} of the packed file\n" for i in range(5000))).encode())
    (tmp_path / "cut.txt.gz").write_bytes(packed[: len(packed) // 2])
    return [tmp_path / n for n in ("good.txt", "empty.txt", "image.png", "cut.txt.gz")]


def test_training_and_data_creation_count_the_same_files(inputs):
    training, corpus = TrainingStats(), CorpusStats()
    lines = list(_training_lines(inputs, training, False, _ShortWords(True)))
    list(read_documents(inputs, corpus))
    assert isinstance(training, FileCounts) and isinstance(corpus, FileCounts)
    assert {k: getattr(training, k) for k in SHARED} == {k: getattr(corpus, k) for k in SHARED}
    assert training.files == 4 and training.invalid_utf8_lines == 1
    assert training.empty_files == [str(inputs[1])]
    assert training.skipped_files == {"binary file (NUL bytes)": [str(inputs[2])],
                                      "corrupt gzip data (rest of file)": [str(inputs[3])]}
    assert lines[:2] == ["the cat sat", "the dog \ufffd ran"]  # the corpus reader's lines: stripped, blank ones out
    assert len(lines) > 100 and lines[-1].startswith("line ")  # kept up to the damage


@pytest.mark.parametrize("bad, message", [(2, "image.png: binary file"), (3, "cut.txt.gz: corrupt gzip data")])
def test_strict_stops_both_readers_alike(inputs, bad, message):
    chosen = [inputs[1], inputs[bad]]  # the empty file is counted, never an error
    with pytest.raises(BertkitError, match=message) as from_training:
        list(_training_lines(chosen, TrainingStats(), True, _ShortWords(True)))
    with pytest.raises(BertkitError, match=message) as from_corpus:
        list(read_documents(chosen, CorpusStats(), strict=True))
    assert str(from_training.value) == str(from_corpus.value)


def test_training_reads_the_text_data_creation_reads(tmp_path, monkeypatch, capsys):
    """Issue 29: `tokenizer train` read JSONL as raw text, so '{', '"' and the key 'text' entered the
    vocabulary, while `data pretraining` reads only the "text" field of the same file."""
    from bertkit.cli import main

    records = [{"text": f"the river {w} ran\npast the mill {i}", "source": "kjv"}
               for i, w in enumerate(["swift", "slow", "cold", "wide"] * 10)]
    jsonl = "".join(json.dumps(r) + "\n" for r in records)
    (tmp_path / "a.jsonl").write_text(jsonl, encoding="utf-8")
    (tmp_path / "b.jsonl.gz").write_bytes(gzip.compress(jsonl.encode()))
    (tmp_path / "c.txt").write_text("a plain line\n\nanother document\n", encoding="utf-8")
    (tmp_path / "d.txt.gz").write_bytes(gzip.compress(b"a packed line\n"))
    (tmp_path / "e.jsonl").write_text('{"title": "no text field"}\nnot json\n{"text": "kept"}\n', encoding="utf-8")
    paths = sorted(tmp_path.iterdir())
    fed = list(_training_lines(paths, TrainingStats(), False, _ShortWords(True)))
    corpus = CorpusStats()
    assert fed == [s for document in read_documents(paths, corpus) for s in document]
    assert fed[:2] == ["the river swift ran", "past the mill 0"] and "kept" in fed
    assert corpus.skipped_lines == {"JSONL record without a string 'text' field": 1,
                                    "JSONL line is not valid JSON": 1}

    monkeypatch.chdir(tmp_path)
    assert main(["tokenizer", "train", "--input", "*.jsonl*", "--vocab-size", "200", "--min-frequency", "1",
                 "--output", "vocab", "--no-progress"]) == 0  # a glob pattern, as `data pretraining` takes
    vocab = (tmp_path / "vocab" / "vocab.txt").read_text(encoding="utf-8").split("\n")
    assert "river" in vocab and "swift" in vocab
    assert not {"text", "source", "kjv", "{", "}", '"', ":"} & set(vocab)


def test_the_reader_cuts_lines_where_the_tokenizer_stops_taking_text():
    from bertkit.io.textlines import MAX_LINE_BYTES
    from bertkit.tokenizer import MAX_TEXT_CHARS

    assert MAX_LINE_BYTES == MAX_TEXT_CHARS  # textlines sits below the tokenizer, so it holds its own copy
