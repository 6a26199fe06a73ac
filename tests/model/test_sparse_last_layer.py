"""The last layer run only where the masked-LM head reads (`BertModel(output_positions=...)`): the same states,
pooled [CLS] and gradients as the full encoder followed by a selection, on every attention layout, for a bool mask
and for Google's (B, P) positions; and the layer really runs at those rows alone."""

from __future__ import annotations

import pytest
import torch

from bertkit.config import preset
from bertkit.model import BertForMaskedLM, BertForPreTraining, accelerate_for_inference, compile_model
from bertkit.model.attention import BatchedBmm, PaddedSDPA, PerSequence, RepaddedSDPA
from bertkit.model.bert import select_positions
from bertkit.model.fused import fuse_for_training
from bertkit.model.padding import Unpadded

VOCAB = 97


def _model(kind: type, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return kind(preset("bert-debug", vocab_size=VOCAB, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))


def _batch(seed: int = 1) -> dict[str, torch.Tensor]:
    """Four rows of 20 tokens, two of them padded (one after 5 tokens), ~30% of the real tokens masked."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, VOCAB, (4, 20), generator=generator)
    mask = torch.ones(4, 20, dtype=torch.int64)
    mask[1, 12:] = 0
    mask[3, 5:] = 0
    masked = (torch.rand(4, 20, generator=generator) < 0.3) & mask.bool()
    masked[0, 0] = True  # [CLS] itself, which the pooler also reads
    return {"input_ids": ids, "attention_mask": mask, "masked": masked}


POSITIONS = torch.tensor([[1, 2, 0], [3, 15, 0], [0, 4, 6], [2, 7, 9]])
"""(B, P) positions as a static batch lists them: weight-0 repeats of position 0, and padded positions (15 in row 1,
7 and 9 in row 3), whose states the full encoder returns as zeros."""

BACKENDS = {"dispatch": None, "padded SDPA": PaddedSDPA, "per sequence": PerSequence, "batched bmm": BatchedBmm,
            "repadded SDPA": RepaddedSDPA}


def _use(model: torch.nn.Module, backend: str) -> None:
    if BACKENDS[backend] is not None:
        model.bert.attention = BACKENDS[backend]()


def _logits(out) -> torch.Tensor:
    return out.prediction_logits if hasattr(out, "prediction_logits") else out.logits


@pytest.mark.parametrize("kind", [BertForPreTraining, BertForMaskedLM])
@pytest.mark.parametrize("backend", list(BACKENDS))
@pytest.mark.parametrize("form", ["bool mask", "positions"])
def test_the_states_and_gradients_are_the_full_encoders_at_the_positions(kind, backend, form):
    batch = _batch()
    positions = batch["masked"] if form == "bool mask" else POSITIONS
    model = _model(kind).train()
    _use(model, backend)
    full = model.bert(batch["input_ids"], None, batch["attention_mask"])
    sparse = model.bert(batch["input_ids"], None, batch["attention_mask"], output_positions=positions)
    want = select_positions(full.last_hidden_state, positions)
    assert sparse.last_hidden_state.shape == want.shape
    torch.testing.assert_close(sparse.last_hidden_state, want, atol=1e-5, rtol=1e-5)
    if form == "positions":  # padded positions are zeros, as the full encoder's
        assert not sparse.last_hidden_state.view(4, 3, -1)[1, 1].any()
        assert not sparse.last_hidden_state.view(4, 3, -1)[3, 1:].any()
    if kind is BertForPreTraining:
        torch.testing.assert_close(sparse.pooler_output, full.pooler_output, atol=1e-5, rtol=1e-5)

    def grads(masked_positions):
        model.zero_grad(set_to_none=True)
        out = model(batch["input_ids"], None, batch["attention_mask"], masked_positions=masked_positions)
        logits = _logits(out) if masked_positions is not None else select_positions(_logits(out), positions)
        loss = logits.logsumexp(-1).sum()
        if kind is BertForPreTraining:
            loss = loss + out.seq_relationship_logits.sum()
        loss.backward()
        return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    sparse_grads, full_grads = grads(positions), grads(None)
    assert sparse_grads.keys() == full_grads.keys()
    for name in full_grads:
        torch.testing.assert_close(sparse_grads[name], full_grads[name], atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("kind", [BertForPreTraining, BertForMaskedLM])
def test_the_last_layer_runs_at_the_positions_alone(kind):
    batch = _batch()
    model = _model(kind)
    rows: dict[int, int] = {}
    for index, layer in enumerate(model.bert.layers):
        layer.ffn_in.register_forward_hook(lambda _m, inputs, _o, i=index: rows.__setitem__(i, inputs[0].shape[0]))
    model(batch["input_ids"], None, batch["attention_mask"], masked_positions=batch["masked"])
    real, masked = int(batch["attention_mask"].sum()), int(batch["masked"].sum())
    pooled = 4 if kind is BertForPreTraining else 0  # the [CLS] rows the pooler reads
    last = len(model.bert.layers) - 1
    assert rows == {**dict.fromkeys(range(last), real), last: masked + pooled}


def test_hidden_states_asked_for_run_every_layer_in_full():
    batch = _batch()
    model = _model(BertForMaskedLM)
    full = model.bert(batch["input_ids"], None, batch["attention_mask"], output_hidden_states=True)
    out = model.bert(batch["input_ids"], None, batch["attention_mask"], output_hidden_states=True,
                     output_positions=batch["masked"])
    assert out.hidden_states is not None and full.hidden_states is not None
    assert out.hidden_states[-1].shape == (4, 20, model.config.hidden_size)
    torch.testing.assert_close(out.hidden_states[-1], full.hidden_states[-1])
    torch.testing.assert_close(out.last_hidden_state, full.last_hidden_state[batch["masked"]])


def test_a_batch_of_padding_alone_and_no_position_at_all():
    model = _model(BertForPreTraining).eval()
    ids = torch.randint(5, VOCAB, (2, 6))
    nothing_real = torch.zeros(2, 6, dtype=torch.int64)
    full = model(ids, None, nothing_real)
    out = model(ids, None, nothing_real, masked_positions=torch.zeros(2, 6, dtype=torch.bool))
    assert out.prediction_logits.shape == (0, VOCAB)
    torch.testing.assert_close(out.seq_relationship_logits, full.seq_relationship_logits)
    none_masked = model(ids, None, torch.ones(2, 6, dtype=torch.int64), masked_positions=torch.zeros(2, 6).bool())
    assert none_masked.prediction_logits.shape == (0, VOCAB)


def _grads(model, batch, positions):
    model.zero_grad(set_to_none=True)
    out = model(batch["input_ids"], None, batch["attention_mask"], masked_positions=positions)
    (_logits(out).logsumexp(-1).sum() + out.seq_relationship_logits.sum()).backward()
    return _logits(out), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("transform", ["checkpointing", "fused"])
def test_gradient_checkpointing_and_the_fused_forwards_run_the_sparse_layer(transform):
    batch = _batch()
    want, want_grads = _grads(_model(BertForPreTraining).train(), batch, POSITIONS)
    model = _model(BertForPreTraining).train()
    if transform == "checkpointing":
        model.bert.gradient_checkpointing_enable()
    else:
        fuse_for_training(model)
    got, got_grads = _grads(model, batch, POSITIONS)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert got_grads.keys() == want_grads.keys()
    for name in want_grads:
        torch.testing.assert_close(got_grads[name], want_grads[name], atol=1e-5, rtol=1e-4, msg=name)


def test_left_padding_and_a_row_of_padding_among_real_ones():
    """Position 0 padded (left padding) and a row with no real token: the pooler's [CLS] row and the clamp at row 0
    of the real tokens are where this differs from right padding."""
    generator = torch.Generator().manual_seed(3)
    ids = torch.randint(5, VOCAB, (3, 10), generator=generator)
    mask = torch.ones(3, 10, dtype=torch.int64)
    mask[0, :4] = 0  # left padding
    mask[2] = 0  # nothing real
    positions = torch.tensor([[0, 5, 9], [0, 1, 2], [0, 3, 9]])
    masked = torch.zeros(3, 10, dtype=torch.bool)
    masked[0, [0, 6]] = True  # a padded position, listed
    masked[1, [2, 8]] = True
    for backend in ("dispatch", "padded SDPA"):
        model = _model(BertForPreTraining).eval()
        _use(model, backend)
        full = model.bert(ids, None, mask)
        for chosen in (positions, masked):
            out = model.bert(ids, None, mask, output_positions=chosen)
            torch.testing.assert_close(out.last_hidden_state, select_positions(full.last_hidden_state, chosen),
                                       atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(out.pooler_output, full.pooler_output, atol=1e-5, rtol=1e-5)


def test_the_collators_layout_and_its_static_positions():
    """A GPU step's batch: the real tokens' layout computed on the host (`Unpadded.from_collated`) and Google's
    (B, P) positions."""
    batch = _batch()
    mask = batch["attention_mask"]
    layout = Unpadded.from_collated(mask, mask.reshape(-1).nonzero().squeeze(1),
                                    torch.nn.functional.pad(mask.sum(1).cumsum(0), (1, 0)).to(torch.int32))
    model = _model(BertForMaskedLM).eval()
    full = model.bert(batch["input_ids"], None, mask)
    out = model.bert(batch["input_ids"], None, mask, layout=layout, output_positions=POSITIONS)
    torch.testing.assert_close(out.last_hidden_state, select_positions(full.last_hidden_state, POSITIONS),
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_an_inference_copy_fills_masks_as_the_model_does(precision):
    """The serve fill-mask path: an accelerated copy (packed or int8 dense layers) run at the [MASK] positions."""
    batch = _batch()
    model = _model(BertForMaskedLM).eval()
    copy = accelerate_for_inference(model, precision)
    with torch.inference_mode():
        want = select_positions(copy(batch["input_ids"], None, batch["attention_mask"]).logits, batch["masked"])
        got = copy(batch["input_ids"], None, batch["attention_mask"], masked_positions=batch["masked"]).logits
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.slow  # compilation takes tens of seconds on 2 CPU cores
def test_compiled_layers_run_the_sparse_layer():
    batch = _batch()
    eager = _model(BertForPreTraining).train()
    compiled = compile_model(_model(BertForPreTraining).train())
    for positions in (batch["masked"], POSITIONS):
        want, want_grads = _grads(eager, batch, positions)
        got, got_grads = _grads(compiled, batch, positions)
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
        for name in want_grads:
            torch.testing.assert_close(got_grads[name], want_grads[name], atol=1e-4, rtol=1e-3, msg=name)
