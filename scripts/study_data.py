"""Build the pre-training study's second corpus and its two downstream tasks from WordNet 3.0 (issue 17).

What it writes into OUTPUT (deterministic for a given --seed and input files):

  wordnet/corpus.txt        pre-training text in Google's format (one sentence per line, a blank line between
                            documents) from WordNet's glosses, without any synset of the tasks' dev/test splits.
  wordnet/lexname-{train,dev,test}.{jsonl,tsv}
                            45-way sentence classification: text = a synset's gloss, label = its lexicographer
                            file (noun.animal, verb.motion, adj.all, ...; `man 5 lexnames`).
  wordnet/qa-{train,dev,test}.json
                            extractive QA in SQuAD v1.1 format: "Which word means: <definition>?" answered by a
                            span of a paragraph of WordNet example sentences.
  dictionaries/corpus.txt   (with --dictd) a third pre-training corpus of another kind: the Jargon File 4.4.7 and
                            Ambrose Bierce's The Devil's Dictionary (1911), both public domain; no task.
  manifest.json             counts, sizes, seeds, skipped/dropped counts and the sha256 of every input and output.

How to get the inputs (Debian packages, fetched once by hand; the script never runs apt):

    apt-get download wordnet-base dict-jargon dict-devil
    dpkg -x wordnet-base_*.deb /tmp/wn && dpkg -x dict-jargon_*.deb /tmp/pd && dpkg -x dict-devil_*.deb /tmp/pd
    python scripts/study_data.py --wordnet /tmp/wn/usr/share/wordnet --dictd /tmp/pd/usr/share/dictd \
        --output /tmp/study-data

Licences (from each package's /usr/share/doc/*/copyright): WordNet 3.0 is NOT public domain; it is
"Copyright 2006 by Princeton University", under the WordNet 3.0 licence, which permits use, copying,
modification and distribution for any purpose without fee provided the copyright notice and the disclaimer
appear on all copies (so derived files must carry that notice; none of them is committed to this repository).
The Jargon File ("This document (the Jargon File) is in the public domain, to be freely used, shared, and
modified") and The Devil's Dictionary ("A Public Domain Text, Copyright Expired") are public domain.
Debian's `fortunes` package was considered and not used: its copyright file covers the program (BSD) and
says nothing of the quotations, many of which are from living authors (Pratchett, Star Trek, song lyrics).

Design decisions, and why:

* Splits are drawn at the synset level from one seeded shuffle, held-out first: QA test, QA dev, lexname
  test, lexname dev (disjoint), then each training set is the first N remaining synsets in the same order.
  So a larger --lexname-train (4,000) is a superset of the default 2,000, and dev/test never change with
  the training size. Dev/test labels absent from train are dropped and counted (a model cannot predict them).
* No test text in pre-training: the corpus leaves out every synset of every dev/test split (the QA
  paragraphs are built from held-out synsets only, so their contexts are unseen too), and drops any corpus
  line whose definition or example is verbatim a held-out one (WordNet repeats a few glosses); both counted.
* lexname text is the whole gloss as the data file has it (definition; "example"; ...): it is the unit
  WordNet publishes per synset (so it is exactly what is held out of the corpus), and the examples show the
  word in use, which is what a pre-trained model can bring; the lemmas are not in the text (examples often
  contain them, as any usage would).
* Corpus sentences: per synset, "lemma, lemma: definition" then each example on its own line. Documents are
  built from hypernym neighbourhoods - the synsets sharing one direct hypernym (nouns, verbs; instance
  hypernyms too), an adjective head with its satellites, adverbs in runs of file order - each cut at
  --doc-synsets synsets, and consecutive neighbourhoods (file order keeps related ones together) packed
  into documents of at least --doc-min-lines lines. A neighbourhood is topically coherent (kinds of dog, ways
  of walking), so next-sentence prediction compares related and unrelated definitions, as paragraphs of one
  article do in Google's corpus; packing matters because a one-line document only ever gives random-next
  pairs (a third of the raw neighbourhoods are one line). Measured with `bertkit data pretraining
  --max-seq-length 64`: 65% random-next pairs unpacked, 58% packed (8 lines), 60% on the bundled KJV corpus
  (Google's rule gives more than 50% whenever a sentence fills the target length alone).
* QA: only synsets with an example that contains one of their lemmas as a whole word (case-insensitive; the
  answer text is the context's own spelling) are questions. A paragraph holds the chosen examples of
  --qa-paragraph synsets, each the target of one question; no answer occurs as a word in another sentence of
  its paragraph, so every answer is unique. Every answer_start is checked by slicing the context.

References: Miller (1995), "WordNet: a lexical database for English"; WordNet 3.0 `man 5 wndb` (data file
format) and `man 5 lexnames` (the 45 lexicographer files); Rajpurkar et al. (2016), SQuAD v1.1 format.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import random
import re
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

LEXNAMES = (  # index = lex_filenum in the data files (man 5 lexnames)
    "adj.all", "adj.pert", "adv.all", "noun.Tops", "noun.act", "noun.animal", "noun.artifact", "noun.attribute",
    "noun.body", "noun.cognition", "noun.communication", "noun.event", "noun.feeling", "noun.food", "noun.group",
    "noun.location", "noun.motive", "noun.object", "noun.person", "noun.phenomenon", "noun.plant",
    "noun.possession", "noun.process", "noun.quantity", "noun.relation", "noun.shape", "noun.state",
    "noun.substance", "noun.time", "verb.body", "verb.change", "verb.cognition", "verb.communication",
    "verb.competition", "verb.consumption", "verb.contact", "verb.creation", "verb.emotion", "verb.motion",
    "verb.perception", "verb.possession", "verb.social", "verb.stative", "verb.weather", "adj.ppl",
)
DATA_FILES = ("data.noun", "data.verb", "data.adj", "data.adv")
HYPERNYM_POINTERS = {"@", "@i", "&"}  # hypernym, instance hypernym, (from a satellite) its adjective head
ADJ_MARKER = re.compile(r"\((a|p|ip)\)$")  # syntactic marker glued to an adjective lemma
EXAMPLES_START = re.compile(r'[;:]\s*"')  # where a gloss's examples begin
QUOTED = re.compile(r'"([^"]+)"')
ADVERB_RUN = 10
DICTD_FILES = ("jargon.dict.dz", "devil.dict.dz")
DEVIL_HEADWORD = re.compile(r"[^a-z]+, [a-z. ]+\.")  # "ABATIS, n." that the splitter cut off its definition


@dataclass(frozen=True)
class Synset:
    """One line of a WordNet data file, as the study needs it."""

    key: str
    """pos letter + offset, e.g. "n02084071" (unique across the four data files)."""
    lexname: str
    lemmas: tuple[str, ...]
    """Words with spaces for underscores, adjective markers removed."""
    parent: str | None
    """The first hypernym / instance hypernym / satellite head key, or None."""
    gloss: str
    definition: str
    examples: tuple[str, ...]


# --- reading WordNet ------------------------------------------------------------------------------

def parse_synset(line: str, source: str) -> Synset:
    """A data-file line: offset lex_filenum ss_type w_cnt(hex) [word lex_id]... p_cnt [ptr]... | gloss."""
    head, _, gloss = line.partition(" | ")
    fields = head.split()
    try:
        offset, lexnum, ss_type = fields[0], int(fields[1]), fields[2]
        count = int(fields[3], 16)
        words = fields[4:4 + 2 * count:2]
        pointers_at = 4 + 2 * count
        pointers = int(fields[pointers_at])
        parent = None
        for i in range(pointers):
            symbol, target, target_pos = fields[pointers_at + 1 + 4 * i: pointers_at + 4 + 4 * i]
            if parent is None and symbol in HYPERNYM_POINTERS and (symbol != "&" or ss_type == "s"):
                parent = ("a" if target_pos == "s" else target_pos) + target
    except (IndexError, ValueError) as exc:
        raise SystemExit(f"{source}: not a WordNet data line ({exc}): {line[:80]!r}") from None
    pos = "a" if ss_type == "s" else ss_type
    lemmas = tuple(dict.fromkeys(ADJ_MARKER.sub("", w).replace("_", " ") for w in words))
    gloss = gloss.strip()
    definition, examples = split_gloss(gloss)
    return Synset(pos + offset, LEXNAMES[lexnum], lemmas, parent, gloss, definition, examples)


def split_gloss(gloss: str) -> tuple[str, tuple[str, ...]]:
    """(definition, examples) of a gloss 'definition; "example"; "example"' (some use ':' before them)."""
    match = EXAMPLES_START.search(gloss)
    if match is None:
        return gloss.strip(" ;:"), ()
    examples = tuple(e.strip() for e in QUOTED.findall(gloss[match.start():]) if e.strip())
    return gloss[:match.start()].strip(" ;:"), examples


def read_wordnet(directory: Path) -> list[Synset]:
    """Every synset of data.noun/verb/adj/adv, in file order (the licence header lines start with spaces)."""
    synsets = []
    for name in DATA_FILES:
        path = directory / name
        if not path.is_file():
            raise SystemExit(f"--wordnet {directory}: no {name}; point it at .../usr/share/wordnet of wordnet-base")
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if line.strip() and not line.startswith(" "):
                synsets.append(parse_synset(line, f"{path}:{number}"))
    return synsets


# --- splits -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Question:
    synset: Synset
    sentence: str
    answer_start: int
    """Character offset of the answer in `sentence`."""
    answer: str


def find_answer(synset: Synset) -> Question | None:
    """The first example containing one of the synset's lemmas as a whole word, or None."""
    for sentence in synset.examples:
        for lemma in synset.lemmas:
            match = re.search(rf"(?<![\w-]){re.escape(lemma)}(?![\w-])", sentence, re.IGNORECASE)
            if match:
                return Question(synset, sentence, match.start(), match.group(0))
    return None


