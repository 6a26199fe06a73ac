"""LAMB as one foreach update per group: its parity with Algorithm 2 (You et al. 2019) written out per
parameter in float64, a step whose operations do not grow with the number of parameters, the float32 step
count on the device, GradScaler's protocol (grad_scale unscales; found_inf skips on the device, leaving
everything bitwise as it was whatever the gradients hold), no host read in a step, and checkpoints: the
earlier int step counts load and continue, the new ones round-trip exactly."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from bertkit.io.jsonfile import read_json
from bertkit.train.checkpoint import load_optimizer, save_optimizer, write_json
from bertkit.train.optim import Lamb, build_optimizer

LR, BETAS, EPS = 0.05, (0.9, 0.999), 1e-6


def _model(layers: int = 1, seed: int = 0) -> nn.Module:
    """Matrices (embedding, linear weights) and vectors (biases, LayerNorm), every one random and non-zero at
    its own scale, so each trust ratio differs from 1."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Embedding(7, 4), *[nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
                                                 for _ in range(layers)])
    with torch.no_grad():
        for index, parameter in enumerate(model.parameters()):
            parameter.mul_(0).add_(torch.randn(parameter.shape) * (0.2 + index % 3))
    return model


def _gradients(model: nn.Module, steps: int, seed: int = 1) -> list[list[torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    return [[torch.randn(p.shape, generator=generator) for p in model.parameters()] for _ in range(steps)]


def _step(model: nn.Module, optimizer: torch.optim.Optimizer, grads: list[torch.Tensor], **attributes) -> None:
    """One step with these gradients, and grad_scale / found_inf set as GradScaler sets them."""
    for parameter, grad in zip(model.parameters(), grads):
        parameter.grad = grad.clone()
    for name, value in attributes.items():
        setattr(optimizer, name, value)
    optimizer.step()
    for name in attributes:
        delattr(optimizer, name)


class _Algorithm2:
    """You et al. 2019, Algorithm 2, one parameter at a time in float64 with an int step count each (the
    formulas and state layout of bertkit's LAMB before the tensor step): weight decay from the parameter's
    group, the trust ratio for matrices only, 1 when either norm is 0."""

    def __init__(self, model: nn.Module, decays: list[float]) -> None:
        self.weights = [p.detach().double().clone() for p in model.parameters()]
        self.decays = decays
        self.exp_avgs = [torch.zeros_like(w) for w in self.weights]
        self.exp_avg_sqs = [torch.zeros_like(w) for w in self.weights]
        self.steps = [0] * len(self.weights)

    def step(self, grads: list[torch.Tensor]) -> None:
        (beta1, beta2) = BETAS
        for i, (w, g, decay) in enumerate(zip(self.weights, grads, self.decays)):
            self.steps[i] = t = self.steps[i] + 1
            m = self.exp_avgs[i] = beta1 * self.exp_avgs[i] + (1 - beta1) * g.double()
            v = self.exp_avg_sqs[i] = beta2 * self.exp_avg_sqs[i] + (1 - beta2) * g.double() ** 2
            update = (m / (1 - beta1**t)) / ((v / (1 - beta2**t)).sqrt() + EPS) + decay * w
            w_norm, u_norm = w.norm().item(), update.norm().item()
            ratio = w_norm / u_norm if w.ndim >= 2 and w_norm > 0 and u_norm > 0 else 1.0
            self.weights[i] = w - LR * ratio * update

    def old_state_dict(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
        """This state as a checkpoint of the int-step LAMB held it: float32 moments, Python int steps."""
        index = {id(p): i for i, p in enumerate(p for g in optimizer.param_groups for p in g["params"])}  # torch's
        state = {index[id(p)]: {"step": t, "exp_avg": m.float(), "exp_avg_sq": v.float()}
                 for p, t, m, v in zip(model.parameters(), self.steps, self.exp_avgs, self.exp_avg_sqs)}
        return {"state": state, "param_groups": optimizer.state_dict()["param_groups"]}


def _decays(optimizer: torch.optim.Optimizer, model: nn.Module) -> list[float]:
    group_of = {id(p): g["weight_decay"] for g in optimizer.param_groups for p in g["params"]}
    return [group_of[id(p)] for p in model.parameters()]


def _assert_matches(model: nn.Module, reference: _Algorithm2) -> None:
    for parameter, want in zip(model.parameters(), reference.weights):
        torch.testing.assert_close(parameter.detach().double(), want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
def test_matches_algorithm_2_over_twenty_steps(weight_decay):
    model = _model(layers=2)
    optimizer = build_optimizer(model, "lamb", LR, weight_decay, BETAS, EPS)
    reference = _Algorithm2(model, _decays(optimizer, model))
    for grads in _gradients(model, 20):
        _step(model, optimizer, grads)
        reference.step(grads)
    _assert_matches(model, reference)
    assert all(s["step"].dtype == torch.float32 and s["step"].shape == () and s["step"] == 20
               for s in optimizer.state.values())


def test_one_group_of_matrices_and_vectors_adapts_only_the_matrices():
    model = _model()
    optimizer = Lamb(model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=0.01)  # decay on all, as grouped
    reference = _Algorithm2(model, [0.01] * len(list(model.parameters())))
    for grads in _gradients(model, 5):
        _step(model, optimizer, grads)
        reference.step(grads)
    _assert_matches(model, reference)


class _CountOps(TorchDispatchMode):
    """The aten operations a block dispatches (views aside: they launch nothing)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view:
            self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("skipping", [False, True])
def test_a_step_dispatches_as_many_operations_for_many_parameters_as_for_few(skipping):
    """Foreach: the operations of a step do not grow with the parameters (a per-parameter loop's would)."""
    counts = []
    for layers in (1, 6):
        model = _model(layers)
        optimizer = build_optimizer(model, "lamb", LR, 0.01, BETAS, EPS)
        grads = _gradients(model, 2)
        _step(model, optimizer, grads[0])  # the state is created at a first step, once per parameter
        if skipping:
            optimizer.found_inf, optimizer.grad_scale = torch.zeros(1), torch.ones(1)
        with _CountOps() as counted:
            optimizer.step()
        counts.append(len(counted.ops))
    assert counts[0] == counts[1]


def test_found_inf_leaves_everything_bitwise_unchanged_whatever_the_gradients():
    model = _model(layers=2)
    optimizer = build_optimizer(model, "lamb", LR, 0.01, BETAS, EPS)
    for grads in _gradients(model, 3):
        _step(model, optimizer, grads)
    before = copy.deepcopy((model.state_dict(), optimizer.state_dict()))
    poisoned = [torch.full_like(p, value) for p, value in zip(model.parameters(), [math.nan, math.inf, -math.inf] * 9)]
    _step(model, optimizer, poisoned, found_inf=torch.ones(1), grad_scale=torch.tensor(2.0**16))
    _step(model, optimizer, poisoned, found_inf=torch.tensor(1.0))
    after = (model.state_dict(), optimizer.state_dict())
    for key, value in before[0].items():
        assert torch.equal(after[0][key], value)
    for index, slots in before[1]["state"].items():
        for slot, value in slots.items():
            assert torch.equal(after[1]["state"][index][slot], value), (index, slot)


def test_a_skipped_first_step_leaves_the_weights_and_counts_nothing():
    model = _model()
    weights = copy.deepcopy(model.state_dict())
    optimizer = build_optimizer(model, "lamb", LR, 0.01, BETAS, EPS)
    grads = _gradients(model, 2)
    _step(model, optimizer, [g * math.nan for g in grads[0]], found_inf=torch.ones(()))
    assert all(torch.equal(p, weights[k]) for k, p in model.state_dict().items())
    assert all(s["step"] == 0 and not s["exp_avg"].any() and not s["exp_avg_sq"].any()
               for s in optimizer.state.values())
    _step(model, optimizer, grads[1])  # and the next one is the run's first
    fresh = _model()
    fresh_optimizer = build_optimizer(fresh, "lamb", LR, 0.01, BETAS, EPS)
    _step(fresh, fresh_optimizer, grads[1])
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), fresh.parameters()))


def test_found_inf_zero_and_grad_scale_compute_what_a_plain_step_does():
    """found_inf = 0 is bitwise a step without it; grad_scale s with gradients s times larger is bitwise the
    unscaled step (s a power of two: the division is exact), and leaves the gradients as they were."""
    grads = _gradients(_model(layers=2), 4)
    plain, zero, scaled = _model(layers=2), _model(layers=2), _model(layers=2)
    optimizers = [build_optimizer(m, "lamb", LR, 0.01, BETAS, EPS) for m in (plain, zero, scaled)]
    scale = torch.tensor([1024.0])
    for step_grads in grads:
        _step(plain, optimizers[0], step_grads)
        _step(zero, optimizers[1], step_grads, found_inf=torch.zeros(1))
        _step(scaled, optimizers[2], [g * 1024 for g in step_grads], found_inf=torch.zeros(1), grad_scale=scale)
    assert all(torch.equal(p.grad, g * 1024) for p, g in zip(scaled.parameters(), grads[-1]))
    for a, b, c in zip(plain.parameters(), zero.parameters(), scaled.parameters()):
        assert torch.equal(a, b) and torch.equal(a, c)
    unscaled = _model(layers=2)
    optimizer = build_optimizer(unscaled, "lamb", LR, 0.01, BETAS, EPS)
    for step_grads in grads:
        _step(unscaled, optimizer, [g * 1024 for g in step_grads], grad_scale=scale)  # grad_scale alone
    assert all(torch.equal(a, b) for a, b in zip(plain.parameters(), unscaled.parameters()))


def test_step_reads_nothing_on_the_host(monkeypatch):
    """On a GPU, .item()/bool()/float() of a device tensor waits for the device; the step uses none, with
    GradScaler's attributes set or not."""
    model = _model()
    optimizer = build_optimizer(model, "lamb", LR, 0.01, BETAS, EPS)
    grads = _gradients(model, 3)

    def host_read(*args, **kwargs):
        raise AssertionError("host read of a tensor inside Lamb.step")

    for name in ("item", "tolist", "numpy", "__bool__", "__float__", "__int__", "__index__"):
        monkeypatch.setattr(torch.Tensor, name, host_read)
    _step(model, optimizer, grads[0])
    _step(model, optimizer, grads[1], found_inf=torch.zeros(1), grad_scale=torch.full((1,), 8.0))
    _step(model, optimizer, grads[2], found_inf=torch.ones(()))


def test_step_runs_on_the_meta_device():
    """Tensors without values: any read of one on the host would raise."""
    model = _model().to("meta")
    optimizer = build_optimizer(model, "lamb", LR, 0.01, BETAS, EPS)
    for attributes in ({}, dict(found_inf=torch.zeros(1, device="meta"), grad_scale=torch.ones(1, device="meta"))):
        _step(model, optimizer, [torch.empty_like(p) for p in model.parameters()], **attributes)
    assert all(s["step"].device.type == "meta" for s in optimizer.state.values())


def test_an_int_step_checkpoint_continues_as_the_int_step_lamb_did():
    """A state dict of the earlier layout (Python int steps) loads as float32 device steps that go on
    counting: the next steps' bias corrections are those of steps 6..10, not 1..5."""
    model = _model(layers=2)
    grads = _gradients(model, 10)
    optimizer = build_optimizer(model, "lamb", LR, 0.01, BETAS, EPS)
    reference = _Algorithm2(model, _decays(optimizer, model))
    for step_grads in grads[:5]:
        reference.step(step_grads)
    with torch.no_grad():
        for parameter, weight in zip(model.parameters(), reference.weights):
            parameter.copy_(weight)
    optimizer.load_state_dict(reference.old_state_dict(model, optimizer))
    assert all(s["step"].dtype == torch.float32 and s["step"] == 5 for s in optimizer.state.values())
    for step_grads in grads[5:]:
        _step(model, optimizer, step_grads)
        reference.step(step_grads)
    _assert_matches(model, reference)


def _train(model: nn.Module, optimizer: torch.optim.Optimizer, grads: list[list[torch.Tensor]]) -> None:
    for step_grads in grads:
        _step(model, optimizer, step_grads)


def test_checkpoint_files_of_either_step_layout_resume_bit_exactly(tmp_path):
    grads = _gradients(_model(layers=2), 6)
    straight = _model(layers=2)
    _train(straight, build_optimizer(straight, "lamb", LR, 0.01, BETAS, EPS), grads)
    first = _model(layers=2)
    first_optimizer = build_optimizer(first, "lamb", LR, 0.01, BETAS, EPS)
    _train(first, first_optimizer, grads[:3])
    new, old = tmp_path / "new", tmp_path / "old"
    for directory in (new, old):
        directory.mkdir()
        save_optimizer(first_optimizer, directory)
    _as_int_step_files(old)
    for directory in (new, old):
        resumed = _model(layers=2)
        resumed.load_state_dict(first.state_dict())
        optimizer = build_optimizer(resumed, "lamb", LR, 0.01, BETAS, EPS)
        load_optimizer(optimizer, directory)
        _train(resumed, optimizer, grads[3:])
        assert all(torch.equal(a, b) for a, b in zip(straight.parameters(), resumed.parameters()))


def _as_int_step_files(directory) -> None:
    """Rewrite a checkpoint's optimizer files as the int-step LAMB wrote them: step counts as JSON ints."""
    tensors = load_file(str(directory / "optimizer.safetensors"))
    steps = {key: int(tensors.pop(key).item()) for key in list(tensors) if key.endswith(".step")}
    assert set(steps.values()) == {3}
    save_file(tensors, str(directory / "optimizer.safetensors"))
    meta = read_json(directory / "optimizer.json")
    write_json(directory / "optimizer.json", {**meta, "scalars": {**meta["scalars"], **steps}})


def test_a_new_state_dict_round_trips_exactly():
    model, grads = _model(), _gradients(_model(), 4)
    optimizer = build_optimizer(model, "lamb", LR, 0.01, BETAS, EPS)
    _train(model, optimizer, grads[:3])
    saved, weights = copy.deepcopy(optimizer.state_dict()), copy.deepcopy(model.state_dict())
    _step(model, optimizer, grads[3])
    again = _model()
    again.load_state_dict(weights)
    reloaded = build_optimizer(again, "lamb", LR, 0.01, BETAS, EPS)
    reloaded.load_state_dict(saved)
    _step(again, reloaded, grads[3])
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters()))
    for state, other in zip(optimizer.state.values(), reloaded.state.values()):
        assert all(torch.equal(state[slot], other[slot]) for slot in ("step", "exp_avg", "exp_avg_sq"))


