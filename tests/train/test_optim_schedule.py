"""Optimizers and schedules: the no-decay rule, every schedule's parity with its transformers
counterpart, the time-budget schedule, and LAMB's update against its definition (You et al. 2019,
Algorithm 2) with vectors (biases, LayerNorm) excluded from layer adaptation, no host read in its step,
and its exact resume through the checkpoint files."""

from __future__ import annotations

import copy

import pytest
import torch
from safetensors.torch import load_file
from torch import nn
from transformers import (
    get_constant_schedule_with_warmup,
    get_cosine_schedule_with_warmup,
    get_inverse_sqrt_schedule,
    get_linear_schedule_with_warmup,
)

from bertkit.errors import BertkitError
from bertkit.train.checkpoint import load_optimizer, save_optimizer
from bertkit.train.optim import (
    SCHEDULES,
    Lamb,
    LearningRateSchedule,
    build_optimizer,
    parameter_groups,
    warmup_linear_decay,
)

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
    ours = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0)
    theirs = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1e-3)
    schedule = LearningRateSchedule(1e-3, lambda step: step / total, warmup_steps / total, name)
    reference = REFERENCES[name](theirs, warmup_steps, total)
    for step in range(total):
        assert schedule.apply(ours, step) == pytest.approx(reference.get_last_lr()[0], abs=1e-12)
        assert ours.param_groups[0]["lr"] == schedule(step)
        theirs.step(), reference.step()


def test_unknown_schedule_and_inverse_sqrt_without_warmup_are_user_errors():
    with pytest.raises(BertkitError, match="--lr-schedule 'step'"):
        LearningRateSchedule(1e-3, lambda step: step / 10, 0.1, "step")
    with pytest.raises(BertkitError, match="inverse-sqrt .*warmup"):
        LearningRateSchedule(1e-3, lambda step: step / 10, 0.0, "inverse-sqrt")


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


def _randomised(model: nn.Module, seed: int = 0) -> nn.Module:
    """Every parameter random and non-zero at its own scale, so a trust ratio would differ from 1."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for index, parameter in enumerate(model.parameters()):
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * (0.2 + index))
    return model


def _regression_bias_norm(optimizer_name: str, steps: int) -> float:
    """The issue's toy problem, smaller: a linear regression whose target has a bias of 3 per output;
    the model's bias starts at zero."""
    torch.manual_seed(0)
    x, w_true = torch.randn(256, 8), torch.randn(8, 4)
    y = x @ w_true + 3.0
    model = nn.Linear(8, 4)
    nn.init.zeros_(model.bias)
    optimizer = build_optimizer(model, optimizer_name, 1e-2, 0.01, (0.9, 0.999), 1e-6)
    for _ in range(steps):
        optimizer.zero_grad()
        ((model(x) - y) ** 2).mean().backward()
        optimizer.step()
    return model.bias.norm().item()


def test_lamb_grows_a_zero_bias_like_adamw():
    # With the trust ratio on the bias, ||b|| / ||update|| starts near lr and the bias stays near zero
    # (0.14 here after 200 steps against AdamW's 3.4).
    adamw, lamb = _regression_bias_norm("adamw", 200), _regression_bias_norm("lamb", 200)
    assert adamw > 3.0
    assert lamb == pytest.approx(adamw, rel=0.05)


def test_lamb_trust_ratio_is_one_for_vectors():
    """One step by hand: a bias and LayerNorm's gain and shift move by lr x Adam's direction, unscaled."""
    model = _randomised(nn.Sequential(nn.Linear(4, 6), nn.LayerNorm(6)))
    vectors = [model[0].bias, model[1].weight, model[1].bias]
    grads = [torch.randn(v.shape, generator=torch.Generator().manual_seed(i)) for i, v in enumerate(vectors)]
    lr, beta1, beta2, eps = 0.1, 0.9, 0.999, 1e-6
    optimizer = Lamb(vectors, lr=lr, betas=(beta1, beta2), eps=eps)
    before = [v.detach().clone() for v in vectors]
    for vector, grad in zip(vectors, grads):
        vector.grad = grad.clone()
    optimizer.step()
    for vector, grad, old in zip(vectors, grads, before):
        direction = (((1 - beta1) * grad) / (1 - beta1)) / ((((1 - beta2) * grad**2) / (1 - beta2)).sqrt() + eps)
        moved = (old - vector.detach()) / lr
        torch.testing.assert_close(moved / direction, torch.ones_like(direction))  # the trust ratio


