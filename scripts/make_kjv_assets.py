"""Build the bundled King James Bible assets from Debian's bible-kjv package (run once, by developers).

    apt-get install bible-kjv && python scripts/make_kjv_assets.py

Writes src/bertkit/assets/kjv/:
  corpus.txt.gz   pre-training text in the original format: one verse per line (the verse is the
                  "sentence" unit), a blank line between documents (chapters). Held-out chapters excluded.
  train.tsv, dev.tsv, test.tsv   a labelled task from the same text: which of six parts of the Bible a
                  verse comes from. Splits are by chapter, so no dev/test verse's chapter is in the
                  pre-training text or in train.
The King James Version is in the public domain (outside the UK). The output is deterministic.
"""

from __future__ import annotations

import gzip
import random
import re
import subprocess
from collections import Counter
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "src" / "bertkit" / "assets" / "kjv"
VERSE = re.compile(r"^(\d?[A-Za-z]+)(\d+):(\d+) (.*)$")
GROUPS = [  # (label, first book, last book) in the bible-kjv abbreviations
    ("law", "Ge", "Deu"),
    ("history", "Josh", "Est"),
    ("wisdom", "Job", "SSol"),
    ("prophets", "Isa", "Mal"),
    ("gospels", "Mat", "Acts"),
    ("letters", "Rom", "Rev"),
]
TRAIN_SIZE, DEV_SIZE, TEST_SIZE = 4000, 1000, 1000
HELD_OUT_FRACTION = 0.12  # of chapters, for dev + test


def read_chapters() -> list[tuple[str, list[str]]]:
    text = subprocess.run(["bible", "-f", "Gen1:1-Rev22:21"], capture_output=True, text=True, check=True).stdout
    chapters: dict[tuple[str, str], list[str]] = {}
    for line in text.splitlines():
        match = VERSE.match(line)
        if not match:
            raise ValueError(f"unexpected line: {line!r}")
        book, chapter, _, verse = match.groups()
        chapters.setdefault((book, chapter), []).append(verse.strip())
    return [(book, verses) for (book, _), verses in chapters.items()]


def label_of(books: list[str]) -> dict[str, str]:
    labels, current = {}, None
    for book in books:
        for label, first, _ in GROUPS:
            if book == first:
                current = label
        labels[book] = current
    return labels


def main() -> None:
    chapters = read_chapters()
    books = list(dict.fromkeys(book for book, _ in chapters))
    labels = label_of(books)
    rng = random.Random(1810_04805)
    order = list(range(len(chapters)))
    rng.shuffle(order)
    held = set(order[: int(len(order) * HELD_OUT_FRACTION)])
    OUT.mkdir(parents=True, exist_ok=True)
    with gzip.GzipFile(OUT / "corpus.txt.gz", "wb", mtime=0) as raw:
        documents = ["\n".join(verses) for i, (_, verses) in enumerate(chapters) if i not in held]
        raw.write(("\n\n".join(documents) + "\n").encode("utf-8"))
    train_pool = [(v, labels[b]) for i, (b, vs) in enumerate(chapters) if i not in held for v in vs]
    held_pool = [(v, labels[b]) for i, (b, vs) in enumerate(chapters) if i in held for v in vs]
    rng.shuffle(train_pool)
    rng.shuffle(held_pool)
    splits = {"train": train_pool[:TRAIN_SIZE], "dev": held_pool[:DEV_SIZE],
              "test": held_pool[DEV_SIZE:DEV_SIZE + TEST_SIZE]}
    for name, rows in splits.items():
        with open(OUT / f"{name}.tsv", "w", encoding="utf-8") as handle:
            handle.write("text\tlabel\n")
            handle.writelines(f"{text}\t{label}\n" for text, label in rows)
        print(name, len(rows), dict(sorted(Counter(label for _, label in rows).items())))
    print("corpus documents:", len(documents), "verses:", sum(d.count("\n") + 1 for d in documents))


if __name__ == "__main__":
    main()