def _loss(model: nn.Module, scale: float = 1.0) -> torch.Tensor:
    ids = torch.tensor([[1, 2, 3], [4, 5, 6]])
    return model(ids).pow(2).mean() * scale


@pytest.mark.parametrize("unscale_first", [False, True])
def test_grad_scaler_hands_its_scale_and_overflow_to_the_step(unscale_first):
    """torch.amp.GradScaler sees `_step_supports_amp_scaling` and passes grad_scale / found_inf (grad_scale
    None after its own unscale_, as the training loop calls it): a finite step is the plain one (the gradients
    left scaled when the scaler did not unscale them), an overflowing one changes nothing, and the scaler
    halves its scale."""
    plain, scaled = _model(), _model()
    plain_optimizer = build_optimizer(plain, "lamb", LR, 0.01, BETAS, EPS)
    optimizer = build_optimizer(scaled, "lamb", LR, 0.01, BETAS, EPS)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    for overflow in (False, True, False):
        if not overflow:
            plain_optimizer.zero_grad()
            _loss(plain).backward()
            plain_optimizer.step()
        optimizer.zero_grad()
        scaler.scale(_loss(scaled, math.inf if overflow else 1.0)).backward()
        if unscale_first:
            scaler.unscale_(optimizer)
        scale = scaler.get_scale()
        scaler.step(optimizer)
        scaler.update()
        if not (unscale_first or overflow):  # unscaled inside the step, not by the scaler
            assert all(torch.equal(a.grad * scale, b.grad) for a, b in zip(plain.parameters(), scaled.parameters()))
        assert not hasattr(optimizer, "found_inf") and not hasattr(optimizer, "grad_scale")
        assert all(torch.equal(a, b) for a, b in zip(plain.parameters(), scaled.parameters()))
    assert scaler.get_scale() == 2.0**9
    assert all(s["step"] == 2 for s in optimizer.state.values())


