"""Optimizers (AdamW, LAMB) with BERT's weight-decay rule, and the learning-rate schedules.

Design decision: the learning rate of every step is a pure function of the step and the run's settings:
peak x a schedule of *progress* through the budget (a number in [0, 1]) and the warmup fraction, computed
and written into the optimizer's parameter groups before each step (`LearningRateSchedule`). Nothing of
it is state: a resumed run computes it from its own settings, so a new --learning-rate or a larger budget
takes effect, and no restored scheduler position can disagree with them (a torch `LambdaLR` restored from a
checkpoint keeps the old run's base learning rate and counts only the steps it was stepped on). Every
optimizer step counts, skipped non-finite ones included, so a run always ends with its schedule at the end
of the budget. For a step budget progress is step / max_steps and each schedule equals its
transformers counterpart exactly (`get_linear_schedule_with_warmup`, `get_cosine_schedule_with_warmup`,
`get_constant_schedule_with_warmup`, `get_inverse_sqrt_schedule` with timescale = warmup steps); for a
time budget progress is elapsed time / max time, so a decaying schedule reaches 0 when the time runs out
whatever the speed of the machine.

References: Devlin et al. 2018 (AdamW, lr 1e-4, wd 0.01, warmup 10k steps, linear decay);
Loshchilov & Hutter 2019 (decoupled weight decay); You et al. 2019, "Large Batch Optimization for Deep
Learning: Training BERT in 76 Minutes", arXiv:1904.00962 (LAMB, Algorithm 2).

LAMB's layer adaptation follows the weight-decay rule, decided once in `is_matrix`: matrices (linear
weights, embeddings) get both weight decay and the trust ratio; vectors (ndim < 2: biases, LayerNorm
gains and shifts) get neither, so their trust ratio is 1 and they move like AdamW's. Scaling a vector by
||w|| / ||update|| would pin a zero-initialised bias near zero (a toy regression: bias norm 0.06 after 2,000
steps against AdamW's 6.9; docs/pretraining.md). This is what NVIDIA's LAMB does for BERT (DeepLearningExamples:
apex FusedLAMB with use_nvlamb=False adapts only parameters with weight decay, and no decay on bias,
gamma, beta) and TF-Addons' `LAMB(exclude_from_layer_adaptation=...)`, which defaults to the
weight-decay exclusions.

LAMB's step is a handful of foreach operations per parameter group (all tensors of one device and dtype at
once: a few kernels on a GPU instead of a chain per parameter) and never waits for the device: the step
count is a float32 tensor beside each parameter (torch's fused Adam's layout), so the bias corrections are
device arithmetic, and a step to be skipped is decided on the device too. Like torch's fused AdamW, `Lamb`
takes GradScaler's protocol (`_step_supports_amp_scaling`): `optimizer.grad_scale` (gradients are divided by
it) and `optimizer.found_inf` (non-zero: skip), set before `step()`; a skipped step leaves weights, moments
and step counts bitwise as they were, whatever the gradients hold. Checkpoints with the earlier int step
counts load.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from bertkit.errors import BertkitError
from bertkit.settings import OPTIMIZERS


def is_matrix(parameter: torch.Tensor) -> bool:
    """The one rule for weight decay and LAMB's layer adaptation: matrices (linear weights, embeddings)
    get them; vectors (ndim < 2: biases, LayerNorm gains and shifts) do not."""
    return parameter.ndim >= 2


def parameter_groups(model: nn.Module, weight_decay: float, split_encoder: bool = False) -> list[dict]:
    """Two groups: decayed (matrices) and not decayed (vectors), by `is_matrix`; with `split_encoder`, four:
    those two for the encoder (the model's `base_model_prefix` submodule), then those two for the rest (the
    heads), each group marked with its "role" for `LearningRateSchedule`. (Two groups when not split, so
    checkpoints of runs without a split keep their layout.)"""
    encoder = _encoder_parameters(model) if split_encoder else set()
    roles = ("encoder", "head") if split_encoder else ("all",)
    groups = {(role, decayed): [] for role in roles for decayed in (True, False)}  # type: dict[tuple[str, bool], list]
    for parameter in model.parameters():
        if parameter.requires_grad:
            role = ("encoder" if id(parameter) in encoder else "head") if split_encoder else "all"
            groups[role, is_matrix(parameter)].append(parameter)
    if split_encoder and not any(groups["head", decayed] for decayed in (True, False)):
        raise BertkitError("--head-warmup-steps / --encoder-lr-ratio: this model has no trainable parameters "
                           "outside its encoder (no head to train apart); leave them at 0 and 1")
    return [{"params": groups[role, decayed], "weight_decay": weight_decay if decayed else 0.0,
             **({"role": role} if split_encoder else {})} for role in roles for decayed in (True, False)]


def _encoder_parameters(model: nn.Module) -> set[int]:
    """ids of the parameters of the model's encoder, the submodule its `base_model_prefix` names, less those the
    checkpoint did not hold (`newly_initialized`, e.g. a pooler missing from a masked-LM checkpoint): a random
    part is trained with the heads, not held still."""
    prefix = getattr(model, "base_model_prefix", None)
    encoder = getattr(model, prefix, None) if isinstance(prefix, str) else None
    if not isinstance(encoder, nn.Module):
        raise BertkitError(f"--head-warmup-steps / --encoder-lr-ratio: {type(model).__name__} names no encoder "
                           "(base_model_prefix); they apply to BERT with a head")
    fresh = set(getattr(model, "newly_initialized", None) or ())
    named = dict(model.named_parameters())
    fresh_ids = {id(named[name]) for name in fresh if name in named}
    return {id(parameter) for parameter in encoder.parameters()} - fresh_ids


class Lamb(torch.optim.Optimizer):
    """LAMB (You et al. 2019, Algorithm 2): Adam's bias-corrected direction plus decoupled weight decay;
    a matrix's update is scaled by the trust ratio ||w|| / ||update|| so every layer moves by a similar
    relative amount, a vector's (bias, LayerNorm; see `is_matrix`) is not (trust ratio 1).

    state["step"] is a 0-d float32 tensor on the parameter's device (exact to 2^24 steps), counted there, so
    `step()` reads nothing on the host. `grad_scale` and `found_inf`, when set as attributes (by GradScaler
    or the training loop), unscale the gradients and skip the step on the device (see `_lamb_foreach`)."""

    _step_supports_amp_scaling = True  # GradScaler hands over grad_scale and found_inf instead of syncing to skip

    def __init__(self, params: Iterable, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-6, weight_decay: float = 0.0) -> None:
        if not all(0.0 <= beta < 1.0 for beta in betas):
            raise ValueError(f"Lamb: betas must lie in [0, 1), not {betas}")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure: Callable | None = None) -> None:  # type: ignore[override]  # no closure, no loss
        if closure is not None:
            raise ValueError("Lamb does not take a closure")
        grad_scale, found_inf = getattr(self, "grad_scale", None), getattr(self, "found_inf", None)
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for (device, _, matrices), tensors in self._buckets(group).items():
                _lamb_foreach(*tensors, layer_adaptation=matrices, lr=group["lr"], beta1=beta1, beta2=beta2,
                              eps=group["eps"], weight_decay=group["weight_decay"],
                              grad_scale=_scalar_on(grad_scale, device), found_inf=_scalar_on(found_inf, device))

    def _buckets(self, group: dict[str, Any]) -> dict[tuple[torch.device, torch.dtype, bool], tuple[list, ...]]:
        """The group's parameters that have a gradient, with their gradients, exp_avgs, exp_avg_sqs and steps,
        by device, dtype and `is_matrix` (one foreach update each); state is created at a first step."""
        buckets: dict[tuple[torch.device, torch.dtype, bool], tuple[list, ...]] = {}
        for parameter in group["params"]:
            if parameter.grad is None:
                continue
            if parameter.grad.is_sparse:
                raise RuntimeError("Lamb does not support sparse gradients")
            state = self.state[parameter]
            if not state:
                state["step"] = torch.zeros((), dtype=torch.float32, device=parameter.device)
                state["exp_avg"] = torch.zeros_like(parameter)
                state["exp_avg_sq"] = torch.zeros_like(parameter)
            lists = buckets.setdefault((parameter.device, parameter.dtype, is_matrix(parameter)), ([], [], [], [], []))
            tensors = (parameter, parameter.grad, state["exp_avg"], state["exp_avg_sq"], state["step"])
            for bucket, tensor in zip(lists, tensors):
                bucket.append(tensor)
        return buckets

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        for parameter, state in self.state.items():
            if "step" in state:  # an int (checkpoints before the tensor step) or a tensor torch left on the CPU
                step = torch.as_tensor(state["step"], dtype=torch.float32)
                state["step"] = step.reshape(()).to(parameter.device)


TensorList = list[torch.Tensor] | tuple[torch.Tensor, ...]  # what torch's foreach operations take and return


def _scalar_on(value: torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
    """GradScaler's one-element scale or found_inf as a 0-d tensor on `device` (queued, not waited for)."""
    return None if value is None else value.to(device, non_blocking=True).reshape(())


