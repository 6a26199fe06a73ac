"""Build a long-input classification task and a same-domain pre-training corpus from Webster's 1913 (GCIDE).

For the pre-training study's question "does pre-training help fine-tuning on LONG inputs?": the task's texts
are whole dictionary entries of at least --min-words words (default 100), cut at --max-words (400).

What it writes into OUTPUT (deterministic for a given --seed and input files):

  train.jsonl, dev.jsonl, test.jsonl
                 {"id", "text", "label"} per line: text = one dictionary entry (every sense of one headword) with
                 its subject-field tags, headword lines, pronunciations and etymologies removed; label = the
                 entry's most frequent subject-field tag ("Zool.", "Bot.", "Law", ...; --labels of them).
  corpus.txt     pre-training text in Google's format (one sentence per line, a blank line between documents),
                 one document per dictionary entry, every entry except those drawn for dev/test, cleaned exactly
                 as the task's texts are (so tags are removed there too).
  manifest.json  counts (entries read, skipped with reasons, per-label and per-split sizes, words per example),
                 leak checks, settings and the sha256 of every input and output.

How to get the inputs (Debian's dict-gcide 0.48.5+nmu2, fetched once by hand; the script never runs apt):

    apt-get download dict-gcide && dpkg -x dict-gcide_*.deb /tmp/gcide
    python scripts/gcide_task_data.py --gcide /tmp/gcide/usr/share/dictd --output /tmp/gcide-data

The data is in dictd format: gcide.dict.dz (gzip-readable) holds the entries, gcide.index has one line per
headword, "headword<TAB>offset<TAB>length" with offset and length as base-64 numbers in dictd's alphabet
(A-Z a-z 0-9 + /); several headwords can point at one entry, which is read once.

Licences (/usr/share/doc/dict-gcide/copyright and README.dictionary): GCIDE, the GNU Collaborative International
Dictionary of English, is "free software; you can redistribute it and/or modify it under the terms of the GNU
General Public License ... version 2, or (at your option) any later version". Its base text, Webster's Revised
Unabridged Dictionary (C. & G. Merriam Co., 1913), is in the public domain; what the volunteers added
(corrections, new senses marked [PJC] and the like, and the markup) is what the GPL covers, so files derived from
the package are treated as GPL-2+ text, not as public domain (none is committed to this repository). GCIDE also
merged definitions from WordNet 1.5 (marked [WordNet 1.5], [WordNet sense N]), which come from Princeton under the
WordNet licence; this script leaves them out (below).

Design decisions, and why:

* The label is a subject-field tag, because Webster's editors put one on most technical senses ("(Bot.) A plant
  ...", "{Ground beetle} (Zool.), one of ..."): a human-assigned topic label available for thousands of long
  entries, which no other free long-text source gives us. An entry's label is its most frequent tag (ties: the
  first in the entry), counting every tag of every sense and sub-phrase; entries whose label is not among the
  --labels most frequent ones (each with at least --min-label-entries long entries) are skipped and counted.
  Tags are the parentheticals shaped like one - capitalised words or abbreviations, "&", "and", "of" ("(Zool.)",
  "(R. C. Ch.)", "(Bot. & Zool.)") - that occur at least TAG_MIN_COUNT times in the dictionary, minus the few
  such parentheticals that are citations, formulas or register labels (NOT_DOMAIN). Spelling variants are merged
  (TAG_ALIASES: "Zo[\"o]l." and "Zool" are "Zool.", "Music" is "Mus."); compound and qualified tags ("Eng. Law",
  "Bot. & Zool.", "Physiol. Chem.") stay tags of their own, not merged into "Law" or "Bot.".
* Leakage: every tag is removed from the text - every vocabulary tag, and every tag-shaped parenthetical that
  contains a label's word (so "(Zool. & Anat.)" goes too even if rare). The headword lines (headword, the
  pronunciation \\...\\ and its respelling, part of speech, the [etymology]) and the provenance markers
  ([1913 Webster], [PJC]) are removed as well; the headword still occurs in the body where the dictionary uses
  it (sub-phrases such as {Ground beetle}), as any usage would. The manifest counts the texts in which a label
  still appears as a parenthetical or as a bare word ("Zool."), as a check.
* WordNet 1.5 senses are dropped: an entry is cut into the pieces that end at each provenance marker, and a piece
  whose marker names WordNet but not Webster or the Century Dictionary goes (its label tags too, since the label
  is computed on the text the model sees). Besides the licence, the study's other corpus and tasks are made
  from WordNet 3.0 glosses (scripts/study_data.py), many of which are these glosses' descendants: keeping them
  would put WordNet test text into this corpus. --keep-wordnet keeps them.
* Long inputs: texts with fewer than --min-words whitespace words are skipped; longer ones are cut at
  --max-words words (counted). Identical texts (after cleaning) are kept once, the first in dictionary order.
* Splits are drawn from one seeded shuffle of the eligible entries (in dictionary order): test first, then dev, then
  train = the next --train entries (fewer if not enough, reported), so a smaller --train is a prefix of a larger
  one and dev/test never change with it. Dev/test entries whose label is not in train are dropped and counted.
* Corpus: every entry of the dictionary (tagged or not, long or short) except those drawn for dev/test, cleaned
  exactly like the task's texts but not cut at --max-words. Sentences are split naively, at ". ", "! ", "? "
  after at least three lower-case letters and before a capital, so abbreviations such as "L.", "Gr.", "cf." and
  "n." do not end a sentence. Lines equal to a sentence of a held-out entry are dropped (quotations repeat
  across entries) and counted. One document per entry: many are one line, which gives next-sentence prediction
  only random-next pairs for them (scripts/study_data.py packs neighbourhoods for that reason; this corpus
  does not, one entry being the natural document).

Measured on dict-gcide 0.48.5+nmu2 (seed 17): 126,236 entries, 34,926 with a tag once WordNet's 9,602 pieces
are gone; 3,001 eligible at --min-words 100 (18 labels with >= 50 entries; Zool. about a fifth), so train is
1,001, not 4,000; --min-words 70 gives 4,565 eligible (20 labels), train 2,565. The corpus is about 19 MB, 117k
documents, 70% of them one line.

Reference: dictd(8) and dictfmt(1) (index format); GCIDE 0.48, README.dictionary.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import random
import re
import statistics
import unicodedata
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

DICTD_DIGITS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
TAG_WORD = r"[A-Z][A-Za-z\[\]\"'`^=~-]*\.?"
TAG = re.compile(  # "(Zool.)", "(R. C. Ch.)", "(Chem.Phys.)", "(Geom., Drawing, etc.)", "(Chem. & the Arts)"
    rf"\(\s*({TAG_WORD}(?:(?:,?\s+|(?<=\.))(?:{TAG_WORD}|&|and|of|the|etc\.)){{0,5}})\s*\)")
TAG_MIN_COUNT = 10
TAG_ALIASES = {
    'Zo["o]l.': "Zool.", "Zool": "Zool.", "Law.": "Law", "Mining.": "Mining", "Music": "Mus.", "Printing": "Print.",
    "Optics": "Opt.", "Physics.": "Physics", "Med": "Med.", "R.C.Ch.": "R. C. Ch.", 'A["e]ronautics': "Aeronautics",
    "Geography": "Geog.", "Railroads": "Railroad", "Botany": "Bot.", "Biology": "Biol.", "Grammar": "Gram.",
    "Horology": "Horol.", "Meteorol.": "Meteor.", "Steam Boiler": "Steam Boilers", "Feud. Law": "Feudal Law",
    "Eng. Universities": "Eng. Univ.", "Gunnery": "Gun.", "Metallurgy": "Metal.", "Electricity": "Elec.",
    "Surveying": "Surv.",
}
NOT_DOMAIN = {  # tag-shaped but not a subject field: citations, chemical groups, register and usage labels
    "OH", "Thucyd.", "More's Utopia", "Rev. Ver.", "Encyc. of Music", "Cyc. of India", "Law Dict.", "Colloq.",
    "Obs.", "Fig.",
}
PROVENANCE = re.compile(r"\[\s*\+?\s*(?:1913 Webster|Webster 1913|WordNet|PJC|Century Dict)[^\[\]]*\][ \t]*")
POS_TOKEN = re.compile(r"(?:[a-z]{1,5}\.|&)")  # "n.", "v.", "t.", "adv.", "pl." after a header's etymology
SENTENCE_END = re.compile(r"(?<=[a-z]{3}[.!?])\s+(?=[A-Z])")
MAX_GROUP = 3000  # an unclosed bracket in a header is not followed further than this
HEADWORD = re.compile(r"\s*([^\\\n]+?)\s*\\")  # "Wormseed" of "Wormseed \\Worm"seed`\\, n. ..."
ACCENT = re.compile(r"\[([\"'`^~=,.])([A-Za-z])\]")  # GCIDE's ASCII codes: ["o] = ö, ['e] = é, [,c] = ç
COMBINING = {'"': "\u0308", "'": "\u0301", "`": "\u0300", "^": "\u0302", "~": "\u0303", "=": "\u0304",
             ",": "\u0327", ".": "\u0307"}
LIGATURES = {"[ae]": "æ", "[AE]": "Æ", "[oe]": "œ", "[OE]": "Œ"}


# --- reading the dictionary --------------------------------------------------------------------------------

def dictd_number(code: str) -> int:
    value = 0
    for char in code:
        value = value * 64 + DICTD_DIGITS.index(char)
    return value


@dataclass(frozen=True)
class Entry:
    key: str
    """The headword and the entry's offset ("Sail@30580271"): unique (one entry per offset) and readable."""
    raw: str


