"""Build a long-input classification task and a same-domain pre-training corpus from Matthew Henry's Concise
Commentary on the Whole Bible (1706; public domain), the length study's family that no setting was chosen on.

What it writes into OUTPUT (deterministic for a given --seed and module):

  train.jsonl, dev.jsonl, test.jsonl
                 {"id", "text", "label"} per line: text = one section of commentary (the comment on a run of
                 verses, "Verses 1-10 ...", with that marker removed); label = the part of the Bible the commented
                 book belongs to (GROUPS: law, history, wisdom, major prophets, minor prophets, gospels and Acts,
                 Paul's letters, the other letters and Revelation).
  corpus.txt     pre-training text in Google's format (one sentence per line, a blank line between documents), one
                 document per section, every section and introduction except those drawn for dev/test.
  manifest.json  counts (entries read, duplicates, sections, skipped with reasons, per-label and per-split sizes,
                 words per example), settings and the sha256 of every output.

How to get the input (Debian's sword-comm-mhcc 2.0-1, fetched once by hand; the script never runs apt), and the
reader of SWORD modules (pysword: `pip install -e ".[study]"`, used by this script only):

    apt-get download sword-comm-mhcc && dpkg -x sword-comm-mhcc_*.deb /tmp/mhcc
    python scripts/mhcc_task_data.py --module /tmp/mhcc/usr/share/sword/modules/comments/zcom/mhcc --output OUT

The module's mods.d/mhcc.conf says `ModDrv=zCom4`, but its verse index has 10-byte records (zCom's, not zCom4's
12), so it is read as "ztext". Licence: the package's copyright file and the module's conf both say "Public
Domain--Copy Freely" (DistributionLicense=Public Domain).

Design decisions, and why:

* The module attaches one comment to a verse and links the verses it covers to it, so the same text comes back for
  every verse of a run: each text is kept once, the first time it occurs. A chapter's first comment starts with the
  chapter's outline ("The first sabbath.(1-3) Particulars about the creation.(4-7) ..."); every comment is cut at
  its "Verses N-M" / "Verse N" markers into sections, and the outline before the first marker goes to the corpus
  only. Book introductions (no marker) go to the corpus only: they name their book.
* The label is the part of the Bible, not the book: 66 books are too many for a few thousand labels, and the
  parts are what a reader of the comment can tell (law, prophecy, letters). Names in the text (books, people,
  places) are kept, as any comment uses them.
* Long inputs: sections with fewer than --min-words whitespace words are skipped and counted; longer ones are cut
  at --max-words words (counted).
* Splits are drawn from one seeded shuffle of the eligible sections: test first, then dev, then train = the next
  --train sections (fewer if not enough, reported), so dev and test never change with --train.
* Corpus: sentences split at ". ", "! ", "? " after a lower-case letter or ")" and before a capital or a quote;
  one document per section or introduction.

Measured on sword-comm-mhcc 2.0-1 (seed 17): see the manifest (sections, eligible, per-label counts).
"""

from __future__ import annotations

import argparse
import json
import random
import re
from collections import Counter
from pathlib import Path

from gcide_task_data import sha256, words_summary

GROUPS = {
    "law": "Gen Exod Lev Num Deut",
    "history": "Josh Judg Ruth 1Sam 2Sam 1Kgs 2Kgs 1Chr 2Chr Ezra Neh Esth",
    "wisdom": "Job Ps Prov Eccl Song",
    "major-prophets": "Isa Jer Lam Ezek Dan",
    "minor-prophets": "Hos Joel Amos Obad Jonah Mic Nah Hab Zeph Hag Zech Mal",
    "gospels-acts": "Matt Mark Luke John Acts",
    "paul": "Rom 1Cor 2Cor Gal Eph Phil Col 1Thess 2Thess 1Tim 2Tim Titus Phlm",
    "letters-revelation": "Heb Jas 1Pet 2Pet 1John 2John 3John Jude Rev",
}
GROUP_OF = {book: group for group, books in GROUPS.items() for book in books.split()}
MARKER = re.compile(r"\bVerses? \d+(?:\s*[-,]\s*\d+)*\s+")
# Not gcide_task_data's rule (three lower-case letters before the stop): this one built the study's corpus.
SENTENCE_END = re.compile(r"(?<=[a-z\)][.!?]) (?=[A-Z\"'])")


def read_comments(module: Path) -> tuple[list[tuple[str, str]], Counter]:
    """(OSIS book name, text) of every distinct comment, in Bible order; counts of what was read."""
    try:
        from pysword.bible import SwordBible
    except ImportError:
        raise SystemExit("scripts/mhcc_task_data.py reads the SWORD module with pysword: "
                         'pip install -e ".[study]" (or pip install pysword)') from None
    if not (module / "ot.bzv").is_file():
        raise SystemExit(f"--module {module}: no ot.bzv there; give the module's directory "
                         "(.../usr/share/sword/modules/comments/zcom/mhcc)")
    bible = SwordBible(str(module), "ztext", "kjv", "utf-8", "OSIS")
    books = bible.get_structure().get_books()
    comments, seen, counts = [], set(), Counter()
    for testament in ("ot", "nt"):
        for book in books[testament]:
            for text in bible.get_iter(books=[book.osis_name], clean=True):
                text = " ".join(text.split())
                counts["verse entries"] += 1
                if not text:
                    counts["empty verse entries"] += 1
                elif text in seen:
                    counts["linked verse entries (kept once)"] += 1
                else:
                    seen.add(text)
                    comments.append((book.osis_name, text))
    counts["distinct comments"] = len(comments)
    return comments, counts


