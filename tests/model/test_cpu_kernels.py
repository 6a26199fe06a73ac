"""The CPU inference kernels (model/cpu.py): same numbers as eager PyTorch, taken only where they apply,
and the packed-weight cache follows every way the weights can change."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
import torch.nn.utils.parametrize
import torch.nn.utils.prune

from bertkit import model as bm
from bertkit.config import preset
from bertkit.model import cpu

pytestmark = pytest.mark.skipif(not cpu._onednn_works(torch.float32), reason="this PyTorch build has no oneDNN")
needs_bf16 = pytest.mark.skipif(not cpu._onednn_works(torch.bfloat16), reason="oneDNN has no bf16 on this CPU")

HEADS = ["BertModel", "BertForPreTraining", "BertForMaskedLM", "BertForSequenceClassification",
         "BertForTokenClassification", "BertForQuestionAnswering", "BertForMultipleChoice"]


@pytest.fixture
def calls(monkeypatch) -> dict[str, int]:
    """Counts of the fused kernels' calls."""
    counts = {"linear": 0, "bmm_attention": 0}
    for name in counts:
        original = getattr(cpu, name)

        def counted(*args, _name=name, _original=original, **kwargs):
            counts[_name] += 1
            return _original(*args, **kwargs)
        monkeypatch.setattr(cpu, name, counted)
    return counts


def _model(name: str = "BertModel", dtype: torch.dtype = torch.float32, **overrides) -> torch.nn.Module:
    torch.manual_seed(0)
    config = preset("bert-debug", vocab_size=99, num_labels=3, max_position_embeddings=256, **overrides)
    return bm.MODEL_CLASSES[name](config).eval().to(dtype)


def _batch(lengths: list[int], seq_len: int | None = None) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    seq_len = seq_len or max(lengths)
    input_ids = torch.randint(1, 99, (len(lengths), seq_len), generator=generator)
    mask = (torch.arange(seq_len) < torch.tensor(lengths)[:, None]).long()
    return {"input_ids": input_ids * mask, "token_type_ids": torch.zeros_like(input_ids), "attention_mask": mask}


def _outputs(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    if isinstance(model, bm.BertForMultipleChoice):
        batch = {k: v.unsqueeze(0) for k, v in batch.items()}
    with torch.inference_mode():
        out = model(**batch)
    return {k: v.float() for k, v in vars(out).items() if isinstance(v, torch.Tensor)}


@pytest.mark.parametrize("name", HEADS)
@pytest.mark.parametrize("lengths", [[9, 5, 2], [7, 7, 7]], ids=["padded", "full"])
def test_fused_path_equals_eager_fp32_every_head(name, lengths, calls):
    model, batch = _model(name), _batch(lengths)
    fused = _outputs(model, batch)
    assert calls["linear"] == 4 * model.config.num_hidden_layers
    with cpu.disabled():
        eager = _outputs(model, batch)
    assert calls["linear"] == 4 * model.config.num_hidden_layers  # nothing fused inside disabled()
    real = batch["attention_mask"].bool()
    for key, expected in eager.items():
        actual = fused[key]
        if expected.shape[:2] == real.shape:
            actual, expected = actual[real], expected[real]
        torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5, msg=key)


@pytest.mark.parametrize("activation", ["gelu", "gelu_new", "relu"])
def test_fused_activations_equal_eager(activation):
    model, batch = _model(hidden_act=activation), _batch([12, 3])
    with cpu.disabled():
        eager = _outputs(model, batch)["last_hidden_state"]
    torch.testing.assert_close(_outputs(model, batch)["last_hidden_state"], eager, atol=1e-5, rtol=1e-5)


@needs_bf16
@pytest.mark.parametrize("lengths", [[64, 64], [120, 70, 30]], ids=["full", "padded"])
def test_bf16_is_as_close_to_fp32_as_eager_bf16(lengths, calls):
    """Sequences of 49-192 tokens take the bmm attention in bf16; the fused path's error against the
    fp32 result must be of the same size as eager bf16's."""
    reference = _outputs(_model(), _batch(lengths))["last_hidden_state"]
    model = _model(dtype=torch.bfloat16)
    fused = _outputs(model, _batch(lengths))["last_hidden_state"]
    assert calls["bmm_attention"] == model.config.num_hidden_layers * (1 if lengths[0] == lengths[-1] else 2)
    with cpu.disabled():
        eager = _outputs(model, _batch(lengths))["last_hidden_state"]
    real = _batch(lengths)["attention_mask"].bool()
    fused_error = (fused - reference)[real].abs().mean()
    eager_error = (eager - reference)[real].abs().mean()
    assert fused_error < 1.5 * eager_error + 1e-3


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bmm_attention_equals_sdpa(dtype):
    generator = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(3, 2, 4, 64, 16, generator=generator).to(dtype)
    expected = F.scaled_dot_product_attention(q.float(), k.float(), v.float())
    tolerance = 1e-6 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(cpu.bmm_attention(q, k, v).float(), expected, atol=tolerance, rtol=tolerance)


