"""The counter-based CPU dropout (bertkit.kernels.dropout) and the module that runs it where measured faster
(bertkit.model.accelerate.MeasuredDropout): SplitMix64 bit for bit, the drop rate and independence of its masks,
inverted dropout's scale, the backward through the forward's mask, and masks that replay from torch's RNG."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from bertkit.config import preset
from bertkit.kernels import dropout as kernels
from bertkit.model import BertForSequenceClassification, enable_gradient_checkpointing
from bertkit.model.accelerate import MeasuredDropout, drop_as_measured_for_training
from bertkit.runtime import probe

MASK64 = (1 << 64) - 1


def splitmix64_reference(count: int, seed: int) -> list[int]:
    """SplitMix64 as published (Steele, Lea and Flood 2014; Vigna's splitmix64.c), in Python's big integers."""
    state, out = seed & MASK64, []
    for _ in range(count):
        state = (state + 0x9E3779B97F4A7C15) & MASK64
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        out.append(z ^ (z >> 31))
    return out


@pytest.mark.parametrize("seed", [0, 1, 12345, -1, -(1 << 63), (1 << 63) - 1])
def test_the_words_are_splitmix64_bit_for_bit(seed):
    words = kernels.splitmix64(1000, seed)
    assert [w & MASK64 for w in words.tolist()] == splitmix64_reference(1000, seed)


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_the_mask_is_the_words_16_bit_lanes_against_the_threshold(p):
    """Element i is kept when lane i % 4 (little-endian) of word i // 4 of the published generator, read as an
    unsigned 16-bit value, is at least round(p * 65536) (the kernel compares signed lanes; the same count of values
    passes), computed here from the reference generator alone."""
    seed, count = 99, 4 * 50 + 3
    words = splitmix64_reference(-(-count // 4), seed)
    threshold = round(p * 65536)
    expected = [((words[i // 4] >> (16 * (i % 4))) & 0xFFFF ^ 0x8000) >= threshold for i in range(count)]
    assert kernels.keep_mask((count,), p, seed).tolist() == expected


@pytest.mark.parametrize("p", [0.1, 0.25, 0.5, 0.9])
def test_the_drop_rate_is_p_to_16_bits(p):
    """Over 2**20 elements the kept share is 1 - round(p * 65536) / 65536 within 5 standard deviations."""
    n = 1 << 20
    keep = 1 - kernels.drop_threshold(p) / 65536
    assert abs(keep - (1 - p)) <= 1 / 65536
    share = kernels.keep_mask((n,), p, seed=7).float().mean().item()
    assert abs(share - keep) <= 5 * math.sqrt(keep * (1 - keep) / n)


def test_masks_are_independent_across_lanes_words_and_seeds():
    """Neighbouring elements (the four lanes of a word, and across words) and two seeds' masks are kept together as
    often as independent draws are: (1 - p)^2, within 5 standard deviations."""
    n, p = 1 << 20, 0.5
    mask = kernels.keep_mask((n,), p, seed=3).float()
    other = kernels.keep_mask((n,), p, seed=4).float()
    sd = 5 * math.sqrt(0.25 * 0.75 / n)
    for lag in (1, 2, 3, 4, 5, 8):
        assert abs((mask[:-lag] * mask[lag:]).mean().item() - 0.25) <= sd
    assert abs((mask * other).mean().item() - 0.25) <= sd
    assert not torch.equal(mask, other)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_forward_and_backward_are_inverted_dropout_through_one_mask(dtype):
    x = torch.randn(64, 33, dtype=dtype).requires_grad_()
    torch.manual_seed(0)
    out = kernels.dropout(x, 0.1)
    torch.manual_seed(0)
    mask = kernels.keep_mask(x.shape, 0.1, kernels.draw_seed())
    scale = 65536 / (65536 - kernels.drop_threshold(0.1))
    assert out.dtype == dtype
    wide = torch.promote_types(dtype, torch.float32)  # the product computed at least in fp32, then rounded once
    torch.testing.assert_close(out, torch.where(mask, x.detach().to(wide) * scale, 0.0).to(dtype), atol=0, rtol=0)
    grad = torch.randn_like(x)
    out.backward(grad)
    torch.testing.assert_close(x.grad, torch.where(mask, grad.to(wide) * scale, 0.0).to(dtype), atol=0, rtol=0)
    assert 0 < (~mask).sum() < mask.numel() // 4


def test_non_contiguous_and_empty_inputs():
    """A transposed view drops as its contiguous copy does (the mask follows the logical order); an empty tensor
    gives an empty one, with a gradient."""
    x = torch.randn(8, 6)
    torch.manual_seed(1)
    view = kernels.dropout(x.t(), 0.5)
    torch.manual_seed(1)
    assert torch.equal(view, kernels.dropout(x.t().contiguous(), 0.5))
    empty = torch.zeros(0, 4, requires_grad=True)
    out = kernels.dropout(empty, 0.1)
    out.sum().backward()
    assert out.shape == (0, 4) and empty.grad.shape == (0, 4)


def test_the_output_keeps_the_input_expectation():
    x = torch.full((1 << 20,), 3.0)
    assert abs(kernels.dropout(x, 0.1).mean().item() - 3.0) < 5 * 3.0 * math.sqrt(0.1 / 0.9 / (1 << 20))


def test_masks_replay_from_torchs_rng_and_each_call_draws_one_seed():
    """torch.manual_seed reproduces every mask; consecutive calls differ; a call advances the global RNG by one
    draw, so a checkpoint's saved RNG state resumes the masks."""
    x = torch.ones(1000)
    torch.manual_seed(5)
    first, second = kernels.dropout(x, 0.3), kernels.dropout(x, 0.3)
    torch.manual_seed(5)
    assert torch.equal(kernels.dropout(x, 0.3), first) and not torch.equal(first, second)
    torch.manual_seed(5)
    kernels.draw_seed()
    assert torch.equal(kernels.dropout(x, 0.3), second)


def test_no_dropout_passes_the_input_and_extremes_fall_back_to_torch(monkeypatch):
    x = torch.randn(10)
    assert kernels.dropout(x, 0.0) is x and kernels.dropout(x, 0.5, training=False) is x
    monkeypatch.setattr(kernels._CounterDropout, "apply", lambda *a: pytest.fail("counter masks beyond 16 bits"))
    assert torch.equal(kernels.dropout(x, 1.0), torch.zeros(10))  # F.dropout's: everything dropped
    torch.testing.assert_close(kernels.dropout(x, 1e-9), x)  # below 16 bits: torch's, which keeps all (nearly)
    assert kernels.dropout(x, 1 - 1e-9).shape == x.shape  # beyond 16 bits at the other end: torch's too


def test_gradient_checkpointing_recomputes_the_same_masks(monkeypatch):
    """A layer recomputed in the backward replays its counter-based masks (hidden states' and BatchedBmm's
    attention weights') from the saved RNG state: the gradients equal those without recomputation."""
    from bertkit.model.accelerate import train_as_measured

    config = preset("bert-debug", vocab_size=64, num_labels=3)
    seeds = []
    real_draw = kernels.draw_seed
    monkeypatch.setattr(kernels, "draw_seed", lambda: seeds.append(1) or real_draw())
    grads = []
    for recompute in (False, True):
        torch.manual_seed(0)
        model = BertForSequenceClassification(config).train()
        assert train_as_measured(model, probe.choices(config.hidden_size))
        if recompute:
            enable_gradient_checkpointing(model)
        ids = torch.randint(5, 64, (3, 12), generator=torch.Generator().manual_seed(1))
        torch.manual_seed(2)
        F.cross_entropy(model(ids).logits, torch.tensor([0, 1, 2])).backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
        assert seeds, "the counter-based masks did not run"
        seeds.clear()
    torch.testing.assert_close(grads[0], grads[1])


def test_measured_dropout_runs_the_counter_masks_only_where_measured_faster(monkeypatch):
    """Swapped in for every nn.Dropout where the choices take the counter-based masks in some precision; it runs
    them for those dtypes in training on a CPU, torch's dropout for the others, nothing in eval mode; the model's
    state_dict keeps its keys."""
    config = preset("bert-debug", vocab_size=64, num_labels=3)
    model = BertForSequenceClassification(config)
    keys = list(model.state_dict())
    bf16_only = probe.Choices("bf16", "bf16", (), {}, (), counter_dropout=("bf16",))
    assert drop_as_measured_for_training(model, bf16_only)
    dropouts = [m for m in model.modules() if isinstance(m, torch.nn.Dropout)]
    assert dropouts and all(type(m) is MeasuredDropout for m in dropouts) and list(model.state_dict()) == keys
    calls = []
    monkeypatch.setattr("bertkit.model.accelerate.counter_dropout", lambda x, p: calls.append(x.dtype) or x)
    module = dropouts[0].train()
    module(torch.ones(4, dtype=torch.bfloat16))
    kept = module(torch.ones(1000))  # fp32: torch's dropout
    assert calls == [torch.bfloat16] and 0 < (kept == 0).sum() < 1000
    assert torch.equal(module.eval()(torch.ones(4)), torch.ones(4))
    none = probe.Choices("bf16", "bf16", (), {}, ())
    assert not drop_as_measured_for_training(BertForSequenceClassification(config), none)