def _lamb_foreach(params: TensorList, grads: TensorList, exp_avgs: TensorList,
                  exp_avg_sqs: TensorList, steps: TensorList, *, layer_adaptation: bool, lr: float,
                  beta1: float, beta2: float, eps: float, weight_decay: float, grad_scale: torch.Tensor | None,
                  found_inf: torch.Tensor | None) -> None:
    """One LAMB step, in place, for tensors of one device and dtype (state lists in the order of `params`;
    `steps` 0-d float32), in foreach operations and without a host read.

    update = m_hat / (sqrt(v_hat) + eps) + weight_decay * w;  w -= lr * ratio * update, where ratio is
    `_trust_ratios` with `layer_adaptation` (matrices) and 1 without (vectors). `grad_scale` (None or a 0-d
    tensor): the gradients are divided by it first, the tensors themselves left as they are. `found_inf` (None
    or a 0-d tensor): non-zero skips the step, leaving params, moments and steps bitwise unchanged even when
    the gradients hold NaN or inf; zero computes what None does, bit for bit."""
    skip = None if found_inf is None else found_inf != 0
    grads = _unscaled_gradients(grads, grad_scale, skip)
    _count_step(steps, skip)
    _update_moments(exp_avgs, exp_avg_sqs, grads, beta1, beta2, skip)
    updates = _adam_directions(exp_avgs, exp_avg_sqs, steps, beta1, beta2, eps)
    if weight_decay:
        torch._foreach_add_(updates, params, alpha=weight_decay)
    scale = _unless_skipped(skip, -lr, 0.0)  # a skipped step adds 0 x a finite update: the weights stay put
    if layer_adaptation:
        torch._foreach_mul_(updates, list((_trust_ratios(params, updates) * scale).unbind()))
    else:
        torch._foreach_mul_(updates, scale)
    torch._foreach_add_(params, updates)


