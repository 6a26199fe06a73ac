"""Vocabulary training reads its files as data creation does: one reader (`bertkit.textlines`), one set of counts.

The same inputs - good text, an empty file, a binary file, a gzip file cut short, a line of invalid
UTF-8 - give `bertkit tokenizer train` (`TrainingStats`) and `bertkit data pretraining`
(`CorpusStats`) the same file counts; `--strict` stops both with the same message. The lines a
corrupt gzip file held before the damage still train the vocabulary.
"""

from __future__ import annotations

import gzip

import pytest

from bertkit.data.corpus import CorpusStats, read_documents
from bertkit.errors import BertkitError
from bertkit.textlines import FileCounts
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
    assert lines[:3] == ["the cat sat\n", "\n", "the dog \ufffd ran\n"]
    assert len(lines) > 100 and lines[-1].startswith("line ")  # kept up to the damage


@pytest.mark.parametrize("bad, message", [(2, "image.png: binary file"), (3, "cut.txt.gz: corrupt gzip data")])
def test_strict_stops_both_readers_alike(inputs, bad, message):
    chosen = [inputs[1], inputs[bad]]  # the empty file is counted, never an error
    with pytest.raises(BertkitError, match=message) as from_training:
        list(_training_lines(chosen, TrainingStats(), True, _ShortWords(True)))
    with pytest.raises(BertkitError, match=message) as from_corpus:
        list(read_documents(chosen, CorpusStats(), strict=True))
    assert str(from_training.value) == str(from_corpus.value)
