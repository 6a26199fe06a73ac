"""Pre-training items, a tiny model and an objective's global counts for the tests of issue 49's step
(test_static_step.py, test_compiled_objective.py)."""

from __future__ import annotations

import torch

from bertkit.config import preset
from bertkit.model import BertForPreTraining
from bertkit.tasks.pretraining import PretrainingObjective

VOCAB, MASK_ID = 64, 4


def items(count: int, max_length: int = 24, seed: int = 0, full: bool = False) -> list[dict[str, torch.Tensor]]:
    """Pre-training items of random lengths (or all `max_length`), 15% masked (at least one), random NSP."""
    generator = torch.Generator().manual_seed(seed)
    made = []
    for _ in range(count):
        length = max_length if full else int(torch.randint(6, max_length + 1, (), generator=generator))
        ids = torch.randint(5, VOCAB, (length,), generator=generator)
        masked = torch.rand(length, generator=generator) < 0.15
        masked[int(torch.randint(1, length, (), generator=generator))] = True
        made.append({"input_ids": torch.where(masked, torch.full_like(ids, MASK_ID), ids),
                     "token_type_ids": (torch.arange(length) >= length // 2).long(),
                     "attention_mask": torch.ones(length, dtype=torch.int64),
                     "mlm_labels": torch.where(masked, ids, torch.full_like(ids, -100)),
                     "nsp_labels": torch.randint(0, 2, (), generator=generator)})
    return made


def tiny(cls=BertForPreTraining, dropout: float = 0.0, seed: int = 0):
    torch.manual_seed(seed)
    return cls(preset("bert-debug", vocab_size=VOCAB, hidden_dropout_prob=dropout,
                      attention_probs_dropout_prob=dropout)).train()


def totals(objective: PretrainingObjective, batch: dict) -> dict[str, torch.Tensor]:
    return {key: value.clamp(min=1).to(torch.float64) for key, value in objective.counts(batch).items()}
