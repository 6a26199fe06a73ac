"""The one JSON reader: a missing or damaged file is the caller's default or one error naming the file."""

from __future__ import annotations

import pytest

from bertkit.errors import BertkitError
from bertkit.io.jsonfile import read_json, read_json_object


def test_a_file_reads_as_its_value(tmp_path):
    (tmp_path / "a.json").write_text('{"x": [1, 2]}', encoding="utf-8")
    assert read_json(tmp_path / "a.json") == {"x": [1, 2]} == read_json_object(tmp_path / "a.json")


@pytest.mark.parametrize(("content", "message"), [
    (None, "b.json: not found; do this"),
    (b"{oops", "b.json: not valid JSON .*; do this"),
    (b"\xff\xfe{}", "b.json: unreadable .*; do this"),
    (b"[1, 2]", r"b.json: not a JSON object \(found list\); do this"),
])
def test_a_missing_or_damaged_file_is_an_error_naming_it(tmp_path, content, message):
    if content is not None:
        (tmp_path / "b.json").write_bytes(content)
    with pytest.raises(BertkitError, match=message):
        read_json_object(tmp_path / "b.json", fix="do this")


def test_or_the_callers_default(tmp_path):
    assert read_json(tmp_path / "missing.json", missing=None) is None
    (tmp_path / "bad.json").write_text("{", encoding="utf-8")
    assert read_json_object(tmp_path / "bad.json", damaged={}) == {}
    (tmp_path / "list.json").write_text("[]", encoding="utf-8")
    assert read_json_object(tmp_path / "list.json", damaged={"rebuilt": True}) == {"rebuilt": True}
    with pytest.raises(BertkitError, match="not valid JSON"):  # only what the caller allows is defaulted
        read_json(tmp_path / "bad.json", missing=None)
