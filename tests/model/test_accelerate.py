"""`accelerate_for_inference` (model/accelerate.py): a copy with packed oneDNN dense layers that gives the
eager model's numbers for every head, leaves the original untouched, refuses training, and so never
needs invalidating; and `compile_model`."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.utils.parametrize
import torch.nn.utils.prune

from bertkit import model as bm
from bertkit.config import preset
from bertkit.kernels import attention as attention_kernels
from bertkit.model.accelerate import PackedLinear, accelerate_for_inference, compile_model, onednn_works
from bertkit.model.attention import PaddedSDPA
from bertkit.runtime import probe

pytestmark = pytest.mark.skipif(not onednn_works(torch.float32), reason="this PyTorch build has no oneDNN")
needs_bf16 = pytest.mark.skipif(not onednn_works(torch.bfloat16), reason="oneDNN has no bf16 on this CPU")

HEADS = ["BertModel", "BertForPreTraining", "BertForMaskedLM", "BertForSequenceClassification",
         "BertForTokenClassification", "BertForQuestionAnswering", "BertForMultipleChoice"]


def _model(name: str = "BertModel", dtype: torch.dtype = torch.float32, **overrides) -> torch.nn.Module:
    torch.manual_seed(0)
    config = preset("bert-debug", vocab_size=99, num_labels=3, max_position_embeddings=256, **overrides)
    return bm.MODEL_CLASSES[name](config).eval().to(dtype)


def _batch(lengths: list[int]) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    seq_len = max(lengths)
    input_ids = torch.randint(1, 99, (len(lengths), seq_len), generator=generator)
    mask = (torch.arange(seq_len) < torch.tensor(lengths)[:, None]).long()
    return {"input_ids": input_ids * mask, "token_type_ids": torch.zeros_like(input_ids), "attention_mask": mask}


def _outputs(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    if isinstance(model, bm.BertForMultipleChoice):
        batch = {k: v.unsqueeze(0) for k, v in batch.items()}
    with torch.inference_mode():
        out = model(**batch)
    return {k: v.float() for k, v in vars(out).items() if isinstance(v, torch.Tensor)}


def _packed(model: torch.nn.Module) -> list[PackedLinear]:
    return [m for m in model.modules() if isinstance(m, PackedLinear)]


@pytest.mark.parametrize("name", HEADS)
@pytest.mark.parametrize("lengths", [[9, 5, 2], [7, 7, 7]], ids=["padded", "full"])
def test_accelerated_copy_equals_eager_fp32_every_head(name, lengths):
    model, batch = _model(name), _batch(lengths)
    model.train()
    fast = accelerate_for_inference(model)
    assert len(_packed(fast)) == 4 * model.config.num_hidden_layers and not fast.training
    assert not _packed(model) and model.training  # the original is untouched
    eager = _outputs(model.eval(), batch)
    actual = _outputs(fast, batch)
    real = batch["attention_mask"].bool()
    for key, expected in eager.items():
        got = actual[key]
        if expected.shape[:2] == real.shape:
            got, expected = got[real], expected[real]
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5, msg=key)


@pytest.mark.parametrize("activation", ["gelu", "gelu_new", "relu"])
def test_fused_activations_equal_eager(activation):
    model, batch = _model(hidden_act=activation), _batch([12, 3])
    fast = accelerate_for_inference(model)
    assert all(type(layer.act) is torch.nn.Identity for layer in fast.layers)  # inside ffn_in now
    torch.testing.assert_close(_outputs(fast, batch)["last_hidden_state"], _outputs(model, batch)["last_hidden_state"],
                               atol=1e-5, rtol=1e-5)


@pytest.fixture
def bmm_calls(monkeypatch) -> list[int]:
    calls: list[int] = []
    original = attention_kernels.bmm_attention
    monkeypatch.setattr(attention_kernels, "bmm_attention", lambda *qkv: calls.append(1) or original(*qkv))
    return calls


@needs_bf16
@pytest.mark.parametrize("lengths", [[64, 64], [120, 70, 30]], ids=["full", "padded"])
def test_bf16_is_as_close_to_fp32_as_eager_bf16(lengths, bmm_calls):
    """Sequences of 49-192 tokens take the bmm attention in bf16 (tests/conftest.py's measurements); the
    accelerated copy's error against the fp32 result must be of the size of eager bf16's."""
    model, batch = _model(), _batch(lengths)
    reference = _outputs(model, batch)["last_hidden_state"]
    fast = accelerate_for_inference(model, "bf16")
    assert {p.dtype for p in _packed(fast)} == {torch.bfloat16}
    accelerated = _outputs(fast, batch)["last_hidden_state"]
    assert len(bmm_calls) == model.config.num_hidden_layers * (1 if lengths[0] == lengths[-1] else 2)
    eager = _outputs(model.to(torch.bfloat16), batch)["last_hidden_state"]
    real = batch["attention_mask"].bool()
    assert (accelerated - reference)[real].abs().mean() < 1.5 * (eager - reference)[real].abs().mean() + 1e-3


@needs_bf16
@pytest.mark.parametrize("name", ["BertForSequenceClassification", "BertForPreTraining"])
def test_autocast_copy_under_bf16_autocast_is_as_close_as_eager_autocast(name):
    """Evaluation inside a bf16 training loop: an fp32 model under bf16 autocast."""
    model, batch = _model(name), _batch([120, 70, 30])
    reference = _outputs(model, batch)
    fast = accelerate_for_inference(model, autocast=True)
    assert {p.dtype for p in _packed(fast)} == {torch.bfloat16}
    assert next(fast.parameters()).dtype == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        accelerated, eager = _outputs(fast, batch), _outputs(model, batch)
    for key in reference:
        accelerated_error = (accelerated[key] - reference[key]).abs().mean()
        assert accelerated_error < 1.5 * (eager[key] - reference[key]).abs().mean() + 1e-3, key


def test_the_copy_refuses_training_and_autograd_and_builds_no_graph():
    model, batch = _model(), _batch([9, 5])
    fast = accelerate_for_inference(model)
    with pytest.raises(RuntimeError, match="inference only"):
        fast.train()
    with pytest.raises(RuntimeError, match="no backward"):
        fast.layers[0].qkv(torch.randn(3, 32, requires_grad=True))
    out = fast(**batch).last_hidden_state  # gradients on, but the copy's shared tensors are detached
    assert not out.requires_grad and all(p.grad is None for p in model.parameters())
    assert fast.embeddings.word.weight.data_ptr() == model.embeddings.word.weight.data_ptr()


@pytest.mark.parametrize("fused", [True, False], ids=["fused-adamw", "for-loop-adamw"])
def test_each_evaluation_after_an_optimizer_step_sees_the_new_weights(fused):
    """Fused AdamW does not bump the weights' version (the bug of the old weakref cache): a copy made at
    each evaluation holds the weights of that moment, and there is nothing to invalidate."""
    model, batch = _model(), _batch([9, 5])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=fused)
    for _ in range(2):
        fast = accelerate_for_inference(model)
        torch.testing.assert_close(_outputs(fast, batch), _outputs(model.eval(), batch), atol=1e-5, rtol=1e-5)
        model.train()
        model(**batch).last_hidden_state.pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()


def test_hooked_pruned_or_parametrized_layers_stay_as_they_are():
    model, batch = _model(), _batch([9, 5])
    seen = []
    model.layers[0].qkv.register_forward_hook(lambda module, args, out: seen.append(out.shape))
    torch.nn.utils.prune.l1_unstructured(model.layers[1].ffn_in, "weight", amount=0.5)
    with torch.no_grad():
        model.layers[1].ffn_in.weight_orig.mul_(2)  # prune recomputes the weight in a pre-hook
    torch.nn.utils.parametrize.register_parametrization(model.layers[0].ffn_out, "weight", _Doubled())
    expected = _outputs(model, batch)["last_hidden_state"]
    fast = accelerate_for_inference(model)
    seen.clear()
    torch.testing.assert_close(_outputs(fast, batch)["last_hidden_state"], expected, atol=1e-5, rtol=1e-5)
    assert len(seen) == 1  # the hook ran
    assert len(_packed(fast)) == 4 * model.config.num_hidden_layers - 3  # the three hooked layers were kept


class _Doubled(torch.nn.Module):
    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        return 2 * weight


@pytest.mark.parametrize("off", ["environment", "no-kernels", "not-faster"])
def test_no_packing_where_switched_off_missing_or_not_faster(off, monkeypatch):
    if off == "environment":
        monkeypatch.setenv("BERTKIT_CPU_KERNELS", "0")
    elif off == "no-kernels":
        monkeypatch.setattr("bertkit.model.accelerate.onednn_works", lambda dtype: False)
    else:
        monkeypatch.setattr(probe, "choices", lambda width: probe.Choices("fp32", "fp32", (), {}, ()))
    model, batch = _model(), _batch([9, 5])
    fast = accelerate_for_inference(model)
    assert not _packed(fast)
    torch.testing.assert_close(_outputs(fast, batch), _outputs(model, batch), atol=0, rtol=0)


def test_a_model_built_in_inference_mode_is_accelerated():
    with torch.inference_mode():
        model, batch = _model(), _batch([9, 5])
        fast = accelerate_for_inference(model)
    assert _packed(fast)
    torch.testing.assert_close(_outputs(fast, batch), _outputs(model, batch), atol=1e-5, rtol=1e-5)


def test_accelerating_twice_or_an_unknown_precision_is_refused():
    fast = accelerate_for_inference(_model())
    with pytest.raises(ValueError, match="already accelerated"):
        accelerate_for_inference(fast)
    with pytest.raises(ValueError, match="auto"):
        accelerate_for_inference(_model(), "auto")
    with pytest.raises(ValueError, match="autocast"):
        accelerate_for_inference(_model(), "bf16", autocast=True)


def test_a_compiled_model_is_accelerated_eagerly(batch, monkeypatch):
    """compile_model fixes the padded backend and compiles each layer; the accelerated copy is eager
    again, with the padding-free measured attention, and the compiled original is untouched."""
    monkeypatch.setattr(torch, "compile", lambda forward, **options: functools.partial(forward))  # no dynamo here
    model = compile_model(_model())
    assert repr(model.attention) == "PaddedSDPA()" and all("forward" in vars(layer) for layer in model.layers)
    fast = accelerate_for_inference(model)
    assert repr(fast.attention) == "Dispatch(measured)" and not any("forward" in vars(layer) for layer in fast.layers)
    assert all("forward" in vars(layer) for layer in model.layers)
    expected = _outputs(_model(), batch)
    torch.testing.assert_close(_outputs(fast, batch), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kernels", ["on", "off"])
def test_the_copy_holds_the_measured_attention_and_the_original_does_not(kernels, monkeypatch):
    """The probe is read when the copy is built (not in a forward): its Dispatch holds the choices and runs
    CpuBmm where they won (bf16 at 49-192 tokens here); BERTKIT_CPU_KERNELS=0 leaves them out. The
    original keeps the plain Dispatch, and a backend fixed by the caller is kept."""
    if kernels == "off":
        monkeypatch.setenv("BERTKIT_CPU_KERNELS", "0")
    model = _model()
    fast = accelerate_for_inference(model, "bf16")
    assert repr(model.attention) == "Dispatch()"
    assert fast.attention.cpu == (probe.choices(32) if kernels == "on" else None)
    x = torch.zeros(2, 64, 32, dtype=torch.bfloat16)
    expected = "PerSequence(CpuBmm())" if kernels == "on" else "PerSequence(PaddedSDPA())"
    assert repr(fast.attention.select(x, padded=True, dropout_p=0.0)) == expected
    model.attention = PaddedSDPA()
    assert repr(accelerate_for_inference(model).attention) == "PaddedSDPA()"
