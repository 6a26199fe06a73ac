"""Build a long-input classification task and a same-domain pre-training corpus from C. H. Spurgeon's Treasury of
David (1869-1885; public domain), a length-study family from text no earlier study used and on which no setting
was chosen.

What it writes into OUTPUT (deterministic for a given --seed and module):

  train.jsonl, dev.jsonl, test.jsonl
                 {"id", "text", "label"} per line: text = one paragraph of the Treasury (Spurgeon's exposition of
                 a verse, or one of the "explanatory notes and quaint sayings" he collected from other writers,
                 1500-1880), its "Verse N." marker, closing attribution and psalm numbers removed; label = the
                 book of the Psalter the psalm belongs to (BOOKS: I 1-41, II 42-72, III 73-89, IV 90-106,
                 V 107-150).
  corpus.txt     pre-training text in Google's format (one sentence per line, a blank line between documents), one
                 document per psalm: its paragraphs in order (as cleaned for the task), except those drawn for
                 dev/test.
  manifest.json  counts (psalms and paragraphs read, skipped with reasons, per-label and per-split sizes, words per
                 example), settings and the sha256 of every output.

How to get the input (Debian's sword-comm-tdavid 2.1-1, fetched once by hand; the script never runs apt), and the
reader of SWORD modules (pysword: `pip install -e ".[study]"`, used by this script only):

    apt-get download sword-comm-tdavid && dpkg -x sword-comm-tdavid_*.deb /tmp/tdavid
    python scripts/tdavid_task_data.py --module /tmp/tdavid/usr/share/sword/modules/comments/zcom/tdavid --output OUT

The module is zCom4 with chapter blocks (ot.czs, ot.czv, ot.czz); pysword reads that layout under the book-block
names (ot.bzs ...), so the script reads it through links of those names in a temporary directory. Licence: the
package's copyright file and the module's conf both say public domain (DistributionLicense=Public Domain).

Design decisions, and why:

* The module holds one entry per psalm (150). Paragraphs are separated by runs of three or more spaces in its
  cleaned text. A psalm is one document of the corpus (its exposition and notes run on from verse to verse), so
  next-sentence pairs come from the same psalm.
* The label is the book of the Psalter (five), not the psalm: 150 psalms are too many for a thousand labels, and
  the books are what a reader can tell from the content. Leaks of the label are removed: the "Verse N." /
  "Verses N-M." / "Ver. N." / "Whole Psalm." / "Title." marker (verse numbers past 41 name Psalm 119), a
  closing attribution ("-- Thomas Manton, on the Hundred and Nineteenth Psalm, 1681": the text after the last
  dash when it is at most --attribution-words words), and the number after "Psalm"/"Ps." (counted).
  Other names are kept.
* Long inputs: paragraphs with fewer than --min-words whitespace words (after cleaning) are skipped and counted;
  longer ones are cut at --max-words words (counted).
* Splits are drawn from one seeded shuffle of the eligible paragraphs: test first, then dev, then train = the next
  --train paragraphs, so dev and test never change with --train. Psalm 119's paragraphs (a fifth of the book) are
  as likely to be drawn as any.
* Corpus: sentences split as scripts/mhcc_task_data.py splits them.
"""

from __future__ import annotations

import argparse
import re
import tempfile
from collections import Counter
from pathlib import Path

from mhcc_task_data import sentences, write_manifest, write_splits

BOOKS = {"I": range(1, 42), "II": range(42, 73), "III": range(73, 90), "IV": range(90, 107), "V": range(107, 151)}
BOOK_OF = {psalm: book for book, psalms in BOOKS.items() for psalm in psalms}
PARAGRAPH_BREAK = re.compile(r"\s{3,}")
MARKER = re.compile(r"^(?:(?:Verses?|Vers?\.) ?\d+(?:\s*[-,\u2013]\s*\d+)*\.?|Whole Psalm\.?|Title\.?)\s*")
PSALM_NUMBER = re.compile(r"\b(Psalms?|Ps\.?)\s+\d+(?:\s*[:.,]\s*\d+)*(?:\s*[-\u2013]\s*\d+)?")
DASH = "\u2014"  # the em dash before an attribution