def sections(text: str) -> tuple[str, list[str]]:
    """(what precedes the first verse marker: an outline or an introduction, the sections after each marker)."""
    parts = MARKER.split(text)
    return parts[0].strip(), [part.strip() for part in parts[1:] if part.strip()]


def sentences(text: str) -> list[str]:
    return [s.strip() for s in SENTENCE_END.split(text) if s.strip()]


def write_splits(eligible: list[dict], args: argparse.Namespace, what: str) -> dict[str, list[dict]]:
    """Draw test, dev, then train (at most --train: fewer said with `what`) from one --seed shuffle of `eligible`,
    so dev and test never change with --train; write each to OUTPUT/{split}.jsonl ({"id", "text", "label"})."""
    random.Random(args.seed).shuffle(eligible)
    splits = {"test": eligible[: args.test], "dev": eligible[args.test : args.test + args.dev],
              "train": eligible[args.test + args.dev : args.test + args.dev + args.train]}
    if len(splits["train"]) < args.train:
        print(f"{what}: only {len(splits['train'])} left for train (asked {args.train})")
    args.output.mkdir(parents=True, exist_ok=True)
    for name, rows in splits.items():
        with open(args.output / f"{name}.jsonl", "w") as f:
            for row in rows:
                f.write(json.dumps({"id": row["id"], "text": row["text"], "label": row["label"]}) + "\n")
    return splits


def write_manifest(args: argparse.Namespace, source: str, counts: Counter, eligible: list[dict],
                   splits: dict[str, list[dict]], corpus: dict[str, int], shown: tuple[str, ...] = ()) -> dict:
    """Write OUTPUT/manifest.json (source, settings, counts, per-label and per-split sizes, words per example, the
    `corpus` counts, the sha256 of every .jsonl/.txt output); print its summary (and the `shown` keys); return it."""
    manifest = {
        "source": source,
        "settings": {k: str(v) for k, v in vars(args).items()},
        "counts": dict(counts), "eligible": len(eligible),
        "labels": {name: dict(Counter(row["label"] for row in rows)) for name, rows in splits.items()},
        "split sizes": {name: len(rows) for name, rows in splits.items()},
        "words per example": words_summary([len(row["text"].split()) for row in eligible]),
        **corpus,
        "sha256": {p.name: sha256(p) for p in sorted(args.output.glob("*")) if p.suffix in (".jsonl", ".txt")},
    }
    (args.output / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(json.dumps({k: manifest[k] for k in ("eligible", "split sizes", "words per example", *shown)}))
    return manifest


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--module", type=Path, required=True, help="The SWORD module's directory (ot.bzv ...).")
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=17, help="Seed of the section shuffle behind every split.")
    parser.add_argument("--train", type=int, default=2000, help="At most this many (fewer if not enough).")
    parser.add_argument("--dev", type=int, default=400)
    parser.add_argument("--test", type=int, default=800)
    parser.add_argument("--min-words", type=int, default=60, help="Shorter sections are skipped.")
    parser.add_argument("--max-words", type=int, default=400, help="Longer sections are cut to this many words.")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    comments, counts = read_comments(args.module)
    documents: list[tuple[str, str, bool]] = []  # (book, text, is a task section)
    for book, text in comments:
        head, parts = sections(text)
        if head:
            counts["outlines and introductions (corpus only)"] += 1
            documents.append((book, head, False))
        documents.extend((book, part, True) for part in parts)
    candidates = [(i, book, text) for i, (book, text, is_section) in enumerate(documents) if is_section]
    counts["sections"] = len(candidates)
    eligible = []
    for i, book, text in candidates:
        words = text.split()
        if len(words) < args.min_words:
            counts[f"sections under {args.min_words} words (skipped)"] += 1
            continue
        if len(words) > args.max_words:
            counts[f"sections cut at {args.max_words} words"] += 1
        eligible.append({"id": f"mhcc-{i}", "doc": i, "text": " ".join(words[: args.max_words]),
                         "label": GROUP_OF[book], "book": book})
    splits = write_splits(eligible, args, "mhcc: sections")
    held = {row["doc"] for name in ("dev", "test") for row in splits[name]}
    with open(args.output / "corpus.txt", "w") as f:
        for i, (_, text, _) in enumerate(documents):
            if i not in held:
                f.write("\n".join(sentences(text)) + "\n\n")
    return write_manifest(args, "Debian sword-comm-mhcc (Matthew Henry's Concise Commentary, public domain)", counts,
                          eligible, splits, {"corpus documents": len(documents) - len(held)})


if __name__ == "__main__":
    main()