def _contains_word(sentence: str, word: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", sentence, re.IGNORECASE) is not None


def take_paragraphs(order: Iterator[Synset], taken: set[str], questions: int, size: int) -> list[list[Question]]:
    """Paragraphs of `size` questions (the last may be shorter) until `questions` in all, from unused synsets
    in `order`; a candidate whose answer clashes with the paragraph being built waits for the next one."""
    paragraphs: list[list[Question]] = []
    current: list[Question] = []
    waiting: list[Question] = []
    total = 0

    def clashes(q: Question) -> bool:
        return any(_contains_word(other.sentence, q.answer) or _contains_word(q.sentence, other.answer)
                   or q.sentence == other.sentence for other in current)

    def candidates() -> Iterator[Question]:
        while True:
            ready = next((q for q in waiting if not clashes(q)), None)
            if ready is not None:
                waiting.remove(ready)
                yield ready
                continue
            synset = next(order, None)
            if synset is None:
                return
            if synset.key in taken:
                continue
            question = find_answer(synset)
            if question is not None:
                yield question

    for question in candidates():
        if total == questions:
            break
        if clashes(question):
            waiting.append(question)
            continue
        current.append(question)
        taken.add(question.synset.key)
        total += 1
        if len(current) == size:
            paragraphs.append(current)
            current = []
    if current:
        paragraphs.append(current)
    if total < questions:
        raise SystemExit(f"only {total} QA questions available, {questions} asked; lower the QA sizes")
    return paragraphs


def take_synsets(order: list[Synset], taken: set[str], count: int, mark: bool) -> list[Synset]:
    chosen = [s for s in order if s.key not in taken][:count]
    if len(chosen) < count:
        raise SystemExit(f"only {len(chosen)} synsets left, {count} asked; lower the lexname sizes")
    if mark:
        taken.update(s.key for s in chosen)
    return chosen


def make_splits(synsets: list[Synset], args: argparse.Namespace) -> dict:
    """QA and lexname splits; held-out ones first and disjoint, training sets from what remains."""
    order = list(synsets)
    random.Random(args.seed).shuffle(order)
    held: set[str] = set()
    splits = {"qa-test": take_paragraphs(iter(order), held, args.qa_test, args.qa_paragraph),
              "qa-dev": take_paragraphs(iter(order), held, args.qa_dev, args.qa_paragraph),
              "lexname-test": take_synsets(order, held, args.lexname_test, mark=True),
              "lexname-dev": take_synsets(order, held, args.lexname_dev, mark=True)}
    splits["lexname-train"] = take_synsets(order, held, args.lexname_train, mark=False)
    splits["qa-train"] = take_paragraphs(iter(order), set(held), args.qa_train, args.qa_paragraph)
    splits["held_out"] = held
    return splits


# --- writers ----------------------------------------------------------------------------------------

def write_lexname(directory: Path, splits: dict) -> dict:
    """lexname-{train,dev,test}.{jsonl,tsv}; dev/test rows whose label is not in train are dropped."""
    train_labels = {s.lexname for s in splits["lexname-train"]}
    report = {"train_labels": len(train_labels)}
    for name in ("train", "dev", "test"):
        rows = splits[f"lexname-{name}"]
        kept = [s for s in rows if s.lexname in train_labels]
        dropped = Counter(s.lexname for s in rows if s.lexname not in train_labels)
        for suffix in ("jsonl", "tsv"):
            with open(directory / f"lexname-{name}.{suffix}", "w", encoding="utf-8") as handle:
                if suffix == "tsv":
                    handle.write("id\ttext\tlabel\n")
                for s in kept:
                    text = " ".join(s.gloss.split())  # no tab or newline can reach the TSV
                    handle.write(json.dumps({"id": s.key, "text": text, "label": s.lexname}, ensure_ascii=False)
                                 + "\n" if suffix == "jsonl" else f"{s.key}\t{text}\t{s.lexname}\n")
        report[name] = {"rows": len(kept), "dropped_unseen_label": sum(dropped.values()),
                        "dropped_labels": dict(sorted(dropped.items())), "labels": len({s.lexname for s in kept})}
    return report


def squad_document(paragraphs: list[list[Question]], title: str) -> dict:
    """SQuAD v1.1 JSON for paragraphs of questions, every answer_start checked by slicing."""
    out = []
    for questions in paragraphs:
        sentences = [q.sentence if q.sentence[-1] in ".!?" else q.sentence + "." for q in questions]
        context, qas, at = " ".join(sentences), [], 0
        for q, sentence in zip(questions, sentences):
            start = at + q.answer_start
            assert context[start:start + len(q.answer)] == q.answer, (q.synset.key, q.answer)
            qas.append({"id": q.synset.key, "question": f"Which word means: {q.synset.definition}?",
                        "answers": [{"text": q.answer, "answer_start": start}]})
            at += len(sentence) + 1
        out.append({"context": context, "qas": qas})
    return {"version": "1.1", "data": [{"title": title, "paragraphs": out}]}


def write_qa(directory: Path, splits: dict) -> dict:
    report = {}
    for name in ("train", "dev", "test"):
        paragraphs = splits[f"qa-{name}"]
        document = squad_document(paragraphs, f"WordNet 3.0 examples ({name})")
        (directory / f"qa-{name}.json").write_text(json.dumps(document, ensure_ascii=False) + "\n", encoding="utf-8")
        report[name] = {"questions": sum(map(len, paragraphs)), "paragraphs": len(paragraphs)}
    return report


def neighbourhoods(synsets: list[Synset], held: set[str], doc_synsets: int) -> Iterator[list[Synset]]:
    """Hypernym neighbourhoods of the synsets not held out, in file order, cut to `doc_synsets` synsets."""
    groups: dict[str, list[Synset]] = defaultdict(list)
    adverbs = 0
    for synset in synsets:
        if synset.key in held:
            continue
        if synset.parent is not None:
            key = synset.parent
        elif synset.key.startswith("r"):
            key, adverbs = f"r-run-{adverbs // ADVERB_RUN}", adverbs + 1
        else:  # a top of a hierarchy or an adjective head: the head of its own neighbourhood
            key = synset.key
        groups[key].append(synset)
    for members in groups.values():  # dicts keep insertion order: file order of each group's first member
        for start in range(0, len(members), doc_synsets):
            yield members[start:start + doc_synsets]


def pack(units: Iterator[list[str]], min_lines: int) -> Iterator[list[str]]:
    """Documents of consecutive units (lists of lines), each unit whole, a document closed once it has
    `min_lines` lines. Google's pair rule makes every pair from a one-segment document a random-next pair,
    so one-line documents skew next-sentence prediction and give it no real pairs to learn from."""
    document: list[str] = []
    for unit in units:
        document += unit
        if len(document) >= min_lines:
            yield document
            document = []
    if document:
        yield document


def write_corpus(path: Path, synsets: list[Synset], held: set[str], args: argparse.Namespace) -> dict:
    """corpus.txt: each synset as "lemmas: definition" then its examples; held-out texts never appear."""
    by_key = {s.key: s for s in synsets}
    held_texts = {t for key in held for t in (by_key[key].definition, *by_key[key].examples)}
    dropped = Counter()
    units = []
    for members in neighbourhoods(synsets, held, args.doc_synsets):
        lines = []
        for s in members:
            if s.definition in held_texts:
                dropped["definition equal to a held-out one"] += 1
            elif s.definition:
                lines.append(f"{', '.join(s.lemmas)}: {s.definition}")
            for example in s.examples:
                if example in held_texts:
                    dropped["example equal to a held-out one"] += 1
                else:
                    lines.append(example)
        units.append(lines)
    documents = ["\n".join(lines) for lines in pack(iter(units), args.doc_min_lines) if lines]
    text = "\n\n".join(documents) + "\n"
    path.write_text(text, encoding="utf-8")
    return {"documents": len(documents), "lines": sum(d.count("\n") + 1 for d in documents),
            "synsets": len(synsets) - len(held), "dropped_lines": dict(dropped),
            "mb": round(len(text.encode()) / 1e6, 2)}


# --- the third corpus: public-domain dictionaries -------------------------------------------------------

def dictd_entries(path: Path) -> Iterator[str]:
    """The entries of a dictd dictionary (.dict.dz is gzip), located by its .index (word, offset, length in
    base64 digits), in index order; the 00-database* entries (metadata, the preface) are skipped."""
    data = gzip.decompress(path.read_bytes())
    index = path.with_name(path.name.replace(".dict.dz", ".index"))
    digits = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"

    def number(code: str) -> int:
        value = 0
        for char in code:
            value = value * 64 + digits.index(char)
        return value

    seen = set()
    for line in index.read_text(encoding="utf-8").splitlines():
        word, offset, length = line.split("\t")[:3]
        start = number(offset)
        if (word.startswith("00") and "database" in word) or start in seen:
            continue
        seen.add(start)  # several headwords can point at one entry
        yield data[start:start + number(length)].decode("utf-8")


def entry_sentences(entry: str, jargon: bool) -> list[str]:
    """Sentences of one entry, by pysbd (bertkit's own splitter) over its paragraphs. A Jargon File entry is
    headword / pronunciation and part of speech / text: the text is kept, prefixed with "headword: " as the
    WordNet corpus does; a Devil's Dictionary entry starts "WORD, n.  Its definition", kept whole (the headword
    stays in its first sentence).
    {cross-references} lose their braces."""
    from bertkit.data.corpus import split_sentences

    lines = entry.split("\n")
    body = lines[2:] if jargon else lines
    paragraphs = [" ".join(p.split()) for p in " ".join(line.strip() or "\n" for line in body).split("\n")]
    paragraphs = [re.sub(r"[{}]", "", p) for p in paragraphs if p]
    if jargon and paragraphs:
        paragraphs[0] = f"{lines[0].strip()}: {paragraphs[0]}"
    sentences = split_sentences(paragraphs)
    if not jargon and len(sentences) > 1 and DEVIL_HEADWORD.fullmatch(sentences[0]):
        sentences[:2] = [f"{sentences[0]} {sentences[1]}"]
    return sentences


def write_dictionaries(directory: Path, output: Path, min_lines: int) -> dict:
    """dictionaries/corpus.txt: entries in index order, consecutive ones of one dictionary packed into documents
    of at least `min_lines` sentences (most of The Devil's Dictionary and many Jargon File entries are one or two
    sentences), like the entries on one page."""
    output.mkdir(parents=True, exist_ok=True)
    documents, entries, sources = [], 0, {}
    for name in DICTD_FILES:
        path = directory / name
        if not path.is_file():
            raise SystemExit(f"--dictd {directory}: no {name}; extract dict-jargon and dict-devil there")
        sources[name] = sha256(path)
        units = [entry_sentences(entry, jargon=name.startswith("jargon")) for entry in dictd_entries(path)]
        documents += ["\n".join(lines) for lines in pack(iter(units), min_lines) if lines]
        entries += len(units)
    text = "\n\n".join(documents) + "\n"
    (output / "corpus.txt").write_text(text, encoding="utf-8")
    return {"entries": entries, "documents": len(documents), "lines": text.count("\n") - len(documents) + 1,
            "mb": round(len(text.encode()) / 1e6, 2), "sources": sources}


# --- main -------------------------------------------------------------------------------------------

def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--wordnet", type=Path, required=True, help="Directory with data.noun/verb/adj/adv.")
    parser.add_argument("--dictd", type=Path, help="Directory with jargon.dict.dz/.index and devil.dict.dz/.index.")
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=17, help="Seed of the synset shuffle behind every split.")
    parser.add_argument("--lexname-train", type=int, default=2000, help="Training labels (4000: the larger set).")
    parser.add_argument("--lexname-dev", type=int, default=1000)
    parser.add_argument("--lexname-test", type=int, default=1000)
    parser.add_argument("--qa-train", type=int, default=4000)
    parser.add_argument("--qa-dev", type=int, default=1000)
    parser.add_argument("--qa-test", type=int, default=1000)
    parser.add_argument("--qa-paragraph", type=int, default=4, help="Example sentences (questions) per context.")
    parser.add_argument("--doc-synsets", type=int, default=32, help="Most synsets of one neighbourhood together.")
    parser.add_argument("--doc-min-lines", type=int, default=8,
                        help="Consecutive neighbourhoods (dictionary entries) are packed into documents of at least "
                             "this many lines.")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    synsets = read_wordnet(args.wordnet)
    splits = make_splits(synsets, args)
    directory = args.output / "wordnet"
    directory.mkdir(parents=True, exist_ok=True)
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    manifest = {"seed": args.seed, "settings": settings,
                "wordnet": {"synsets": len(synsets), "held_out_synsets": len(splits["held_out"]),
                            "sources": {n: sha256(args.wordnet / n) for n in DATA_FILES}},
                "lexname": write_lexname(directory, splits), "qa": write_qa(directory, splits),
                "corpus": write_corpus(directory / "corpus.txt", synsets, splits["held_out"], args)}
    if args.dictd is not None:
        manifest["dictionaries"] = write_dictionaries(args.dictd, args.output / "dictionaries", args.doc_min_lines)
    manifest["files"] = {str(p.relative_to(args.output)): {"bytes": p.stat().st_size, "sha256": sha256(p)}
                         for p in sorted(args.output.rglob("*")) if p.is_file() and p.name != "manifest.json"}
    (args.output / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    print(json.dumps({k: v for k, v in manifest.items() if k not in ("files", "settings")}, indent=1))
    return manifest


if __name__ == "__main__":
    main()
