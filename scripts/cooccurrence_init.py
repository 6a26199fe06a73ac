"""A screened pre-training lever: the word embeddings started from the training data's co-occurrence statistics.

    python scripts/cooccurrence_init.py --data DATA --tokenizer VOCAB --model bert-mini --recipe auto \
        --max-steps 2640 --threads 2 --seed 2 --output RUN

runs `bertkit pretrain` with those arguments, except that a fresh model's word embeddings (not an --init-from's) start
from a classical distributional model of the same sample of training instances the unigram decoder bias counts
(`bertkit.workflows.pretrain.unigram_baseline`): positive pointwise mutual information within 5 pieces either side,
the context counts smoothed to the power 0.75 (Levy, Goldberg and Dagan 2015), reduced to the hidden size by a
truncated SVD and weighted U * sqrt(S), then scaled so that its entries' spread is BERT's initialisation (standard
deviation 0.02) and centred (each component's mean removed, which leaves the spread a little below 0.02).
The special pieces, [UNK] and pieces never counted keep their random initialisation. It took about 5 seconds on
2 CPU threads for an 8,000-piece vocabulary (10,000 instances of 64 tokens), and its nearest neighbours read as
word senses should (water: fountain, streams, rivers).

The screen's models were made with a first version of this function that left the sign of each SVD component as
ARPACK returned it; this one fixes it (the same geometry). It is a study script, not a bertkit option: screened
at 10 CPU-minutes on two long-input families it changed nothing measurable (docs/pretraining.md, "The decoder
bias at the word frequencies"), so the recipe does not use it.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence

import numpy as np
import scipy.sparse as sp
import torch
from scipy.sparse.linalg import svds
from torch.utils.data import Dataset

from bertkit.cli import main
from bertkit.workflows import pretrain
from bertkit.workflows.pretrain import sampled_words

WINDOW = 5
CONTEXT_SMOOTHING = 0.75
INIT_STD = 0.02


def cooccurrence_vectors(dataset: Dataset, vocab_size: int, special_token_ids: Sequence[int], seed: int,
                         dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(vectors (n, dim) fp32, the ids (n,) they belong to): PPMI-SVD vectors of the pieces in the instances
    `pretrain.sampled_words` draws with `seed` (the unigram bias's sample)."""
    if vocab_size <= dim:
        raise SystemExit(f"cooccurrence_init: a vocabulary of {vocab_size} pieces has no {dim}-dimensional SVD; "
                         "use a larger vocabulary or a smaller model")
    pad, unk, cls, sep, mask = special_token_ids
    left, right = [], []
    for sample in sampled_words(dataset, special_token_ids, seed):
        words = sample.numpy()
        for distance in range(1, WINDOW + 1):
            if len(words) > distance:
                left.append(words[:-distance])
                right.append(words[distance:])
    if not left:
        raise SystemExit("cooccurrence_init: no two words side by side in the sampled training instances; "
                         "build the data from a larger corpus")
    rows, cols = np.concatenate(left), np.concatenate(right)
    counts = sp.coo_matrix((np.ones(len(rows)), (rows, cols)), shape=(vocab_size, vocab_size)).tocsr()
    counts = (counts + counts.T).tocoo()
    total = counts.data.sum()
    word_p = np.bincount(counts.row, counts.data, vocab_size) / total
    context = np.bincount(counts.col, counts.data, vocab_size) ** CONTEXT_SMOOTHING
    pmi = np.log((counts.data / total) / (word_p[counts.row] * context[counts.col] / context.sum()))
    keep = pmi > 0
    ppmi = sp.csr_matrix((pmi[keep], (counts.row[keep], counts.col[keep])), shape=(vocab_size, vocab_size))
    u, s, _ = svds(ppmi, k=dim, random_state=seed)
    u *= np.sign(u[np.abs(u).argmax(0), np.arange(dim)])  # each component's sign fixed (ARPACK leaves it free)
    seen = word_p > 0
    seen[[pad, unk, cls, sep, mask]] = False
    vectors = (u * np.sqrt(s))[seen]
    vectors = (vectors - vectors.mean(0)) / vectors.std() * INIT_STD
    return torch.from_numpy(vectors).float(), torch.from_numpy(np.flatnonzero(seen))


_unigram_start = pretrain._unigram_start


def _start_with_cooccurrence(settings, model, train_set, evaluated, tokenizer, seed, ctx):
    """The run's own start (the unigram bias), then the word embeddings of a fresh model from co-occurrence."""
    baseline = _unigram_start(settings, model, train_set, evaluated, tokenizer, seed, ctx)
    if settings.init_from is None:
        began = time.perf_counter()
        weight = model.bert.embeddings.word.weight
        vectors, ids = cooccurrence_vectors(train_set, weight.shape[0], tokenizer.special_token_ids, seed,
                                            weight.shape[1])
        with torch.no_grad():
            weight[ids] = vectors
        print(f"word embeddings of {len(ids):,} pieces started from co-occurrence (PPMI-SVD) in "
              f"{time.perf_counter() - began:.1f} s", file=sys.stderr, flush=True)
    return baseline


if __name__ == "__main__":
    pretrain._unigram_start = _start_with_cooccurrence
    sys.exit(main(["pretrain", *sys.argv[1:]]))
