"""Write the files the adaptation scripts share into the current directory: kjv.txt (the bundled corpus),
train-1000.tsv (the quickstart's 1,000 labelled verses, sampled with seed 0) and task-texts.txt (the text of
all 4,000 training verses, one per line: TAPT's unlabelled task text)."""

import gzip
import random
from pathlib import Path

from bertkit.assets import kjv_path

with gzip.open(kjv_path("corpus.txt.gz"), "rt") as corpus:
    Path("kjv.txt").write_text(corpus.read())
header, *rows = kjv_path("train.tsv").read_text().splitlines(keepends=True)
chosen = sorted(random.Random(0).sample(range(len(rows)), 1000))
Path("train-1000.tsv").write_text(header + "".join(rows[i] for i in chosen))
Path("task-texts.txt").write_text("".join(row.split("\t")[0] + "\n" for row in rows))
