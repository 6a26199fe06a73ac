"""Real pre-training batches from the bundled King James Bible with Google's bert-base-uncased vocabulary, for the
GPU check's timed parts: every variant of the lever ladder trains on the same batches, collated each way.

- `full_rows`: phase 1's shape with no padding. Each row is [CLS] A [SEP] B [SEP] of exactly T tokens, A and B
  windows of the corpus's token stream (B the window after A half the time, else a random one: NSP), masked by
  Google's rule (`bertkit.data.masking.mask_batch`: 15% of the word positions, at most P, 80/10/10).
- `phase2_items`: instances made by `bertkit data pretraining` itself (Google's rules, static masking) at T
  tokens: real lengths, so real padding when collated (what unpadding is measured on).

Design decision: items in `PretrainingDataset`'s format (1-D tensors of each instance's real length), so both
collates (`collate_pretraining` for the paths before issue 49, `collate_static` for the static step) and the
FLOP rule see exactly what `bertkit pretrain` would feed.
"""

from __future__ import annotations

import gzip
import tempfile
from functools import cache
from pathlib import Path

import numpy as np
import torch

from bertkit.assets import kjv_path
from bertkit.data.masking import MaskingVocab, mask_batch
from bertkit.tokenizer import WordPieceTokenizer
from gpu_check.environment import ROOT

VOCAB = ROOT / "tests" / "assets" / "vocab" / "bert-base-uncased"


@cache
def tokenizer() -> WordPieceTokenizer:
    return WordPieceTokenizer.from_pretrained(VOCAB)


@cache
def token_stream() -> np.ndarray:
    """The corpus's word-piece ids, lines joined (about 1M tokens)."""
    with gzip.open(kjv_path("corpus.txt.gz"), "rt", encoding="utf-8") as handle:
        lines = [line for line in handle.read().splitlines() if line.strip()]
    return np.concatenate([np.asarray(ids, dtype=np.int64) for ids in tokenizer().encode_ids(lines) if ids])


def full_rows(count: int, seq_length: int, max_predictions: int, seed: int, masked_lm_prob: float = 0.15
              ) -> list[dict[str, torch.Tensor]]:
    """`count` unpadded instances of exactly `seq_length` tokens (module docstring)."""
    tok, stream = tokenizer(), token_stream()
    gen = np.random.default_rng(seed)
    a_len = (seq_length - 3) // 2
    b_len = seq_length - 3 - a_len
    starts = gen.integers(0, len(stream) - seq_length, count)
    random_b = gen.random(count) < 0.5
    others = gen.integers(0, len(stream) - b_len, count)
    rows = np.empty((count, seq_length), dtype=np.int64)
    for row, (start, swap, other) in enumerate(zip(starts, random_b, others)):
        b_start = other if swap else start + a_len
        rows[row] = [tok.cls_token_id, *stream[start:start + a_len], tok.sep_token_id,
                     *stream[b_start:b_start + b_len], tok.sep_token_id]
    vocab = MaskingVocab(tok.vocab_size, tok.mask_token_id, tok.cls_token_id, tok.sep_token_id, None)
    offsets = np.arange(count + 1) * seq_length
    ids, labels = mask_batch(rows.reshape(-1), offsets, masked_lm_prob, max_predictions, vocab, gen)
    ids, labels = ids.reshape(count, seq_length), labels.reshape(count, seq_length)
    types = np.zeros(seq_length, dtype=np.int64)
    types[a_len + 2:] = 1
    return [{"input_ids": torch.from_numpy(ids[row].copy()), "token_type_ids": torch.from_numpy(types.copy()),
             "attention_mask": torch.ones(seq_length, dtype=torch.int64),
             "mlm_labels": torch.from_numpy(labels[row].copy()), "nsp_labels": torch.tensor(int(random_b[row]))}
            for row in range(count)]


def phase2_items(count: int, seq_length: int, workdir: Path | None = None) -> tuple[list[dict], int]:
    """(`count` instances of up to `seq_length` tokens made by bertkit's data pipeline from the corpus, the
    data's max_predictions_per_seq)."""
    from bertkit.data import InstanceSettings, PretrainingDataset, build_pretraining_data
    from bertkit.settings import PretrainingDataSettings

    with tempfile.TemporaryDirectory(dir=workdir) as directory:
        with gzip.open(kjv_path("corpus.txt.gz"), "rt", encoding="utf-8") as handle:
            text = handle.read()
        corpus = Path(directory) / "corpus.txt"
        corpus.write_text(text[: min(len(text), 3_000 * count * seq_length // 512 + 200_000)], encoding="utf-8")
        # Google's phase-2 cap (80 predictions at 512 tokens), 20 at 128
        options = InstanceSettings(max_seq_length=seq_length, dupe_factor=1,
                                   max_predictions_per_seq=max(20, seq_length * 80 // 512))
        build_pretraining_data(PretrainingDataSettings(
            (str(corpus),), "(in memory)", str(Path(directory) / "data"), workers=1, quiet=True,
            instances=options), tokenizer())
        dataset = PretrainingDataset(Path(directory) / "data")
        if len(dataset) < count:
            raise RuntimeError(f"the corpus made {len(dataset)} instances of {seq_length} tokens, {count} asked for")
        return [dataset[i] for i in range(count)], int(dataset.options["max_predictions_per_seq"])