def test_bmm_attention_only_for_its_lengths_without_mask_or_dropout():
    with torch.inference_mode():
        q = torch.zeros(1, 2, 64, 8, dtype=torch.bfloat16)
        assert cpu.bmm_attention_applies(q, None, 0.0)
        assert not cpu.bmm_attention_applies(q, torch.ones(1, 1, 1, 64, dtype=torch.bool), 0.0)
        assert not cpu.bmm_attention_applies(q, None, 0.1)
        assert not cpu.bmm_attention_applies(q.float(), None, 0.0)  # fp32: the flash kernel is faster
        assert not cpu.bmm_attention_applies(q[:, :, :16], None, 0.0)  # short: the flash kernel is faster
        assert not cpu.bmm_attention_applies(torch.zeros(1, 2, 256, 8, dtype=torch.bfloat16), None, 0.0)
    assert not cpu.bmm_attention_applies(q, None, 0.0)  # autograd on


def test_training_and_autograd_keep_the_eager_path(calls):
    model, batch = _model(), _batch([9, 5])
    model.train()
    model(**batch).last_hidden_state.sum().backward()  # the fused kernels have no backward
    assert all(p.grad is not None for p in model.layers.parameters())
    model.eval()
    model(**batch)  # eval with autograd on
    with torch.no_grad():
        model.train()(**batch)  # dropout is active in training mode
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.float16):  # only bf16 autocast is handled
        model.eval()(**batch)
    assert calls == {"linear": 0, "bmm_attention": 0}


@needs_bf16
@pytest.mark.parametrize("name", ["BertForSequenceClassification", "BertForQuestionAnswering"])
def test_bf16_autocast_evaluation_is_fused_and_as_close_as_eager(name, calls):
    """Evaluation during training and `bertkit predict` run an fp32 model under bf16 autocast."""
    model, batch = _model(name), _batch([120, 70, 30])
    reference = _outputs(model, batch)
    fused_calls = calls["linear"]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fused = _outputs(model, batch)
        assert calls["linear"] == 2 * fused_calls and calls["bmm_attention"] > 0
        with cpu.disabled():
            eager = _outputs(model, batch)
    for key in reference:
        fused_error = (fused[key] - reference[key]).abs().mean()
        eager_error = (eager[key] - reference[key]).abs().mean()
        assert fused_error < 1.5 * eager_error + 1e-3, key
    after = _outputs(model, batch)  # without autocast again: the fp32 packed weights are kept apart
    for key in reference:
        torch.testing.assert_close(after[key], reference[key], atol=1e-6, rtol=1e-6)


def test_packed_weights_follow_every_change_of_the_weights():
    model, batch = _model(), _batch([9, 5])

    def check() -> None:
        with cpu.disabled():
            expected = _outputs(model, batch)["last_hidden_state"]
        torch.testing.assert_close(_outputs(model, batch)["last_hidden_state"], expected, atol=1e-5, rtol=1e-5)

    def packed() -> list[torch.Tensor]:
        return [cpu._packed[linear][torch.float32][2] for layer in model.layers
                for linear in (layer.qkv, layer.attn_out, layer.ffn_in, layer.ffn_out)]

    check()  # packs every weight
    first = packed()
    check()
    assert all(a is b for a, b in zip(first, packed(), strict=True))  # the second call reuses them
    with torch.no_grad():  # an in-place update, as an optimizer step does
        for layer in model.layers:
            layer.ffn_in.weight.mul_(1.5)
    check()
    model.load_state_dict(_model(initializer_range=0.1).state_dict())  # copy_ into the same tensors
    check()
    model.layers[0].qkv.weight.data = torch.randn_like(model.layers[0].qkv.weight)  # storage swapped
    check()
    model.layers[1].attn_out.weight = torch.nn.Parameter(torch.randn_like(model.layers[1].attn_out.weight))
    check()
    model.to(torch.bfloat16).to(torch.float32)  # dtype round trip
    check()