def _unless_skipped(skip: torch.Tensor | None, value: float, skipped: float) -> float | torch.Tensor:
    """`value` without found_inf; with it, a 0-d float32 tensor on the device: `skipped` when the step is skipped,
    else `value` (the float32 number a kernel makes of `value` itself, so a step that is not skipped computes
    exactly what it would without found_inf)."""
    return value if skip is None else torch.where(skip, skipped, value)


def _count_step(steps: TensorList, skip: torch.Tensor | None) -> None:
    """Add 1 to each step count, or 0 on a skipped step."""
    if skip is None:
        torch._foreach_add_(steps, 1.0)
    else:  # a list of 0-d tensors, like the 0-d steps: foreach's fast path on a GPU
        torch._foreach_add_(steps, [torch.where(skip, 0.0, 1.0)] * len(steps))


def _unscaled_gradients(grads: TensorList, grad_scale: torch.Tensor | None,
                        skip: torch.Tensor | None) -> TensorList:
    """The gradients divided by `grad_scale`, and zeros on a skipped step: the 0/1 factors that keep the state
    still would not stop a NaN gradient (0 x NaN is NaN), and foreach has no `where`, so the gradients go
    through one flat buffer (one where for them all; a copy of the gradients in memory)."""
    if skip is None:
        return grads if grad_scale is None else torch._foreach_div(grads, grad_scale)
    flat = torch.cat([grad.reshape(-1) for grad in grads])
    if grad_scale is not None:
        flat.div_(grad_scale)
    flat.masked_fill_(skip, 0.0)
    pieces = flat.split([grad.numel() for grad in grads])
    return [piece.view_as(grad) for piece, grad in zip(pieces, grads)]


