"""Data shipped with bertkit: the King James Bible corpus and a labelled task derived from it.

Built by scripts/make_kjv_assets.py from Debian's bible-kjv package (public domain); see that script
for the format. `kjv_path("corpus.txt.gz")`, `kjv_path("train.tsv")`, ... give the files' paths.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

KJV_FILES = ("corpus.txt.gz", "train.tsv", "dev.tsv", "test.tsv")
KJV_LABELS = ("law", "history", "wisdom", "prophets", "gospels", "letters")


def kjv_path(name: str) -> Path:
    """Path of a bundled KJV file (one of KJV_FILES)."""
    if name not in KJV_FILES:
        raise ValueError(f"unknown bundled file {name!r}; one of {KJV_FILES}")
    return Path(str(resources.files("bertkit") / "assets" / "kjv" / name))