def _algorithm_2(model: nn.Module, grads: list[list[torch.Tensor]], lr: float, betas: tuple[float, float],
                 eps: float, weight_decay: float) -> list[torch.Tensor]:
    """You et al. 2019, Algorithm 2 written out, with the trust ratio for matrices only and weight decay
    on matrices only (bertkit's rule for both)."""
    (beta1, beta2), params = betas, [p.detach().clone() for p in model.parameters()]
    moments = [(torch.zeros_like(p), torch.zeros_like(p)) for p in params]
    for t, step_grads in enumerate(grads, start=1):
        for i, (w, g) in enumerate(zip(params, step_grads)):
            m, v = moments[i]
            m, v = beta1 * m + (1 - beta1) * g, beta2 * v + (1 - beta2) * g**2
            moments[i] = (m, v)
            r = (m / (1 - beta1**t)) / ((v / (1 - beta2**t)).sqrt() + eps)
            if w.ndim >= 2:
                r = r + weight_decay * w
                params[i] = w - lr * (w.norm() / r.norm()) * r
            else:
                params[i] = w - lr * r
    return params


def test_lamb_matches_algorithm_2_on_matrices_and_vectors():
    model = _randomised(nn.Sequential(nn.Embedding(7, 4), nn.Linear(4, 5), nn.LayerNorm(5)))
    generator = torch.Generator().manual_seed(1)
    grads = [[torch.randn(p.shape, generator=generator) for p in model.parameters()] for _ in range(3)]
    lr, betas, eps, wd = 0.05, (0.9, 0.999), 1e-6, 0.01
    expected = _algorithm_2(model, grads, lr, betas, eps, wd)
    optimizer = build_optimizer(model, "lamb", lr, wd, betas, eps)
    for step_grads in grads:
        for parameter, grad in zip(model.parameters(), step_grads):
            parameter.grad = grad.clone()
        optimizer.step()
    for parameter, want in zip(model.parameters(), expected):
        torch.testing.assert_close(parameter.detach(), want)


def test_lamb_step_reads_no_tensor_on_the_host(monkeypatch):
    """On a GPU, .item()/bool()/float() of a device tensor waits for the device; the step uses none."""
    model = _randomised(nn.Sequential(nn.Linear(4, 6), nn.LayerNorm(6)))
    optimizer = build_optimizer(model, "lamb", 1e-3, 0.01, (0.9, 0.999), 1e-6)

    def host_read(*args, **kwargs):
        raise AssertionError("host read of a tensor inside Lamb.step")

    for name in ("item", "tolist", "numpy", "__bool__", "__float__", "__int__", "__index__"):
        monkeypatch.setattr(torch.Tensor, name, host_read)
    for _ in range(2):
        for parameter in model.parameters():
            parameter.grad = torch.ones_like(parameter)
        optimizer.step()


def _train_steps(model: nn.Module, optimizer: torch.optim.Optimizer, steps: range) -> None:
    for step in steps:
        generator = torch.Generator().manual_seed(step)
        x, y = torch.randn(16, 4, generator=generator), torch.randn(16, 3, generator=generator)
        optimizer.zero_grad()
        ((model(x) - y) ** 2).mean().backward()
        optimizer.step()


def test_lamb_resumes_bit_exactly_through_checkpoint_files(tmp_path):
    def fresh() -> tuple[nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 3))
        return model, build_optimizer(model, "lamb", 1e-2, 0.01, (0.9, 0.999), 1e-6)

    straight, straight_opt = fresh()
    _train_steps(straight, straight_opt, range(6))
    first, first_opt = fresh()
    _train_steps(first, first_opt, range(3))
    save_optimizer(first_opt, tmp_path)
    weights = copy.deepcopy(first.state_dict())
    resumed, resumed_opt = fresh()
    resumed.load_state_dict(weights)
    load_optimizer(resumed_opt, tmp_path)
    _train_steps(resumed, resumed_opt, range(3, 6))
    for a, b in zip(straight.parameters(), resumed.parameters()):
        assert torch.equal(a, b)
    steps = {key: value for key, value in load_file(str(tmp_path / "optimizer.safetensors")).items()
             if key.endswith(".step")}
    assert len(steps) == 6 and all(torch.equal(step, torch.tensor(3.0)) for step in steps.values())  # float32


def test_lamb_loads_a_tensor_step():
    """A state dict with a CPU tensor step of another dtype (torch's Adam, LAMB checkpoints before the int
    step) loads as LAMB's float32 step."""
    model, grads = nn.Linear(3, 2), [torch.ones(2, 3), torch.ones(2)]
    optimizer = Lamb(model.parameters(), lr=0.1)
    for parameter, grad in zip(model.parameters(), grads):
        parameter.grad = grad
    optimizer.step()
    state = optimizer.state_dict()
    for slots in state["state"].values():
        slots["step"] = torch.tensor(1, dtype=torch.int64)
    reloaded = Lamb(model.parameters(), lr=0.1)
    reloaded.load_state_dict(state)
    assert [s["step"] for s in reloaded.state.values()] == [torch.tensor(1.0)] * 2
    reloaded.step()
    assert all(s["step"].dtype == torch.float32 and s["step"] == 2 for s in reloaded.state.values())