def _update_moments(exp_avgs: TensorList, exp_avg_sqs: TensorList, grads: TensorList,
                    beta1: float, beta2: float, skip: torch.Tensor | None) -> None:
    """m = beta1 m + (1 - beta1) g and v = beta2 v + (1 - beta2) g^2, in place; on a skipped step the factors
    are 1 and 0 (and g is 0), which leaves m and v bitwise as they were."""
    torch._foreach_mul_(exp_avgs, _unless_skipped(skip, beta1, 1.0))
    torch._foreach_add_(exp_avgs, torch._foreach_mul(grads, _unless_skipped(skip, 1 - beta1, 0.0)))
    squares = torch._foreach_mul(grads, grads)
    torch._foreach_mul_(squares, _unless_skipped(skip, 1 - beta2, 0.0))
    torch._foreach_mul_(exp_avg_sqs, _unless_skipped(skip, beta2, 1.0))
    torch._foreach_add_(exp_avg_sqs, squares)


def _adam_directions(exp_avgs: TensorList, exp_avg_sqs: TensorList, steps: TensorList,
                     beta1: float, beta2: float, eps: float) -> TensorList:
    """Adam's direction m_hat / (sqrt(v_hat) + eps), m_hat = m / (1 - beta1^t), v_hat = v / (1 - beta2^t),
    with each tensor's own step count t. t counts as at least 1: a skipped first step leaves t = 0 and zero
    moments, whose direction is then 0 rather than 0 / 0 (which the skip's factor 0 would not cancel)."""
    counts = torch._foreach_clamp_min(steps, 1.0)
    directions = torch._foreach_div(exp_avgs, _bias_corrections(counts, beta1))
    denominators = torch._foreach_div(exp_avg_sqs, _bias_corrections(counts, beta2))
    torch._foreach_sqrt_(denominators)
    torch._foreach_add_(denominators, eps)
    torch._foreach_div_(directions, denominators)
    return directions


def _bias_corrections(counts: TensorList, beta: float) -> TensorList:
    """1 - beta^t for each float32 step count t, as -expm1(t ln beta): float32's pow(0.999, t) is 1e-5 off in
    1 - beta2^t at t = 1 (the host's float64 was exact), this is within 1e-7."""
    corrections = torch._foreach_mul(counts, math.log(beta) if beta > 0 else -math.inf)
    torch._foreach_expm1_(corrections)
    torch._foreach_neg_(corrections)
    return corrections


def _trust_ratios(weights: TensorList, updates: TensorList) -> torch.Tensor:
    """||w|| / ||update|| of each matrix, as one 1-D tensor on their device (no host read); 1 where either norm
    is 0 (a zero-initialised matrix, a zero update)."""
    weight_norms = torch.stack(torch._foreach_norm(weights))
    update_norms = torch.stack(torch._foreach_norm(updates))
    return torch.where((weight_norms > 0) & (update_norms > 0), weight_norms / update_norms, 1.0)


def build_optimizer(model: nn.Module, name: str, learning_rate: float, weight_decay: float,
                    betas: tuple[float, float], eps: float, split_encoder: bool = False) -> torch.optim.Optimizer:
    """AdamW or LAMB over `parameter_groups(model, weight_decay, split_encoder)`."""
    groups = parameter_groups(model, weight_decay, split_encoder)
    if name == "adamw":
        # the fused kernel: one pass per tensor instead of a dozen (bert-base on 2 CPU cores: 39 vs 147 ms a step)
        fused = all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for g in groups for p in g["params"])
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, eps=eps, fused=fused)
    if name == "lamb":
        return Lamb(groups, lr=learning_rate, betas=betas, eps=eps)
    raise BertkitError(f"--optimizer {name!r} is not supported; use one of {', '.join(OPTIMIZERS)}")