def read_psalms(module: Path) -> list[str]:
    """The module's entry for each psalm, 1-150 in order."""
    try:
        from pysword.bible import SwordBible
    except ImportError:
        raise SystemExit("scripts/tdavid_task_data.py reads the SWORD module with pysword: "
                         'pip install -e ".[study]" (or pip install pysword)') from None
    names = ("ot.czs", "ot.czv", "ot.czz", "nt.czs", "nt.czv", "nt.czz")
    if not all((module / name).is_file() for name in names):
        raise SystemExit(f"--module {module}: no ot.czv there; give the module's directory "
                         "(.../usr/share/sword/modules/comments/zcom/tdavid)")
    with tempfile.TemporaryDirectory() as links:
        for name in names:
            (Path(links) / name.replace(".c", ".b")).symlink_to((module / name).resolve())
        bible = SwordBible(links, "ztext4", "kjv", "utf-8", "OSIS")
        entries = [text for text in bible.get_iter(books=["Ps"], clean=True) if text.strip()]
    if len(entries) != 150:
        raise SystemExit(f"--module {module}: {len(entries)} psalm entries, expected 150 (sword-comm-tdavid 2.1-1)")
    return entries


def clean(paragraph: str, attribution_words: int, counts: Counter) -> str:
    """The paragraph without its verse marker, its closing attribution and psalm numbers (see the docstring)."""
    text = MARKER.sub("", paragraph.strip())
    head, dash, tail = text.rpartition(DASH)
    if dash and head.strip() and len(tail.split()) <= attribution_words:
        text = head.rstrip()
        counts["attributions removed"] += 1
    text, numbers = PSALM_NUMBER.subn(r"\1", text)
    counts["psalm numbers removed"] += numbers
    return " ".join(text.split())


def paragraphs(entries: list[str], attribution_words: int, counts: Counter) -> list[tuple[int, str]]:
    """(psalm number, cleaned paragraph) of every non-empty paragraph."""
    found = []
    for psalm, entry in enumerate(entries, start=1):
        for paragraph in PARAGRAPH_BREAK.split(entry):
            text = clean(paragraph, attribution_words, counts) if paragraph.strip() else ""
            if text:
                found.append((psalm, text))
    counts["paragraphs"] = len(found)
    return found


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--module", type=Path, required=True, help="The SWORD module's directory (ot.czv ...).")
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=23, help="Seed of the paragraph shuffle behind every split.")
    parser.add_argument("--train", type=int, default=1000, help="At most this many (fewer if not enough).")
    parser.add_argument("--dev", type=int, default=400)
    parser.add_argument("--test", type=int, default=800)
    parser.add_argument("--min-words", type=int, default=60, help="Shorter paragraphs are skipped.")
    parser.add_argument("--max-words", type=int, default=400, help="Longer paragraphs are cut to this many words.")
    parser.add_argument("--attribution-words", type=int, default=25,
                        help="A closing dash followed by at most this many words is an attribution, removed.")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None, entries: list[str] | None = None) -> dict:
    """Build OUTPUT; `entries` (the 150 psalms' texts) stand in for the module in tests."""
    args = parse_args(argv)
    counts: Counter = Counter()
    documents = paragraphs(read_psalms(args.module) if entries is None else entries, args.attribution_words, counts)
    eligible = []
    for i, (psalm, text) in enumerate(documents):
        words = text.split()
        if len(words) < args.min_words:
            counts[f"paragraphs under {args.min_words} words (skipped)"] += 1
            continue
        if len(words) > args.max_words:
            counts[f"paragraphs cut at {args.max_words} words"] += 1
        eligible.append({"id": f"tdavid-{i}", "doc": i, "text": " ".join(words[: args.max_words]),
                         "label": BOOK_OF[psalm]})
    splits = write_splits(eligible, args, "tdavid: paragraphs")
    held = {row["doc"] for name in ("dev", "test") for row in splits[name]}
    by_psalm: dict[int, list[str]] = {}
    for i, (psalm, text) in enumerate(documents):
        if i not in held:
            by_psalm.setdefault(psalm, []).append(text)
    with open(args.output / "corpus.txt", "w") as f:
        for kept in by_psalm.values():  # psalms in order: `documents` is
            f.write("".join("\n".join(sentences(text)) + "\n" for text in kept) + "\n")
    return write_manifest(args, "Debian sword-comm-tdavid 2.1-1 (C. H. Spurgeon's Treasury of David, public domain)",
                          counts, eligible, splits, {"corpus paragraphs": len(documents) - len(held)},
                          shown=("labels",))


if __name__ == "__main__":
    main()
