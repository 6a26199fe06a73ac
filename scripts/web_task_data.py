"""Build a long-input classification task and a same-domain pre-training corpus from the World English Bible (public
domain), a length-study family from text no earlier study used and on which no setting was chosen.

What it writes into OUTPUT (deterministic for a given --seed and module):

  train.jsonl, dev.jsonl, test.jsonl
                 {"id", "text", "label"} per line: text = one passage, consecutive verses of one chapter (their
                 footnotes and markup removed) joined until the passage has at least --min-words words; label =
                 the part of the Bible its book belongs to (scripts/mhcc_task_data.py's GROUPS: law, history,
                 wisdom, major prophets, minor prophets, gospels and Acts, Paul's letters, the other letters and
                 Revelation).
  corpus.txt     pre-training text in Google's format (one sentence per line, a blank line between documents), one
                 document per chapter: its verses in order, except the passages drawn for dev/test.
  manifest.json  counts (books, chapters and verses read, skipped with reasons, per-label and per-split sizes, words
                 per example), settings and the sha256 of every output.

How to get the input (Debian's sword-text-web 426.0-1, fetched once by hand; the script never runs apt), and the
reader of SWORD modules (pysword: `pip install -e ".[study]"`, used by this script only):

    apt-get download sword-text-web && dpkg -x sword-text-web_*.deb /tmp/web
    python scripts/web_task_data.py --module /tmp/web/usr/share/sword/modules/texts/ztext/engWEB2015eb --output OUT

Licence: the module's conf says "Copyright=PUBLIC DOMAIN" (DistributionLicense=Public Domain); "World English
Bible" is a trademark, so a changed text (as here: passages, footnotes removed) is not called by that name.

Design decisions, and why:

* The module's versification is NRSVA, whose deuterocanonical books are listed between the testaments; only the
  66 books of GROUPS are read (the others are counted, not used), so the parts are those of the commentary task.
* Footnotes (`<note>`) are removed with their text: they are the translators' ("Or, ...", "Hebrew ..."), not the
  Bible's. Tags are removed, keeping their text (word tags without a trace, others as a space). The module
  appends its glossary to Revelation's last verse: it is cut there (counted).
* Passages, not verses: a verse is short (median about 25 words), and the family is the long-input one. A
  chapter's verses are joined in order until the passage reaches --min-words words; the rest of a chapter too
  short for a passage goes to the corpus only (counted). Passages over --max-words are cut (counted).
* The label is the part of the Bible, as in the commentary task; names in the text (people, places) are kept, as
  the commentary task keeps them.
* Splits are drawn from one seeded shuffle of the passages: test first, then dev, then train = the next --train
  passages, so dev and test never change with --train.
* Corpus: one document per chapter (verses in order, dev and test passages left out), sentences split as
  scripts/mhcc_task_data.py splits them.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

from mhcc_task_data import GROUP_OF, sentences, write_manifest, write_splits

NOTE = re.compile(r"<note\b[^>]*>.*?</note>|<note\b[^>]*/>", re.S)
WORD_TAG = re.compile(r"</?w\b[^>]*>")  # <w lemma=...>word</w>: the spaces between words are outside it
TAG = re.compile(r"<[^>]+>")
SPACE_BEFORE_PUNCTUATION = re.compile(r" +([,.;:!?\u2019\u201d)])")  # the closing quotes too
GLOSSARY = "World English Bible Glossary"  # the module appends its glossary to the last verse of Revelation


def clean_verse(raw: str) -> str:
    """A verse's OSIS text without footnotes or markup, whitespace normalised; any appendix after GLOSSARY cut."""
    text = TAG.sub(" ", WORD_TAG.sub("", NOTE.sub(" ", raw)))
    text = SPACE_BEFORE_PUNCTUATION.sub(r"\1", " ".join(text.split()))
    return text.split(GLOSSARY)[0].strip()