def read_entries(directory: Path) -> tuple[list[Entry], Counter]:
    """Every entry of gcide.dict.dz once, in dictionary (offset) order, named by the headword of its first line
    (the index, sorted by key, may reach an entry first through a sub-phrase); the 00-database-* metadata
    entries are skipped. A few bytes are not UTF-8 (a cp1252 apostrophe): U+FFFD, and the entries are counted."""
    data_path, index_path = directory / "gcide.dict.dz", directory / "gcide.index"
    for path in (data_path, index_path):
        if not path.is_file():
            raise SystemExit(f"--gcide {directory}: no {path.name}; point it at .../usr/share/dictd of dict-gcide")
    data = gzip.decompress(data_path.read_bytes())
    entries: list[tuple[int, Entry]] = []
    seen, skipped = set(), Counter()
    for number, line in enumerate(index_path.read_text(encoding="utf-8").splitlines(), start=1):
        fields = line.split("\t")
        if len(fields) < 3:
            raise SystemExit(f"{index_path}:{number}: not a dictd index line: {line[:80]!r}")
        word, start, length = fields[0], dictd_number(fields[1]), dictd_number(fields[2])
        if start in seen:
            skipped["another headword of an entry already read"] += 1
            continue
        seen.add(start)
        if word.startswith("00-database"):
            skipped["00-database metadata"] += 1
            continue
        chunk = data[start:start + length]
        try:
            text = chunk.decode("utf-8")
        except UnicodeDecodeError:
            text = chunk.decode("utf-8", errors="replace")
            skipped["(kept) entries with bytes that are not UTF-8"] += 1
        headword = HEADWORD.match(text)
        entries.append((start, Entry(f"{headword.group(1) if headword else word}@{start}", text)))
    return [entry for _, entry in sorted(entries, key=lambda pair: pair[0])], skipped