def apply_hyperparameters(optimizer: torch.optim.Optimizer, model: nn.Module, weight_decay: float,
                          betas: tuple[float, float], eps: float, split_encoder: bool = False) -> None:
    """Set this run's weight decay (by `parameter_groups`' rule), betas and epsilon on an optimizer whose
    parameter groups came back from a checkpoint (torch's load_state_dict restores the saved ones)."""
    for group, fresh in zip(optimizer.param_groups, parameter_groups(model, weight_decay, split_encoder)):
        group["weight_decay"] = fresh["weight_decay"]
        group["betas"], group["eps"] = tuple(betas), eps


def warmup_linear_decay(progress: float, warmup: float) -> float:
    """Learning-rate multiplier at `progress` in [0, 1]: rises linearly to 1 over the first `warmup`
    fraction, then falls linearly to 0 at progress 1."""
    if progress < warmup:
        return progress / warmup
    return max(0.0, (1.0 - progress) / (1.0 - warmup)) if warmup < 1.0 else 0.0


def warmup_cosine_decay(progress: float, warmup: float) -> float:
    """Linear warmup, then half a cosine from 1 down to 0 at progress 1."""
    if progress < warmup:
        return progress / warmup
    after = (progress - warmup) / (1.0 - warmup) if warmup < 1.0 else 1.0
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * min(1.0, after))))


def warmup_constant(progress: float, warmup: float) -> float:
    """Linear warmup, then the peak learning rate until the end."""
    return progress / warmup if progress < warmup else 1.0


def warmup_inverse_sqrt(progress: float, warmup: float) -> float:
    """Linear warmup, then 1/sqrt(progress / warmup): the peak at the end of warmup, half of it at 4x
    that point (Vaswani et al. 2017's decay; transformers' timescale = the warmup steps)."""
    return progress / warmup if progress < warmup else math.sqrt(warmup / progress)


SCHEDULES: dict[str, Callable[[float, float], float]] = {
    "linear": warmup_linear_decay,
    "cosine": warmup_cosine_decay,
    "constant-with-warmup": warmup_constant,
    "inverse-sqrt": warmup_inverse_sqrt,
}


class LearningRateSchedule:
    """The learning rate for the optimizer step that follows `step` completed steps:
    peak x SCHEDULES[name](progress_at(step), warmup). The first step (step 0) runs at the start of the
    warmup, as transformers' schedules do."""

    def __init__(self, peak: float, progress_at: Callable[[int], float], warmup: float, name: str = "linear",
                 head_warmup_steps: int = 0, encoder_lr_ratio: float = 1.0):
        if name not in SCHEDULES:
            raise BertkitError(f"--lr-schedule {name!r}: use one of {', '.join(SCHEDULES)}")
        if name == "inverse-sqrt" and warmup <= 0:
            raise BertkitError("--lr-schedule inverse-sqrt decays from the end of warmup; give a warmup "
                               "(--warmup-steps or --warmup-ratio above 0)")
        self.peak, self.progress_at, self.warmup, self.name = peak, progress_at, warmup, name
        self.head_warmup_steps, self.encoder_lr_ratio = head_warmup_steps, encoder_lr_ratio

    def __call__(self, step: int) -> float:
        return self.peak * SCHEDULES[self.name](self.progress_at(step), self.warmup)

    def encoder_scale(self, step: int) -> float:
        """The encoder's learning rate over the heads' for the step after `step`: 0 during the head warm-up
        (AdamW and LAMB then leave its weights exactly as they are), then rising linearly over as many steps
        again to `encoder_lr_ratio` (the encoder gets a warm-up of its own, where the run's may be over), then
        `encoder_lr_ratio`."""
        warmup = self.head_warmup_steps
        if step < warmup:
            return 0.0
        return self.encoder_lr_ratio * min(1.0, (step - warmup + 1) / warmup) if warmup else self.encoder_lr_ratio

    def apply(self, optimizer: torch.optim.Optimizer, step: int) -> float:
        """Set every parameter group's learning rate for the step after `step` (an encoder group's scaled by
        `encoder_scale`); returns the heads' (everyone's when the groups are not split)."""
        lr = self(step)
        for group in optimizer.param_groups:
            group["lr"] = lr * self.encoder_scale(step) if group.get("role") == "encoder" else lr
        return lr
