"""Parity with transformers for every head, in both directions, on padded two-segment batches."""

from __future__ import annotations

import pytest
import torch
import transformers

from bertkit import model as bm
from bertkit.config import preset
from bertkit.model.attention import PaddedSDPA

from .conftest import tiny_hf_config

HEADS = ["BertModel", "BertForPreTraining", "BertForMaskedLM", "BertForSequenceClassification",
         "BertForTokenClassification", "BertForQuestionAnswering", "BertForMultipleChoice"]
OUTPUTS = ["last_hidden_state", "pooler_output", "prediction_logits", "seq_relationship_logits", "logits",
           "start_logits", "end_logits"]


def _inputs(name: str, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    if name == "BertForMultipleChoice":  # (B, C, T): the three rows as three choices of one example
        return {k: v.unsqueeze(0) for k, v in batch.items()}
    return batch


def _compare(name: str, ref, ours, mask: torch.Tensor) -> int:
    compared = 0
    for field in OUTPUTS:
        expected, actual = getattr(ref, field, None), getattr(ours, field, None)
        if expected is None or actual is None:
            continue
        if expected.dim() >= 2 and expected.shape[:2] == mask.shape:
            expected, actual = expected[mask], actual[mask]  # padded positions are unspecified in transformers
        torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5, msg=f"{name}.{field}")
        compared += 1
    for i, (expected, actual) in enumerate(zip(ref.hidden_states, ours.hidden_states, strict=True)):
        real = mask.reshape(-1, mask.shape[-1])  # multiple choice flattens (B, C, T) to (B*C, T)
        torch.testing.assert_close(actual[real], expected[real], atol=1e-5, rtol=1e-5, msg=f"hidden_states[{i}]")
    return compared


@pytest.mark.parametrize("name", HEADS)
def test_transformers_checkpoint_loads_with_same_outputs(name, batch, tmp_path):
    torch.manual_seed(0)
    num_labels = 2 if name == "BertForQuestionAnswering" else 3  # transformers' QA head has num_labels outputs
    reference = getattr(transformers, name)(tiny_hf_config(num_labels=num_labels)).eval()
    reference.save_pretrained(tmp_path)
    ours = bm.MODEL_CLASSES[name].from_pretrained(tmp_path).eval()
    assert ours.newly_initialized == []
    inputs = _inputs(name, batch)
    with torch.no_grad():
        expected = reference(**inputs, output_hidden_states=True)
        actual = ours(**inputs, output_hidden_states=True)
    assert len(actual.hidden_states) == 3  # embeddings + 2 layers
    assert _compare(name, expected, actual, batch["attention_mask"].bool()) >= 1


@pytest.mark.parametrize("name", HEADS)
def test_bertkit_checkpoint_loads_in_transformers_with_same_outputs(name, batch, tmp_path):
    torch.manual_seed(1)
    config = preset("bert-debug", vocab_size=99, num_labels=3)
    ours = bm.MODEL_CLASSES[name](config).eval()
    ours.save_pretrained(tmp_path)
    reference = getattr(transformers, name).from_pretrained(tmp_path).eval()
    inputs = _inputs(name, batch)
    with torch.no_grad():
        expected = reference(**inputs, output_hidden_states=True)
        actual = ours(**inputs, output_hidden_states=True)
    assert _compare(name, expected, actual, batch["attention_mask"].bool()) >= 1


@pytest.mark.parametrize("name", HEADS)
def test_padding_free_path_equals_padded_path(name, batch):
    torch.manual_seed(2)
    model = bm.MODEL_CLASSES[name](preset("bert-debug", vocab_size=99, num_labels=3)).eval()
    inputs = _inputs(name, batch)
    real = inputs["attention_mask"].bool()
    with torch.no_grad():
        unpadded = model(**inputs, output_hidden_states=True)
        getattr(model, "bert", model).attention = PaddedSDPA()
        padded = model(**inputs, output_hidden_states=True)
    compared = 0
    for field in OUTPUTS:
        expected, actual = getattr(padded, field, None), getattr(unpadded, field, None)
        if expected is None or actual is None:
            continue
        if expected.shape[:real.dim()] == real.shape:
            expected, actual = expected[real], actual[real]
        torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5, msg=field)
        compared += 1
    assert compared >= 1


def test_padded_positions_are_zero(batch):
    model = bm.BertModel(preset("bert-debug", vocab_size=99)).eval()
    with torch.no_grad():
        out = model(**batch)
    assert (out.last_hidden_state[~batch["attention_mask"].bool()] == 0).all()


@pytest.mark.parametrize("masked_lm", ["BertForPreTraining", "BertForMaskedLM"])
def test_sparse_mlm_logits_equal_dense_logits_at_masked_positions(masked_lm, batch):
    model = bm.MODEL_CLASSES[masked_lm](preset("bert-debug", vocab_size=99)).eval()
    masked = torch.zeros_like(batch["input_ids"], dtype=torch.bool)
    masked[0, [1, 5]] = True
    masked[2, 2] = True
    field = "prediction_logits" if masked_lm == "BertForPreTraining" else "logits"
    with torch.no_grad():
        dense = getattr(model(**batch), field)
        sparse = getattr(model(**batch, masked_positions=masked), field)
    assert sparse.shape == (3, 99)
    torch.testing.assert_close(sparse, dense[masked], atol=1e-6, rtol=1e-6)


def test_bf16_autocast_is_close_to_fp32(batch):
    torch.manual_seed(3)
    model = bm.BertForPreTraining(preset("bert-debug", vocab_size=99)).eval()
    with torch.no_grad():
        fp32 = model(**batch).seq_relationship_logits
        with torch.autocast("cpu", dtype=torch.bfloat16):
            bf16 = model(**batch).seq_relationship_logits
    assert bf16.dtype == torch.bfloat16
    torch.testing.assert_close(bf16.float(), fp32, atol=5e-2, rtol=5e-2)


def test_training_mode_backward_reaches_every_parameter(batch):
    model = bm.BertForPreTraining(preset("bert-debug", vocab_size=99)).train()
    out = model(**batch)
    (out.prediction_logits.float().mean() + out.seq_relationship_logits.mean()).backward()
    assert all(p.grad is not None for p in model.parameters())


def test_an_all_padding_row_does_not_disturb_the_others(batch):
    """A row with no real token has no sequence to attend over; the other rows are unchanged."""
    model = bm.BertModel(preset("bert-debug", vocab_size=99)).eval()
    with_empty = {k: v.clone() for k, v in batch.items()}
    with_empty["attention_mask"][2] = 0
    with torch.no_grad():
        alone = model(**{k: v[:2] for k, v in batch.items()}).last_hidden_state
        out = model(**with_empty).last_hidden_state
    torch.testing.assert_close(out[:2], alone, atol=1e-6, rtol=1e-6)
    assert (out[2] == 0).all()
