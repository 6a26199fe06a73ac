"""`collate_static` (issue 49): one shape for every batch, Google's prediction index with weights, and the real
tokens' layout made on the host; the same predictions as `collate_pretraining`'s labels."""

from __future__ import annotations

import pytest
import torch

from bertkit.data import collate_pretraining, collate_static, collate_static_buckets
from bertkit.data.masking import IGNORE_INDEX


def _item(length: int, masked: list[int], nsp: int = 0) -> dict[str, torch.Tensor]:
    ids = torch.arange(10, 10 + length)
    labels = torch.full((length,), IGNORE_INDEX)
    labels[masked] = ids[masked] + 1000
    types = (torch.arange(length) >= length // 2).long()
    return {"input_ids": ids, "token_type_ids": types, "attention_mask": torch.ones(length, dtype=torch.int64),
            "mlm_labels": labels, "nsp_labels": torch.tensor(nsp)}


def test_padded_batch_has_a_fixed_shape_an_index_and_a_layout():
    items = [_item(5, [1, 3], nsp=1), _item(8, [2]), _item(3, [])]
    batch = collate_static(items, pad_token_id=0, max_seq_length=10, max_predictions=4)
    assert batch["input_ids"].shape == batch["token_type_ids"].shape == batch["attention_mask"].shape == (3, 10)
    assert batch["input_ids"][0].tolist() == [10, 11, 12, 13, 14, 0, 0, 0, 0, 0]
    assert batch["masked_lm_positions"].tolist() == [[1, 3, 0, 0], [2, 0, 0, 0], [0, 0, 0, 0]]
    assert batch["masked_lm_ids"].tolist() == [[1011, 1013, 0, 0], [1012, 0, 0, 0], [0, 0, 0, 0]]
    assert batch["masked_lm_weights"].tolist() == [[1, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0]]
    assert batch["masked_lm_weights"].dtype == torch.float32 and batch["nsp_labels"].tolist() == [1, 0, 0]
    assert batch["cu_seqlens"].tolist() == [0, 5, 13, 16] and batch["cu_seqlens"].dtype == torch.int32
    real = batch["attention_mask"].reshape(-1).nonzero().squeeze(1)
    assert torch.equal(batch["token_indices"], real)


def test_the_predictions_are_collate_pretrainings():
    items = [_item(7, [0, 4, 6]), _item(9, [1, 2])]
    static = collate_static(items, 0, 12, 5)
    dynamic = collate_pretraining(items)
    flat = static["masked_lm_positions"] + torch.arange(2)[:, None] * 12
    weights = static["masked_lm_weights"].bool()
    padded_labels = torch.full((2, 12), IGNORE_INDEX)
    padded_labels[:, :dynamic["mlm_labels"].shape[1]] = dynamic["mlm_labels"]
    assert torch.equal(padded_labels.reshape(-1)[flat[weights]], static["masked_lm_ids"][weights])
    assert int(weights.sum()) == int((dynamic["mlm_labels"] != IGNORE_INDEX).sum())


def test_full_rows_carry_no_mask_and_no_layout():
    batch = collate_static([_item(6, [1]), _item(6, [2])], 0, 6, 2)
    assert "attention_mask" not in batch and "token_indices" not in batch and "cu_seqlens" not in batch


@pytest.mark.parametrize("length,masked,message", [(11, [], "exceeds max_seq_length 10"),
                                                   (6, [0, 1, 2, 3, 4], "exceeds max_predictions 4")])
def test_an_item_over_the_bounds_is_refused(length, masked, message):
    with pytest.raises(ValueError, match=message):
        collate_static([_item(length, masked)], 0, 10, 4)


def test_a_run_with_full_length_steps_pads_each_batch_to_the_shortest_length_that_holds_it():
    """Issue 48: a short-budget run reads most steps at 64 tokens and some at the data's full length; each batch
    takes one of those static shapes (one compilation each), never the full length for a short batch."""
    short = collate_static_buckets([_item(5, [1]), _item(6, [2])], 0, (8, 16), 4)
    full = collate_static_buckets([_item(5, [1]), _item(12, [2])], 0, (8, 16), 4)
    assert short["input_ids"].shape == (2, 8) and full["input_ids"].shape == (2, 16)
    with pytest.raises(ValueError, match="exceeds max_seq_length 16"):
        collate_static_buckets([_item(17, [])], 0, (8, 16), 4)