# --- cleaning -----------------------------------------------------------------------------------------------

def drop_wordnet(raw: str) -> tuple[str, int]:
    """The entry without its WordNet-derived pieces (text ending at a provenance marker that names WordNet but
    not Webster or the Century Dictionary), and how many pieces went. Text after the last marker stays."""
    kept, dropped, at = [], 0, 0
    for match in PROVENANCE.finditer(raw):
        marker = match.group(0)
        if "WordNet" in marker and "Webster" not in marker and "Century" not in marker:
            dropped += 1
        else:
            kept.append(raw[at:match.end()])
        at = match.end()
    kept.append(raw[at:])
    return "".join(kept), dropped


def decode_accents(text: str) -> str:
    """GCIDE's ASCII accent codes as Unicode ("souffl['e]" -> "soufflé"); unknown codes stay as they are."""
    text = ACCENT.sub(lambda m: unicodedata.normalize("NFC", m.group(2) + COMBINING[m.group(1)]), text)
    for code, char in LIGATURES.items():
        text = text.replace(code, char)
    return text


def normal_tag(content: str) -> str:
    content = " ".join(content.split())  # a tag can be broken across lines
    return TAG_ALIASES.get(content, content)


def group_end(text: str, at: int) -> int | None:
    """The index just past the group opening at text[at] (\\...\\, [...] or (...), brackets nested), or None if
    it does not close within MAX_GROUP characters."""
    opener = text[at]
    if opener == "\\":
        end = text.find("\\", at + 1, at + MAX_GROUP)
        return None if end < 0 else end + 1
    closer, depth = {"[": "]", "(": ")"}[opener], 0
    for i in range(at, min(len(text), at + MAX_GROUP)):
        if text[i] == opener:
            depth += 1
        elif text[i] == closer:
            depth -= 1
            if depth == 0:
                return i + 1
    return None