def test_environment_variable_turns_the_kernels_off():
    code = "from bertkit.model import cpu; print(cpu._enabled)"
    env = {**os.environ, "BERTKIT_CPU_KERNELS": "0"}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


@pytest.mark.parametrize("fused", [True, False], ids=["fused-adamw", "for-loop-adamw"])
def test_evaluation_after_an_optimizer_step_sees_the_new_weights(fused):
    """PyTorch's fused AdamW does not bump the weights' version: the training forward before the step
    must drop the packed weights, or the next evaluation runs the old ones."""
    model, batch = _model(), _batch([9, 5])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=fused)
    for _ in range(2):
        model.eval()
        with torch.no_grad():
            fused_out = model(**batch).last_hidden_state
            with cpu.disabled():
                eager_out = model(**batch).last_hidden_state
        torch.testing.assert_close(fused_out, eager_out, atol=1e-5, rtol=1e-5)
        model.train()
        model(**batch).last_hidden_state.pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()


def test_hooked_pruned_or_parametrized_layers_keep_the_eager_path(calls):
    model, batch = _model(), _batch([9, 5])
    seen = []
    model.layers[0].qkv.register_forward_hook(lambda module, args, out: seen.append(out.shape))
    torch.nn.utils.prune.l1_unstructured(model.layers[1].ffn_in, "weight", amount=0.5)
    with torch.no_grad():
        model.layers[1].ffn_in.weight_orig.mul_(2)  # prune recomputes the weight in a pre-hook
    torch.nn.utils.parametrize.register_parametrization(model.layers[0].ffn_out, "weight", _Doubled())
    with cpu.disabled():
        expected = _outputs(model, batch)["last_hidden_state"]
    seen.clear()
    torch.testing.assert_close(_outputs(model, batch)["last_hidden_state"], expected, atol=1e-5, rtol=1e-5)
    assert len(seen) == 1  # the hook ran
    assert calls["linear"] == 4 * model.config.num_hidden_layers - 3  # the three hooked layers were eager


class _Doubled(torch.nn.Module):
    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        return 2 * weight


def test_activation_and_residual_together_are_refused():
    layer, x = torch.nn.Linear(4, 4), torch.randn(2, 4)
    with torch.no_grad(), pytest.raises(ValueError, match="not both"):
        cpu.linear(x, layer, "gelu", residual=x)


@needs_bf16
def test_casting_the_model_frees_the_other_dtype_packing():
    model, batch = _model(), _batch([9, 5])
    _outputs(model, batch)
    model.to(torch.bfloat16)
    _outputs(model, batch)
    assert all(list(cpu._packed[layer.qkv]) == [torch.bfloat16] for layer in model.layers)


def test_model_built_in_inference_mode_runs_fused():
    """Inference tensors have no version counter: their weights are packed per call, not cached."""
    with torch.inference_mode():
        model, batch = _model(), _batch([9, 5])
        fused = model(**batch).last_hidden_state
        with cpu.disabled():
            eager = model(**batch).last_hidden_state
    torch.testing.assert_close(fused, eager, atol=1e-5, rtol=1e-5)


def test_a_build_without_working_kernels_keeps_the_eager_path(monkeypatch, calls):
    monkeypatch.setattr(cpu, "_onednn_works", lambda dtype: False)
    model, batch = _model(), _batch([9, 5])
    with cpu.disabled():
        expected = _outputs(model, batch)["last_hidden_state"]
    torch.testing.assert_close(_outputs(model, batch)["last_hidden_state"], expected, atol=0, rtol=0)
    assert calls["linear"] == 0


def test_writes_pytorch_does_not_count_need_forget_all():
    """The documented limit: a write through `.data` does not bump the version, so the packed weights
    stay until `forget_all()` (or a training forward) drops them."""
    model, batch = _model(), _batch([9, 5])
    before = _outputs(model, batch)["last_hidden_state"]
    model.layers[0].ffn_in.weight.data.mul_(2)
    assert torch.equal(_outputs(model, batch)["last_hidden_state"], before)  # still the old packing
    cpu.forget_all()
    with cpu.disabled():
        expected = _outputs(model, batch)["last_hidden_state"]
    torch.testing.assert_close(_outputs(model, batch)["last_hidden_state"], expected, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(expected, before)
