"""`fuse_for_training` (issue 49): the fused forwards compute what bert.py computes from the same weights (their
CPU implementations are the ops' PyTorch references), a bf16 residual stream under autocast, the dropout masks
replayed under gradient checkpointing, and an inference copy back on the plain forwards."""

from __future__ import annotations

import pytest
import torch

from bertkit.config import preset
from bertkit.data import collate_pretraining
from bertkit.model import BertForPreTraining, accelerate_for_inference, enable_gradient_checkpointing
from bertkit.model.fused import fuse_for_training, fused_levers

VOCAB = 64


def items(count: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """Pre-training items of random lengths (so a batch is padded), two segments, a random NSP label."""
    generator = torch.Generator().manual_seed(seed)
    made = []
    for _ in range(count):
        length = int(torch.randint(6, 24, (), generator=generator))
        made.append({"input_ids": torch.randint(5, VOCAB, (length,), generator=generator),
                     "token_type_ids": (torch.arange(length) >= length // 2).long(),
                     "attention_mask": torch.ones(length, dtype=torch.int64),
                     "mlm_labels": torch.full((length,), -100), "nsp_labels": torch.tensor(0)})
    return made


def _model(dropout: float = 0.0, seed: int = 0) -> BertForPreTraining:
    torch.manual_seed(seed)
    return BertForPreTraining(preset("bert-debug", vocab_size=VOCAB, hidden_dropout_prob=dropout,
                                     attention_probs_dropout_prob=dropout))


def _run(model, batch, autocast: bool = False):
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
        loss = out.prediction_logits.float().logsumexp(-1).mean() + out.seq_relationship_logits.float().sum()
    loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return out, grads


@pytest.mark.parametrize("levers", [{"norm": True, "gelu": False}, {"norm": False, "gelu": True},
                                    {"norm": True, "gelu": True}])
def test_fused_forwards_compute_what_the_model_computes(levers):
    batch = collate_pretraining(items(5))
    plain = _model().train()
    fused = fuse_for_training(_model().train(), **levers)
    assert fused_levers(fused) == levers
    want, want_grads = _run(plain, batch)
    got, got_grads = _run(fused, batch)
    torch.testing.assert_close(got.prediction_logits, want.prediction_logits, atol=1e-5, rtol=1e-5)
    assert want_grads.keys() == got_grads.keys()
    for name in want_grads:
        torch.testing.assert_close(got_grads[name], want_grads[name], atol=1e-5, rtol=1e-4, msg=name)


def test_under_bf16_autocast_the_residual_stream_is_bf16():
    batch = collate_pretraining(items(5))
    fused = fuse_for_training(_model().train())
    seen = []
    fused.bert.layers[0].register_forward_hook(lambda module, args, output: seen.append(output.dtype))
    out, grads = _run(fused, batch, autocast=True)
    want, _ = _run(_model().train(), batch, autocast=True)
    assert seen == [torch.bfloat16]
    torch.testing.assert_close(out.prediction_logits.float(), want.prediction_logits.float(), atol=0.1, rtol=0.05)
    assert all(torch.isfinite(g).all() for g in grads.values())


def test_checkpointing_replays_the_dropout_masks():
    batch = collate_pretraining(items(5))
    results = []
    for checkpointed in (False, True):
        model = fuse_for_training(_model(dropout=0.1).train())
        if checkpointed:
            enable_gradient_checkpointing(model)
        torch.manual_seed(3)
        results.append(_run(model, batch))
    (out_a, grads_a), (out_b, grads_b) = results
    torch.testing.assert_close(out_b.prediction_logits, out_a.prediction_logits)
    for name in grads_a:
        torch.testing.assert_close(grads_b[name], grads_a[name], msg=name)


def test_dropout_is_on_in_training_and_off_in_eval():
    batch = collate_pretraining(items(3))
    model = fuse_for_training(_model(dropout=0.3))
    inputs = (batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
    with torch.no_grad():
        train_a, train_b = (model.train()(*inputs).prediction_logits for _ in range(2))
        eval_a, eval_b = (model.eval()(*inputs).prediction_logits for _ in range(2))
    assert not torch.equal(train_a, train_b) and torch.equal(eval_a, eval_b)


def test_an_inference_copy_runs_the_plain_forwards_and_a_second_fusion_is_refused():
    batch = collate_pretraining(items(4))
    fused = fuse_for_training(_model())
    copy = accelerate_for_inference(fused)
    assert fused_levers(copy) == {} and "forward" not in vars(copy.bert.layers[0])
    inputs = (batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
    with torch.no_grad():
        torch.testing.assert_close(copy(*inputs).prediction_logits, _model().eval()(*inputs).prediction_logits,
                                   atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="already fused"):
        fuse_for_training(fused)