def header_end(text: str, at: int) -> int:
    """The end of the headword block starting at the column-0 line text[at:]: the rest of that line (headword,
    pronunciations, respelling, part of speech), groups (etymology brackets) running on into later lines, and
    after a line break only groups, punctuation and part-of-speech abbreviations; a column-0 line starting with
    a backslash (a further form's pronunciation) continues the header. An unclosed bracket on the header line
    is passed over ("\\Am*mo"ni*ac\\(or Gum ammoniac \\Gum` am*mo"ni*ac\\, n."), after it ends the header."""
    loose, i = True, at
    while i < len(text):
        char = text[i]
        if char == "\n":
            i += 1
            loose = i < len(text) and text[i] == "\\"
            continue
        if char in " \t,;:.":
            i += 1
            continue
        if char in "\\[(":
            end = group_end(text, i)
            if end is None and not loose:
                return i
            i = i + 1 if end is None else end
            continue
        if loose:
            i += 1
            continue
        token = POS_TOKEN.match(text, i)
        if token is None:
            return i
        i = token.end()
    return i


def strip_headers(text: str) -> str:
    """The entry without its headword blocks (every column-0 line holding a backslash pronunciation)."""
    out, i = [], 0
    while i < len(text):
        line_end = text.find("\n", i)
        line_end = len(text) if line_end < 0 else line_end
        end = header_end(text, i) if text[i] not in " \t\n" and "\\" in text[i:line_end] else i
        if end > i:  # no progress (an unclosed group at the start): the line is kept as text
            out.append("\n")
            i = end
            continue
        out.append(text[i:line_end + 1])
        i = line_end + 1
    return "".join(out)


class Cleaner:
    """Finds an entry's tags and its clean text, given the tag vocabulary and the labels."""

    def __init__(self, vocabulary: set[str], label_words: set[str]):
        self.vocabulary = vocabulary
        self.label_words = label_words

    def tags(self, text: str) -> list[str]:
        found = (normal_tag(m.group(1)) for m in TAG.finditer(text))
        return [t for t in found if t in self.vocabulary]

    def is_removed(self, content: str) -> bool:
        tag = normal_tag(content)
        return tag in self.vocabulary or any(w in self.label_words for w in re.findall(TAG_WORD, tag))

    def clean(self, text: str) -> str:
        text = strip_headers(PROVENANCE.sub("\n", text))  # a header can follow a marker on its line
        text = TAG.sub(lambda m: " " if self.is_removed(m.group(1)) else m.group(0), text)
        text = " ".join(decode_accents(re.sub(r"[{}]", "", text)).split())
        return re.sub(r" ([,.;:])", r"\1", text).strip(" ,;:")


def tag_vocabulary(texts: list[str]) -> tuple[set[str], Counter]:
    counts = Counter(normal_tag(m.group(1)) for text in texts for m in TAG.finditer(text))
    return {t for t, n in counts.items() if n >= TAG_MIN_COUNT and t not in NOT_DOMAIN}, counts


def label_of(tags: list[str]) -> str | None:
    """The most frequent tag; ties go to the one seen first (Counter keeps insertion order, sorting is stable)."""
    return Counter(tags).most_common(1)[0][0] if tags else None


def sentences(text: str) -> list[str]:
    return [s for s in SENTENCE_END.split(text) if s]


# --- the task -----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Example:
    key: str
    text: str
    """Cut at --max-words words."""
    label: str
    words: int
    """Before the cut."""


def words_summary(values: list[int]) -> dict:
    if not values:
        return {}
    ordered = sorted(values)
    return {"mean": round(statistics.fmean(ordered), 1), "median": statistics.median(ordered),
            "p90": ordered[int(0.9 * (len(ordered) - 1))], "min": ordered[0], "max": ordered[-1]}


