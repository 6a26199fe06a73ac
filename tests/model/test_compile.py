"""torch.compile'd encoder layers: same outputs and gradients as eager, same checkpoint keys."""

from __future__ import annotations

import pytest
import torch

from bertkit.config import preset
from bertkit.model import BertForPreTraining, compile_model


@pytest.mark.slow  # compilation takes tens of seconds on 2 CPU cores
def test_compiled_layers_match_eager(batch):
    torch.manual_seed(0)
    eager = BertForPreTraining(preset("bert-debug", vocab_size=99)).eval()
    compiled = BertForPreTraining(preset("bert-debug", vocab_size=99)).eval()
    compiled.load_state_dict(eager.state_dict())
    compile_model(compiled)
    assert list(compiled.state_dict()) == list(eager.state_dict())
    for inputs in (batch, {k: v[:, :7] for k, v in batch.items()}):  # a second length: dynamic shapes
        a, b = eager(**inputs), compiled(**inputs)
        real = inputs["attention_mask"].bool()
        torch.testing.assert_close(b.prediction_logits[real], a.prediction_logits[real], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(b.seq_relationship_logits, a.seq_relationship_logits, atol=1e-4, rtol=1e-4)
    b.seq_relationship_logits.sum().backward()
    assert all(p.grad is not None for p in compiled.bert.layers.parameters())
