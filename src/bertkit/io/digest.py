"""File hashes, read in 1 MiB blocks so a file of any size costs constant memory: the checkpoint and shard
manifests, a resumed run's data fingerprint and int8's calibration record all hash files this way."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

BLOCK = 1 << 20


def update_with_file(digest: Any, path: str | Path) -> None:
    """Feed the bytes of `path` to `digest` (a hashlib object), a block at a time."""
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(BLOCK), b""):
            digest.update(block)


def file_sha256(path: str | Path) -> str:
    """The sha256 of a file's bytes, in hex."""
    digest = hashlib.sha256()
    update_with_file(digest, path)
    return digest.hexdigest()