def read_chapters(module: Path) -> tuple[list[tuple[str, int, list[str]]], Counter]:
    """(OSIS book name, chapter, its cleaned non-empty verses) for every chapter of GROUPS' books, in Bible order;
    counts of what was read and left out."""
    try:
        from pysword.bible import SwordBible
    except ImportError:
        raise SystemExit("scripts/web_task_data.py reads the SWORD module with pysword: "
                         'pip install -e ".[study]" (or pip install pysword)') from None
    if not (module / "ot.bzv").is_file():
        raise SystemExit(f"--module {module}: no ot.bzv there; give the module's directory "
                         "(.../usr/share/sword/modules/texts/ztext/engWEB2015eb)")
    bible = SwordBible(str(module), "ztext", "nrsva", "utf-8", "OSIS")
    books = bible.get_structure().get_books()
    chapters, counts = [], Counter()
    for testament in ("ot", "nt"):
        for book in books[testament]:
            if book.osis_name not in GROUP_OF:
                counts["books outside the 66 (not read)"] += 1
                continue
            counts["books"] += 1
            for chapter in range(1, book.num_chapters + 1):
                raws = list(bible.get_iter(books=[book.osis_name], chapters=[chapter], clean=False))
                counts["appendices cut (the glossary)"] += sum(GLOSSARY in raw for raw in raws)
                verses = [clean_verse(raw) for raw in raws]
                counts["verses"] += len(verses)
                counts["empty verses"] += sum(not verse for verse in verses)
                chapters.append((book.osis_name, chapter, [verse for verse in verses if verse]))
    counts["chapters"] = len(chapters)
    return chapters, counts


def passages(verses: list[str], min_words: int) -> tuple[list[str], str]:
    """(the chapter's passages: consecutive verses joined until each has at least `min_words` words, what is left
    at the chapter's end, too short for one)."""
    done, current, words = [], [], 0
    for verse in verses:
        current.append(verse)
        words += len(verse.split())
        if words >= min_words:
            done.append(" ".join(current))
            current, words = [], 0
    return done, " ".join(current)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--module", type=Path, required=True, help="The SWORD module's directory (ot.bzv ...).")
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=31, help="Seed of the passage shuffle behind every split.")
    parser.add_argument("--train", type=int, default=1000, help="At most this many (fewer if not enough).")
    parser.add_argument("--dev", type=int, default=400)
    parser.add_argument("--test", type=int, default=800)
    parser.add_argument("--min-words", type=int, default=100, help="A passage joins verses until this many words.")
    parser.add_argument("--max-words", type=int, default=400, help="Longer passages are cut to this many words.")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    chapters, counts = read_chapters(args.module)
    documents: list[list[tuple[int | None, str]]] = []  # per chapter: (passage index or None for a rest, text)
    eligible = []
    for book, chapter, verses in chapters:
        found, rest = passages(verses, args.min_words)
        document: list[tuple[int | None, str]] = []
        for text in found:
            words = text.split()
            if len(words) > args.max_words:
                counts[f"passages cut at {args.max_words} words"] += 1
            document.append((len(eligible), text))
            eligible.append({"id": f"web-{book}-{chapter}-{len(document)}", "index": len(eligible),
                             "text": " ".join(words[: args.max_words]), "label": GROUP_OF[book]})
        if rest:
            counts[f"chapter ends under {args.min_words} words (corpus only)"] += 1
            document.append((None, rest))
        documents.append(document)
    counts["passages"] = len(eligible)
    splits = write_splits(eligible, args, "web: passages")
    held = {row["index"] for name in ("dev", "test") for row in splits[name]}
    written = 0
    with open(args.output / "corpus.txt", "w") as f:
        for document in documents:
            kept = [text for index, text in document if index not in held]
            if kept:
                f.write("\n".join(sentence for text in kept for sentence in sentences(text)) + "\n\n")
                written += 1
    return write_manifest(args, "Debian sword-text-web (the World English Bible, public domain)", counts, eligible,
                          splits, {"corpus documents": written})


if __name__ == "__main__":
    main()