def choose_examples(tagged: list[tuple[str, str, list[str]]], args: argparse.Namespace) -> tuple[list[Example], dict]:
    """Eligible examples (long enough, a kept label, text not seen before) in dictionary order, and the report."""
    skipped, seen_texts, long_entries = Counter(), set(), []
    for key, text, tags in tagged:
        label = label_of(tags)
        words = len(text.split())
        if label is None:
            skipped["no subject-field tag"] += 1
        elif words < args.min_words:
            skipped[f"fewer than {args.min_words} words"] += 1
        elif text in seen_texts:
            skipped["text identical to an earlier entry's"] += 1
        else:
            seen_texts.add(text)
            long_entries.append((key, text, label, words))
    by_label = Counter(label for _, _, label, _ in long_entries)
    labels = [lab for lab, n in by_label.most_common(args.labels) if n >= args.min_label_entries]
    kept = set(labels)
    examples = []
    for key, text, label, words in long_entries:
        if label not in kept:
            skipped["label not among the kept labels"] += 1
            continue
        examples.append(Example(key, " ".join(text.split()[:args.max_words]), label, words))
    report = {"labels": labels, "long_entries_per_label_all": dict(by_label.most_common()),
              "eligible": len(examples), "skipped": dict(skipped),
              "cut_at_max_words": sum(e.words > args.max_words for e in examples)}
    if len(examples) < args.min_eligible:
        raise SystemExit(f"only {len(examples)} eligible entries with --min-words {args.min_words} "
                         f"(fewer than --min-eligible {args.min_eligible}); lower --min-words (70)")
    return examples, report


def make_splits(examples: list[Example], args: argparse.Namespace) -> tuple[dict[str, list[Example]], set[str]]:
    order = list(examples)
    random.Random(args.seed).shuffle(order)
    held = args.test + args.dev
    if len(order) <= held:
        raise SystemExit(f"only {len(order)} eligible entries, {held} asked for dev and test")
    splits = {"test": order[:args.test], "dev": order[args.test:held], "train": order[held:held + args.train]}
    return splits, {e.key for e in order[:held]}


def write_task(directory: Path, splits: dict[str, list[Example]], max_words: int) -> dict:
    train_labels = {e.label for e in splits["train"]}
    report = {}
    for name in ("train", "dev", "test"):
        rows = [e for e in splits[name] if e.label in train_labels]
        dropped = Counter(e.label for e in splits[name] if e.label not in train_labels)
        with open(directory / f"{name}.jsonl", "w", encoding="utf-8") as handle:
            for e in rows:
                handle.write(json.dumps({"id": e.key, "text": e.text, "label": e.label}, ensure_ascii=False) + "\n")
        counts = Counter(e.label for e in rows)
        report[name] = {"rows": len(rows), "dropped_unseen_label": sum(dropped.values()),
                        "labels": len(counts), "per_label": dict(counts.most_common()),
                        "majority_fraction": round(counts.most_common(1)[0][1] / len(rows), 3) if rows else None,
                        "words": words_summary([len(e.text.split()) for e in rows]),
                        "words_before_cut": words_summary([e.words for e in rows]),
                        "cut_at_max_words": sum(e.words > max_words for e in rows)}
    return report


def leak_check(examples: list[Example], labels: list[str]) -> dict:
    """Texts in which a label still appears as a word opening or closing a parenthetical ("(Law)", "(Civil Law)",
    not "(Lawn Tennis)"), or as a whole word anywhere (abbreviated labels only: "Zool.")."""
    edges = [re.compile(rf"\(\s*{re.escape(lab)}(?!\w)|(?<![\w.]){re.escape(lab)}\s*\)") for lab in labels]
    in_parens = sum(any(edge.search(e.text) for edge in edges) for e in examples)
    words = {lab for lab in labels if lab.endswith(".")}  # "Law", "Physics" are ordinary words in a definition
    as_word = Counter(lab for e in examples for lab in words
                      if re.search(rf"(?<![\w.]){re.escape(lab)}(?!\w)", e.text))
    return {"texts_with_a_label_in_parentheses": in_parens, "texts_with_an_abbreviated_label_as_a_word":
            dict(as_word.most_common())}


# --- the corpus ---------------------------------------------------------------------------------------------

def write_corpus(path: Path, cleaned: list[tuple[str, str]], held: set[str]) -> dict:
    held_lines = {s for key, text in cleaned if key in held for s in sentences(text)}
    documents, dropped, empty = [], 0, 0
    for key, text in cleaned:
        if key in held:
            continue
        lines = []
        for sentence in sentences(text):
            if sentence in held_lines:
                dropped += 1
            else:
                lines.append(sentence)
        if lines:
            documents.append(lines)
        else:
            empty += 1
    text = "\n\n".join("\n".join(lines) for lines in documents) + "\n"
    path.write_text(text, encoding="utf-8")
    sizes = [len(lines) for lines in documents]
    return {"documents": len(documents), "lines": sum(sizes), "one_line_documents": sum(n == 1 for n in sizes),
            "lines_per_document": words_summary(sizes), "words": len(text.split()),
            "entries_held_out": len(held), "entries_empty_after_cleaning": empty,
            "dropped_lines_equal_to_held_out": dropped, "mb": round(len(text.encode()) / 1e6, 2)}


