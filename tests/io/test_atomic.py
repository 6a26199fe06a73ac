"""Tests of bertkit.io.atomic: all-or-nothing file and directory writes, no leftovers, plain permissions."""

from __future__ import annotations

import os
import stat

import pytest

from bertkit.io.atomic import (
    AtomicFile,
    fsync_path,
    replace_directory,
    temp_glob,
    write_bytes_atomic,
    write_file_atomic,
    write_text_atomic,
)


def test_write_bytes_and_text_replace_content_and_leave_no_temp(tmp_path):
    target = tmp_path / "a.json"
    write_text_atomic(target, "old\n")
    write_bytes_atomic(target, b"new\n")
    assert target.read_bytes() == b"new\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]


def test_failed_writer_keeps_the_old_file_and_removes_its_temp(tmp_path):
    target = tmp_path / "model.safetensors"
    target.write_bytes(b"previous")

    def crash(path):
        path.write_bytes(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_file_atomic(target, crash)
    assert target.read_bytes() == b"previous"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.safetensors"]


def test_atomic_file_is_invisible_until_commit_and_abort_leaves_nothing(tmp_path):
    target = tmp_path / "shard-00000.bin"
    handle = AtomicFile(target)
    handle.write(b"abc")
    assert not target.exists()
    assert [p.name for p in tmp_path.glob(temp_glob("shard-*.bin"))] == [handle.temp.name]
    handle.commit()
    assert target.read_bytes() == b"abc"
    with pytest.raises(RuntimeError), AtomicFile(target) as second:
        second.write(b"xyz")
        raise RuntimeError("interrupted")
    assert target.read_bytes() == b"abc"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shard-00000.bin"]


def test_files_get_umask_permissions_not_mkstemp_0600(tmp_path):
    umask = os.umask(0o022)
    try:
        write_text_atomic(tmp_path / "vocab.txt", "[PAD]\n")
    finally:
        os.umask(umask)
    assert stat.S_IMODE((tmp_path / "vocab.txt").stat().st_mode) == 0o644


def test_replace_directory_swaps_in_the_new_one(tmp_path):
    old, new = tmp_path / "best", tmp_path / ".best.staging"
    old.mkdir()
    (old / "config.json").write_text("old")
    new.mkdir()
    (new / "config.json").write_text("new")
    replace_directory(new, old)
    assert (old / "config.json").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best"]
    fsync_path(old)  # directories can be fsynced by name
