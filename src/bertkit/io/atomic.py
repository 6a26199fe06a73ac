"""Atomic file and directory writes: a reader sees the old content or the new, never half of either.

Design decision: everything is written under a hidden temporary name in the *same* directory as its
target (so the final `os.replace` is one atomic rename on one filesystem), the data is fsynced before
the rename, and the parent directory is fsynced after it, so the new name survives a power cut. A
failed or interrupted write removes its temp file; a process killed outright may leave a hidden
`.NAME.PID-N.tmp` (see `temp_glob`) that callers clean up when they next write there. Model
checkpoints, pre-training shards and manifests, training checkpoints and fine-tuned directories all
go through these few functions.

References: POSIX rename(2) atomicity; fsync(2) on directories.
"""

from __future__ import annotations

import errno
import itertools
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import BinaryIO

from safetensors import SafetensorError

from bertkit.errors import BertkitError

TEMP_SUFFIX = ".tmp"
_counter = itertools.count()


def fsync_path(path: str | Path) -> None:
    """fsync a file or a directory by name (a directory's fsync makes renames inside it durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def temp_glob(name_glob: str) -> str:
    """The glob matching temp files left behind for targets matching `name_glob` (e.g. "shard-*.bin")."""
    return f".{name_glob}.*{TEMP_SUFFIX}"


def failed_write_advice(exc: BaseException, directory: Path) -> str | None:
    """What to do about a write into `directory` that raised `exc`, or None when `exc` is no I/O failure.
    safetensors reports a full disk as SafetensorError("... I/O error: No space left on device ..."), not
    as an OSError."""
    text = str(exc)
    if not (isinstance(exc, OSError) or (isinstance(exc, SafetensorError) and "I/O error" in text)):
        return None
    if getattr(exc, "errno", None) in (errno.ENOSPC, errno.EDQUOT) or any(
            os.strerror(code) in text for code in (errno.ENOSPC, errno.EDQUOT)):
        return f"free space on the disk of {directory}"
    return f"check that {directory} is writable"


def check_writable(path: str | Path, flag: str, directory: bool = True) -> None:
    """Refuse, in one line naming `flag` and `path`, an output bertkit could not write, before any work: a
    read-only or full filesystem, /proc or /sys, a file where a directory is needed. `path` is the output
    directory (`directory`) or file; nothing is left behind: a probe file is made and removed in the nearest
    directory that exists (the output, or the ancestor its directories would be made in)."""
    path = Path(path)
    target = path if directory else path.parent
    existing = next((p for p in (target, *target.parents) if p.exists()), Path("."))
    if not existing.is_dir():
        raise BertkitError(f"{flag} {path}: {existing} is a file, not a directory; choose another {flag}")
    try:
        handle, probe = _make_temp(existing / ".bertkit-write-check")
        os.close(handle)
        probe.unlink()
    except OSError as exc:
        advice = failed_write_advice(exc, existing) or "choose a directory you can write to"
        raise BertkitError(f"{flag} {path}: cannot write in {existing} ({exc.strerror}); {advice}") from None


def check_outside(output: Path, flag: str, path: str | Path | None) -> None:
    """Refuse `flag`'s `path` (an existing file or directory; a preset name or None passes) inside `output`, which
    the command writes and replaces (a model fine-tuned again into its own run directory was deleted by
    --overwrite before it was read; an export would have replaced the directory holding its model)."""
    if path is None or not Path(path).exists():
        return
    inside, out = Path(path).resolve(), Path(output).resolve()
    if out == inside or out in inside.parents:
        raise BertkitError(f"{flag} {path} lies inside --output {output}, which this command writes and replaces; "
                           "copy it elsewhere first, or write to another --output")


def _make_temp(path: Path) -> tuple[int, Path]:
    """A new temp file beside `path`, unique per process and call. Unlike tempfile.mkstemp (mode 0600) it
    is created with mode 0666 minus the umask, so the renamed file has the permissions of a plain write."""
    while True:
        temp = path.with_name(f".{path.name}.{os.getpid()}-{next(_counter)}{TEMP_SUFFIX}")
        try:
            return os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), temp
        except FileExistsError:  # left by a killed process that had the same pid
            continue


def _publish(temp: Path, path: Path) -> None:
    os.replace(temp, path)
    fsync_path(path.parent)


class AtomicFile:
    """A binary file streamed to a temp name beside `path`; `commit()` fsyncs and renames it onto `path`,
    `abort()` deletes it. As a context manager it commits on success and aborts on an exception."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        fd, self.temp = _make_temp(self.path)
        self.file: BinaryIO = os.fdopen(fd, "wb")

    def write(self, data: bytes | memoryview) -> int:
        return self.file.write(data)

    def commit(self) -> None:
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        _publish(self.temp, self.path)

    def abort(self) -> None:
        self.file.close()
        self.temp.unlink(missing_ok=True)

    def __enter__(self) -> AtomicFile:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        if kind is None:
            self.commit()
        else:
            self.abort()


def write_file_atomic(path: str | Path, write: Callable[[Path], object]) -> None:
    """Call `write(temp_path)` (for writers that want a file name, like safetensors' save_file), fsync the
    result, then rename it onto `path` with the mode of a plain write."""
    path = Path(path)
    fd, temp = _make_temp(path)
    mode = os.fstat(fd).st_mode & 0o7777
    os.close(fd)
    try:
        write(temp)
        os.chmod(temp, mode)  # the writer may have recreated the file with its own mode (safetensors: 0600)
        fsync_path(temp)
        _publish(temp, path)
    finally:
        temp.unlink(missing_ok=True)


def write_bytes_atomic(path: str | Path, data: bytes) -> None:
    with AtomicFile(path) as handle:
        handle.write(data)


def write_text_atomic(path: str | Path, text: str) -> None:
    write_bytes_atomic(path, text.encode("utf-8"))


def replace_directory(source: Path, target: Path) -> None:
    """Move the finished directory `source` onto `target` in the same parent. An older `target` is moved
    aside first and deleted only once `source` is in place, so a crash never loses both."""
    fsync_path(source)
    old = None
    if target.exists():
        old = target.with_name(f".{target.name}.{os.getpid()}.old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(target, old)
    _publish(source, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
