"""The one inference-batching module: padding rule, length-sorted batches, results in input order, and the
model outputs that dev evaluation and the predictors share (token-level ones cut to each input)."""

from __future__ import annotations

import numpy as np
import torch

from bertkit.config import preset
from bertkit.inference.batching import length_sorted_batches, model_outputs, pad_batch, run_sorted, sorted_batches
from bertkit.model import BertForSequenceClassification, BertForTokenClassification


def _feature(length: int, first: int = 5, **extra) -> dict:
    return {"input_ids": list(range(first, first + length)), "token_type_ids": [0] * length,
            "attention_mask": [1] * length, **extra}


def test_pad_batch_pads_ids_labels_and_choices_by_their_own_rule():
    batch = pad_batch([_feature(2, labels=[1, 2]), _feature(4, labels=[3, 4, 5, 6], note="kept out")], pad_token_id=9)
    assert set(batch) == {"input_ids", "token_type_ids", "attention_mask", "labels"}
    assert batch["input_ids"].tolist() == [[5, 6, 9, 9], [5, 6, 7, 8]]
    assert batch["attention_mask"].tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]
    assert batch["labels"].tolist() == [[1, 2, -100, -100], [3, 4, 5, 6]]
    assert batch["input_ids"].dtype == torch.long
    spans = pad_batch([_feature(1, start_positions=0), _feature(3, start_positions=2)], pad_token_id=0)
    assert spans["start_positions"].tolist() == [0, 2]  # one number per feature: nothing to pad
    choices = pad_batch([{"input_ids": [[1], [1, 2, 3]], "token_type_ids": [[0], [0, 0, 0]],
                          "attention_mask": [[1], [1, 1, 1]], "labels": 1}], pad_token_id=0)
    assert choices["input_ids"].tolist() == [[[1, 0, 0], [1, 2, 3]]]  # (B, C, T)
    assert choices["labels"].tolist() == [1]


def test_batches_go_longest_first_and_results_come_back_in_input_order():
    lengths = [3, 7, 1, 7, 4, 2, 5]
    features = [_feature(n) for n in lengths]
    batches = length_sorted_batches(features, batch_size=3)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    assert [[lengths[i] for i in b] for b in batches] == [[7, 7, 5], [4, 3, 2], [1]]
    shapes = [batch["input_ids"].shape for _, batch in sorted_batches(features, 3, pad_token_id=0)]
    assert shapes == [(3, 7), (3, 4), (1, 1)]  # each batch padded to its own longest member
    rows = run_sorted(features, lambda batch: batch["attention_mask"].sum(dim=1).tolist(), 3, pad_token_id=0)
    assert rows == lengths


def test_gradient_free_mode_is_the_callers_choice():
    """Predictors run in inference mode; fine-tuning's evaluation passes no_grad, since the model trains again."""
    features = [_feature(3)]
    weight = torch.ones(1, requires_grad=True)
    step = lambda batch: [batch["input_ids"].float() * weight]  # noqa: E731
    [inference] = run_sorted(features, step, 2, 0)
    [plain] = run_sorted(features, step, 2, 0, grad_free=torch.no_grad)
    assert torch.is_inference(inference) and not torch.is_inference(plain) and not plain.requires_grad


def test_model_outputs_equal_one_by_one_and_token_outputs_are_cut():
    torch.manual_seed(0)
    config = preset("bert-debug", vocab_size=40, num_labels=3)
    features = [_feature(n, first=5 + n) for n in (6, 2, 9, 4, 1)]
    tagger = BertForTokenClassification(config).eval()
    outputs = model_outputs(tagger, features, ["logits"], ["logits"], batch_size=2, pad_token_id=0)
    classifier = BertForSequenceClassification(config).eval()
    pooled = model_outputs(classifier, features, ["logits"], [], batch_size=2, pad_token_id=0)
    for feature, tokens, sentence in zip(features, outputs["logits"], pooled["logits"]):
        alone = {k: torch.tensor([v]) for k, v in feature.items()}
        with torch.no_grad():
            expected_tokens = tagger(**alone).logits[0].numpy()  # (T, 3)
            expected_sentence = classifier(**alone).logits[0].numpy()  # (3,)
        assert tokens.shape == (len(feature["input_ids"]), 3) and tokens.dtype == np.float32
        np.testing.assert_allclose(tokens, expected_tokens, atol=1e-5)
        np.testing.assert_allclose(sentence, expected_sentence, atol=1e-5)
