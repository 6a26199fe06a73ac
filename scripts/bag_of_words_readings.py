"""What a bag of words reads of a classification task: a diagnostic beside the pre-training studies.

    python scripts/bag_of_words_readings.py --task /tmp/tdavid [--train-sizes 1000,2000] [--corpus CORPUS]

`--task` is a folder with train.jsonl, dev.jsonl and test.jsonl (rows {"text", "label"}, as the study's task
scripts write them); `--corpus` a pre-training corpus in Google's format (a blank line between documents; default:
the task folder's corpus.txt). Three readings, each a scikit-learn logistic regression whose C (1, 10, 100) is
chosen on dev, scored on test:

  tfidf     TF-IDF of words and word pairs (sublinear, min_df 2) of the first N training texts, for each N of
            --train-sizes;
  topics    --topics (300) LSA dimensions of the corpus's TF-IDF (fit on 150-word chunks of it), then the training
            labels;
  document  which corpus document a text is from: a TF-IDF classifier of the corpus's documents (its 150-word
            chunks labelled by document; SGD, log loss), whose per-document scores the training labels read.

One line per reading (`tfidf N=1000 C=10 dev 43.2 test 43.0`). The last asks whether what the unlabelled corpus says
about its documents carries the label (docs/pretraining.md, "Where the Treasury's label is").
"""

from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path

from sklearn.decomposition import TruncatedSVD
from sklearn.exceptions import ConvergenceWarning
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.linear_model import LogisticRegression, SGDClassifier
from sklearn.preprocessing import normalize

GRID = (1.0, 10.0, 100.0)
CHUNK_WORDS = 150


def read_split(path: Path) -> tuple[list[str], list[str]]:
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [row["text"] for row in rows], [str(row["label"]) for row in rows]


def corpus_chunks(path: Path) -> tuple[list[str], list[int]]:
    """(150-word chunks of every document, the document index of each)."""
    documents = [d for d in path.read_text(encoding="utf-8").split("\n\n") if d.strip()]
    chunks, owners = [], []
    for index, document in enumerate(documents):
        words = document.split()
        for start in range(0, len(words), CHUNK_WORDS):
            chunks.append(" ".join(words[start:start + CHUNK_WORDS]))
            owners.append(index)
    return chunks, owners


def best_on_dev(features, train, dev, test) -> tuple[float, float, float]:
    """(C, dev accuracy, test accuracy) of the C in GRID with the best dev accuracy; `features` maps texts."""
    x_train, x_dev, x_test = features(train[0]), features(dev[0]), features(test[0])
    scored = []
    for c in GRID:
        model = LogisticRegression(C=c, max_iter=3000).fit(x_train, train[1])
        scored.append((model.score(x_dev, dev[1]), c, model.score(x_test, test[1])))
    dev_score, c, test_score = max(scored, key=lambda row: row[0])
    return c, 100 * dev_score, 100 * test_score


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", type=Path, required=True)
    parser.add_argument("--corpus", type=Path, default=None)
    parser.add_argument("--train-sizes", default="1000")
    parser.add_argument("--topics", type=int, default=300)
    args = parser.parse_args(argv)
    train, dev, test = (read_split(args.task / f"{name}.jsonl") for name in ("train", "dev", "test"))
    for size in (int(n) for n in args.train_sizes.split(",")):
        subset = (train[0][:size], train[1][:size])
        vectorizer = TfidfVectorizer(sublinear_tf=True, ngram_range=(1, 2), min_df=2).fit(subset[0])
        c, dev_score, test_score = best_on_dev(vectorizer.transform, subset, dev, test)
        print(f"tfidf N={len(subset[0])} C={c:g} dev {dev_score:.1f} test {test_score:.1f}", flush=True)
    chunks, owners = corpus_chunks(args.corpus or args.task / "corpus.txt")
    words = TfidfVectorizer(sublinear_tf=True, min_df=2).fit(chunks)
    lsa = TruncatedSVD(args.topics, random_state=0).fit(words.transform(chunks))
    c, dev_score, test_score = best_on_dev(lambda texts: normalize(lsa.transform(words.transform(texts))),
                                           train, dev, test)
    print(f"topics N={len(train[0])} C={c:g} dev {dev_score:.1f} test {test_score:.1f}", flush=True)
    documents = SGDClassifier(loss="log_loss", alpha=1e-5, max_iter=20, random_state=0)
    with warnings.catch_warnings():  # 20 passes, as the figures were made: a screen, not a converged model
        warnings.simplefilter("ignore", ConvergenceWarning)
        documents.fit(words.transform(chunks), owners)
    c, dev_score, test_score = best_on_dev(lambda texts: documents.predict_proba(words.transform(texts)),
                                           train, dev, test)
    print(f"document N={len(train[0])} documents={max(owners) + 1} C={c:g} dev {dev_score:.1f} "
          f"test {test_score:.1f}", flush=True)


if __name__ == "__main__":
    main()
