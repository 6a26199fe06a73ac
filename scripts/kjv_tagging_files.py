"""Write a tagging task made from the bundled KJV into the current directory: train.conll, dev.conll and
test.conll, the verses of the bundled classification splits (train.tsv, dev.tsv, test.tsv), one word per
line, each tagged B-NAME / I-NAME / O.

A word is a name when it is capitalised and its lower-case form never occurs in the whole bundled corpus
("Jerusalem", "Naphtali"; not "Let" or "Day", which occur lower-case elsewhere, nor "I" or "O"); names side
by side form one entity ("Jesus Christ"). Models read the text lower-cased (all-MiniLM-L6-v2 is uncased), so
the tagger must learn names from the words and their context, not from capitals: a real task, made without
any download, used by benchmarks/int8_agreement.py's tagging half (docs/performance.md).

    python scripts/kjv_tagging_files.py   # writes train.conll (4,000 verses), dev.conll, test.conll (1,000 each)
"""

import gzip
import re
from pathlib import Path

from bertkit.assets import kjv_path

WORD = re.compile(r"\w+|[^\w\s]")  # words and single punctuation marks, as BERT's basic tokenizer splits them


def main() -> None:
    with gzip.open(kjv_path("corpus.txt.gz"), "rt") as corpus:
        lower_case = {w for w in WORD.findall(corpus.read()) if w.islower()}
    for split in ("train", "dev", "test"):
        _, *rows = kjv_path(f"{split}.tsv").read_text().splitlines()
        blocks = ["\n".join(f"{w} {t}" for w, t in zip(*tagged(row.split("\t")[0], lower_case))) for row in rows]
        Path(f"{split}.conll").write_text("\n\n".join(blocks) + "\n")


def tagged(verse: str, lower_case: set[str]) -> tuple[list[str], list[str]]:
    """The verse's words and their tags."""
    words = WORD.findall(verse)
    tags: list[str] = []
    for word in words:
        name = word[0].isupper() and len(word) > 1 and word.lower() not in lower_case
        tags.append(("I-NAME" if tags and tags[-1] != "O" else "B-NAME") if name else "O")
    return words, tags


if __name__ == "__main__":
    main()