# --- main ---------------------------------------------------------------------------------------------------

def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--gcide", type=Path, required=True, help="Directory with gcide.dict.dz and gcide.index.")
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=17, help="Seed of the entry shuffle behind every split.")
    parser.add_argument("--train", type=int, default=4000, help="At most this many (fewer if not enough).")
    parser.add_argument("--dev", type=int, default=1000)
    parser.add_argument("--test", type=int, default=1000)
    parser.add_argument("--min-words", type=int, default=100, help="Shorter cleaned entries are skipped.")
    parser.add_argument("--max-words", type=int, default=400, help="Longer texts are cut to this many words.")
    parser.add_argument("--labels", type=int, default=20, help="Keep the entries of this many most frequent labels.")
    parser.add_argument("--min-label-entries", type=int, default=50,
                        help="A label needs at least this many eligible entries to be kept.")
    parser.add_argument("--min-eligible", type=int, default=3000,
                        help="Stop if fewer entries are eligible (then lower --min-words).")
    parser.add_argument("--keep-wordnet", action="store_true", help="Keep GCIDE's WordNet 1.5 senses.")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    entries, read_skipped = read_entries(args.gcide)
    texts, wordnet_pieces = [], 0
    for entry in entries:
        text, dropped = (entry.raw, 0) if args.keep_wordnet else drop_wordnet(entry.raw)
        texts.append(text)
        wordnet_pieces += dropped
    vocabulary, tag_counts = tag_vocabulary(texts)
    first = Cleaner(vocabulary, set())
    tagged_tags = [first.tags(text) for text in texts]
    # The label words are known only once the labels are: clean once to choose them, then again removing every
    # tag-shaped parenthetical that contains a label's word.
    draft = [(e.key, first.clean(t), tags) for e, t, tags in zip(entries, texts, tagged_tags)]
    _, draft_report = choose_examples(draft, args)
    cleaner = Cleaner(vocabulary, set(draft_report["labels"]))
    cleaned = [(e.key, cleaner.clean(t)) for e, t in zip(entries, texts)]
    examples, task = choose_examples([(k, c, tags) for (k, c), tags in zip(cleaned, tagged_tags)], args)
    splits, held = make_splits(examples, args)
    args.output.mkdir(parents=True, exist_ok=True)
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    manifest = {
        "seed": args.seed, "settings": settings,
        "licence": "GCIDE: GPL-2+ (Webster's 1913 base text public domain); WordNet 1.5 senses "
                   + ("kept (Princeton WordNet licence)" if args.keep_wordnet else "removed"),
        "dictionary": {"entries_read": len(entries), "read_skipped": dict(read_skipped),
                       "wordnet_pieces_dropped": wordnet_pieces, "tag_vocabulary": len(vocabulary),
                       "tag_occurrences": dict(t for t in tag_counts.most_common() if t[0] in vocabulary),
                       "entries_with_a_tag": sum(bool(t) for t in tagged_tags),
                       "sources": {n: sha256(args.gcide / n) for n in ("gcide.dict.dz", "gcide.index")}},
        "task": {**task, "train_asked": args.train, "train_short_by": max(0, args.train - len(splits["train"])),
                 "leak_check": leak_check(examples, task["labels"]),
                 **write_task(args.output, splits, args.max_words)},
        "corpus": write_corpus(args.output / "corpus.txt", cleaned, held),
    }
    manifest["files"] = {p.name: {"bytes": p.stat().st_size, "sha256": sha256(p)}
                         for p in sorted(args.output.iterdir()) if p.is_file() and p.name != "manifest.json"}
    (args.output / "manifest.json").write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n",
                                               encoding="utf-8")
    brief = {k: v for k, v in manifest["task"].items() if k in ("labels", "eligible", "skipped", "leak_check")}
    print(json.dumps({"task": brief, **{n: {k: v for k, v in manifest["task"][n].items() if k != "per_label"}
                                        for n in ("train", "dev", "test")}, "corpus": manifest["corpus"]}, indent=1))
    return manifest


if __name__ == "__main__":
    main()
