"""Tiny random models and batches for the model tests (no downloads)."""

from __future__ import annotations

import pytest
import torch
import transformers


def tiny_hf_config(**overrides) -> transformers.BertConfig:
    fields = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=37, max_position_embeddings=64, num_labels=3)
    fields.update(overrides)
    return transformers.BertConfig(**fields)


@pytest.fixture
def batch() -> dict[str, torch.Tensor]:
    """Three sequences: full, padded after 8, padded after 4; two segments each."""
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(1, 99, (3, 11), generator=generator)
    token_type_ids = torch.zeros_like(input_ids)
    token_type_ids[:, 6:] = 1
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 8:] = 0
    attention_mask[2, 4:] = 0
    return {"input_ids": input_ids, "token_type_ids": token_type_ids, "attention_mask": attention_mask}
