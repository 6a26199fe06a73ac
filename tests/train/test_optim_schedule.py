"""Optimizers and schedules: the no-decay rule, every schedule's parity with its transformers
counterpart, the time-budget schedule, and LAMB's update against its definition (You et al. 2019,
Algorithm 2)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import (
    get_constant_schedule_with_warmup,
    get_cosine_schedule_with_warmup,
    get_inverse_sqrt_schedule,
    get_linear_schedule_with_warmup,
)

from bertkit.errors import BertkitError
from bertkit.train.optim import SCHEDULES, Lamb, build_optimizer, build_schedule, parameter_groups, warmup_linear_decay

REFERENCES = {
    "linear": lambda opt, warmup, total: get_linear_schedule_with_warmup(opt, warmup, total),
    "cosine": lambda opt, warmup, total: get_cosine_schedule_with_warmup(opt, warmup, total),
    "constant-with-warmup": lambda opt, warmup, total: get_constant_schedule_with_warmup(opt, warmup),
    "inverse-sqrt": lambda opt, warmup, total: get_inverse_sqrt_schedule(opt, warmup),
}


def test_no_decay_on_biases_and_layernorm():
    model = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 4), nn.LayerNorm(4))
    decay, no_decay = parameter_groups(model, weight_decay=0.01)
    assert {id(p) for p in decay["params"]} == {id(model[0].weight), id(model[1].weight)}
    assert {id(p) for p in no_decay["params"]} == {id(model[1].bias), id(model[2].weight), id(model[2].bias)}
    assert (decay["weight_decay"], no_decay["weight_decay"]) == (0.01, 0.0)


@pytest.mark.parametrize("name", sorted(SCHEDULES))
@pytest.mark.parametrize("warmup_steps,total", [(0, 10), (3, 10), (10, 40)])
def test_step_schedule_matches_transformers(name, warmup_steps, total):
    if name == "inverse-sqrt" and warmup_steps == 0:
        pytest.skip("inverse-sqrt needs a warmup (tested below)")
    ours = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1e-3)
    theirs = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1e-3)
    schedule = build_schedule(ours, lambda step: step / total, warmup_steps / total, name)
    reference = REFERENCES[name](theirs, warmup_steps, total)
    for _ in range(total):
        assert schedule.get_last_lr()[0] == pytest.approx(reference.get_last_lr()[0], abs=1e-12)
        ours.step(), theirs.step(), schedule.step(), reference.step()


def test_unknown_schedule_and_inverse_sqrt_without_warmup_are_user_errors():
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1e-3)
    with pytest.raises(BertkitError, match="--lr-schedule 'step'"):
        build_schedule(optimizer, lambda step: step / 10, 0.1, "step")
    with pytest.raises(BertkitError, match="inverse-sqrt .*warmup"):
        build_schedule(optimizer, lambda step: step / 10, 0.0, "inverse-sqrt")


def test_time_schedule_follows_elapsed_fraction():
    assert warmup_linear_decay(0.05, warmup=0.1) == pytest.approx(0.5)
    assert warmup_linear_decay(0.1, warmup=0.1) == pytest.approx(1.0)
    assert warmup_linear_decay(0.55, warmup=0.1) == pytest.approx(0.5)
    assert warmup_linear_decay(1.0, warmup=0.1) == 0.0


def test_lamb_step_matches_definition():
    torch.manual_seed(0)
    weight = nn.Parameter(torch.randn(5, 3))
    grads = [torch.randn(5, 3) for _ in range(2)]
    lr, beta1, beta2, eps, wd = 0.1, 0.9, 0.999, 1e-6, 0.01
    optimizer = Lamb([weight], lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=wd)
    w, m, v = weight.detach().clone(), torch.zeros(5, 3), torch.zeros(5, 3)
    for t, grad in enumerate(grads, start=1):
        weight.grad = grad.clone()
        optimizer.step()
        m, v = beta1 * m + (1 - beta1) * grad, beta2 * v + (1 - beta2) * grad**2
        r = (m / (1 - beta1**t)) / ((v / (1 - beta2**t)).sqrt() + eps) + wd * w
        w = w - lr * (w.norm() / r.norm()) * r
        torch.testing.assert_close(weight.detach(), w)


def test_lamb_trust_ratio_is_one_for_zero_weights():
    bias = nn.Parameter(torch.zeros(4))
    bias.grad = torch.ones(4)
    Lamb([bias], lr=0.1).step()
    torch.testing.assert_close(bias.detach(), torch.full((4,), -0.1), atol=1e-5, rtol=0)


def test_build_optimizer_uses_groups():
    model = nn.Linear(3, 3)
    optimizer = build_optimizer(model, "adamw", 1e-4, 0.01, (0.9, 0.999), 1e-6)
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.01, 0.0]
    assert isinstance(build_optimizer(model, "lamb", 1e-4, 0.01, (0.9, 0.999), 1e-6), Lamb)
