"""`bertkit.io.textfile`: what a reader says about a file is said once per file, however often it is read
(issue 51, item 6: fine-tuning reads its training file for the label set and again for the examples)."""

from __future__ import annotations

import logging

import pytest

from bertkit.io.textfile import read_records

MULTILINE_CSV = 'text,label\n"two\nlines",1\n"one line",0\n'


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "line breaks inside quoted fields" in r.getMessage()]


def test_line_breaks_in_quoted_fields_are_said_once_per_file(tmp_path, caplog):
    train = tmp_path / "train.csv"
    train.write_text(MULTILINE_CSV, encoding="utf-8")
    with caplog.at_level(logging.WARNING):
        labels = {fields[1] for _, fields in read_records(train)[1:]}  # the label set
        records = read_records(train)  # the training examples
    assert labels == {"0", "1"} and [fields[0] for _, fields in records[1:]] == ["two\nlines", "one line"]
    assert _warnings(caplog) == [f"{train}: 1 records hold line breaks inside quoted fields (the first starts at "
                                 "line 2); if that is not intended, a quote left open joined rows"]


def test_another_file_or_a_changed_one_is_said_again(tmp_path, caplog):
    first, second = tmp_path / "a.csv", tmp_path / "b.csv"
    for path in (first, second):
        path.write_text(MULTILINE_CSV, encoding="utf-8")
    with caplog.at_level(logging.WARNING):
        read_records(first), read_records(second), read_records(first)
        first.write_text(MULTILINE_CSV + '"three\nmore\nlines",1\n', encoding="utf-8")
        read_records(first)
    assert [message.split(":")[0] for message in _warnings(caplog)] == [str(first), str(second), str(first)]
    assert "2 records" in _warnings(caplog)[-1]
