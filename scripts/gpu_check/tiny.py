"""Tiny pre-training data and models: what the one-rank process-group part and the CUDA training tests
(tests/cuda) train on, in a second and without files.

Design decision: synthetic items in `PretrainingDataset`'s format (1-D int64 tensors of each instance's
real length, 15% of the positions masked, an NSP label), so `collate_pretraining`, `pretraining_loss`,
`evaluate_pretraining` and `fit` run exactly as `bertkit pretrain` runs them, on ragged batches.
"""

from __future__ import annotations

import torch

from bertkit.config import BertConfig, preset
from bertkit.model import BertForPreTraining

VOCAB_SIZE = 128
MASK_ID, FIRST_WORD_ID = 4, 5  # ids below FIRST_WORD_ID stand for [PAD], [UNK], [CLS], [SEP], [MASK]


def tiny_config(**overrides) -> BertConfig:
    """bert-debug (2 layers of 32, 4 heads) with a 128-token vocabulary."""
    return preset("bert-debug", vocab_size=VOCAB_SIZE, **overrides)


def tiny_model(seed: int = 0, **overrides) -> BertForPreTraining:
    torch.manual_seed(seed)
    return BertForPreTraining(tiny_config(**overrides))


def pretraining_items(count: int, max_length: int = 32, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """`count` instances of 8..max_length tokens: two segments, 15% masked (at least one), random NSP label."""
    generator = torch.Generator().manual_seed(seed)
    items = []
    for _ in range(count):
        length = int(torch.randint(8, max_length + 1, (), generator=generator))
        ids = torch.randint(FIRST_WORD_ID, VOCAB_SIZE, (length,), generator=generator)
        token_type_ids = (torch.arange(length) >= length // 2).long()
        masked = torch.rand(length, generator=generator) < 0.15
        masked[int(torch.randint(1, length, (), generator=generator))] = True
        labels = torch.where(masked, ids, torch.full_like(ids, -100))
        items.append({"input_ids": torch.where(masked, torch.full_like(ids, MASK_ID), ids),
                      "token_type_ids": token_type_ids, "attention_mask": torch.ones_like(ids),
                      "mlm_labels": labels, "nsp_labels": torch.randint(0, 2, (), generator=generator)})
    return items
