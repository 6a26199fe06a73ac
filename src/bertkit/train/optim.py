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
||w|| / ||update|| would pin a zero-initialised bias near zero (issue 23's toy regression: bias norm 0.06 after
2,000 steps against AdamW's 6.9). This is what NVIDIA's LAMB does for BERT (DeepLearningExamples:
apex FusedLAMB with use_nvlamb=False adapts only parameters with weight decay, and no decay on bias,
gamma, beta) and TF-Addons' `LAMB(exclude_from_layer_adaptation=...)`, which defaults to the
weight-decay exclusions. LAMB's step reads no tensor value on the host: its step count is a Python int
per parameter (saved as a checkpoint scalar), so a step on a GPU never waits for the device.
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

    state["step"] is a Python int (how many updates this parameter had), so the bias corrections are
    host arithmetic and no step syncs with the device; a tensor step (torch's Adam, an older checkpoint)
    is turned into an int on load."""

    def __init__(self, params: Iterable, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-6, weight_decay: float = 0.0) -> None:
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure: Callable | None = None) -> None:  # type: ignore[override]  # no closure, no loss
        if closure is not None:
            raise ValueError("Lamb does not take a closure")
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for parameter in group["params"]:
                if parameter.grad is None:
                    continue
                update = self._adam_direction(parameter, beta1, beta2, group["eps"])
                if group["weight_decay"]:
                    update.add_(parameter, alpha=group["weight_decay"])
                if is_matrix(parameter):
                    parameter.sub_(update * (group["lr"] * _trust_ratio(parameter, update)))
                else:
                    parameter.sub_(update, alpha=group["lr"])

    def _adam_direction(self, parameter: torch.Tensor, beta1: float, beta2: float, eps: float) -> torch.Tensor:
        state = self.state[parameter]
        if not state:
            state["step"] = 0
            state["exp_avg"] = torch.zeros_like(parameter)
            state["exp_avg_sq"] = torch.zeros_like(parameter)
        state["step"] = step = state["step"] + 1
        state["exp_avg"].mul_(beta1).add_(parameter.grad, alpha=1 - beta1)
        state["exp_avg_sq"].mul_(beta2).addcmul_(parameter.grad, parameter.grad, value=1 - beta2)
        corrected_avg = state["exp_avg"] / (1 - beta1 ** step)
        corrected_sq = state["exp_avg_sq"] / (1 - beta2 ** step)
        return corrected_avg / (corrected_sq.sqrt() + eps)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        for state in self.state.values():
            if isinstance(state.get("step"), torch.Tensor):  # once, at load time: not a per-step sync
                state["step"] = int(state["step"])


def _trust_ratio(weight: torch.Tensor, update: torch.Tensor) -> torch.Tensor:
    """||w|| / ||update|| as a 0-d tensor on the weight's device (no host read); 1 when either norm is 0
    (a zero-initialised matrix, a zero update)."""
    weight_norm, update_norm = weight.norm(), update.norm()
    return torch.where((weight_norm > 0) & (update_norm > 0), weight_norm / update_norm,
                       torch.ones_like(weight_norm))


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
