"""A synthetic long-document classification task whose label is past the first window (docs/finetuning.md,
"Documents longer than the model").

Each document is --words words of consecutive King James verses (the bundled corpus; natural text that
says nothing about the label), with one sentence "the verdict is positive." or "the verdict is negative."
inserted at a random word position of at least --after, so a model that reads only the first --after
words cannot know the label (dev accuracy at chance), while one that reads the whole document can. Neither
"verdict", "positive" nor "negative" occurs in the King James text. Labels are balanced at random.

    python scripts/long_documents_data.py --output synth/ --train 1000 --dev 300 --words 200 --after 64

writes synth/train.jsonl and synth/dev.jsonl (and with --test N, synth/test.jsonl; {"id", "text", "label"}
per line) and synth/corpus.txt (the verses, for `bertkit tokenizer train`). Deterministic for a given --seed.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
from pathlib import Path

from bertkit.assets import kjv_path


def verses() -> list[str]:
    """The bundled corpus's verses, one per non-empty line."""
    with gzip.open(kjv_path("corpus.txt.gz"), "rt", encoding="utf-8") as f:
        return [line.strip() for line in f if line.strip()]


def documents(lines: list[str], count: int, words: int, after: int, rng: random.Random) -> list[dict]:
    rows = []
    for i in range(count):
        start = rng.randrange(len(lines) - 200)
        text: list[str] = []
        for line in lines[start:]:
            text += line.split()
            if len(text) >= words:
                break
        text = text[:words]
        label = rng.choice(["positive", "negative"])
        position = rng.randrange(after, words)
        text[position:position] = ["the", "verdict", "is", f"{label}."]
        rows.append({"id": f"doc-{i}", "text": " ".join(text), "label": label})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--train", type=int, default=1000, help="training documents")
    parser.add_argument("--dev", type=int, default=300, help="dev documents")
    parser.add_argument("--test", type=int, default=0, help="test documents (test.jsonl; 0: none)")
    parser.add_argument("--words", type=int, default=200, help="words of verse text per document")
    parser.add_argument("--after", type=int, default=64, help="the verdict sentence starts at this word or later")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    lines = verses()
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "corpus.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    for name, count in (("train", args.train), ("dev", args.dev), ("test", args.test)):
        if not count:
            continue
        rows = documents(lines, count, args.words, args.after, rng)
        (args.output / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        print(f"{args.output / name}.jsonl: {count} documents")


if __name__ == "__main__":
    main()