def _step_without_waiting(optimizer: torch.optim.Optimizer) -> None:
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # any call that waits for the GPU raises
    try:
        optimizer.step()
    finally:
        torch.cuda.set_sync_debug_mode(0)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_steps_never_wait_for_the_device():
    """No step waits for the GPU (reads a device value on the host): with a device grad_scale and a found_inf
    of 0, the weights are the CPU's; with a found_inf of 1 and NaN gradients, they stay as they were."""
    cpu, cuda = _model(layers=2), _model(layers=2).cuda()
    optimizers = [build_optimizer(m, "lamb", LR, 0.01, BETAS, EPS) for m in (cpu, cuda)]
    for grads in _gradients(cpu, 4):
        for model, optimizer in zip((cpu, cuda), optimizers):
            device = next(model.parameters()).device
            for parameter, grad in zip(model.parameters(), grads):
                parameter.grad = (grad * 8).to(device)
            optimizer.grad_scale = torch.full((1,), 8.0, device=device)
            optimizer.found_inf = torch.zeros(1, device=device)
            _step_without_waiting(optimizer)
        before = [p.detach().clone() for p in cuda.parameters()]
        for parameter in cuda.parameters():
            parameter.grad.fill_(math.nan)
        optimizers[1].found_inf = torch.ones(1, device="cuda")
        _step_without_waiting(optimizers[1])
        assert all(torch.equal(a, b) for a, b in zip(before, cuda.parameters()))
    for a, b in zip(cpu.parameters(), cuda.parameters()):
        torch.testing.assert_close(a, b.cpu(), rtol=1e-5, atol=1e-6)
    assert all(s["step"].device.type == "cuda" and s["step"] == 4 for s in optimizers[1].state.values())
