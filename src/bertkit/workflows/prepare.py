"""Training applied from outside: what a workflow does to a built model and its TrainConfig before
`bertkit.train.fit` runs them.

    prepare_training(model, config, ctx, rows, length) -> (model ready to train, resolved config)
    plan_step(config, device) -> StepPlan: how a pre-training step runs (shapes, compile, fused kernels)
    sample_length(dataset, count) -> the longest input_ids among the first `count` examples

Design decision: the loop receives a model already placed and wrapped and a config already resolved (torchtitan's
shape); every choice that depends on the machine or on the process group is made here, once, by rank 0 where it is
a measurement, so every rank runs the same: `--precision auto` (the step probe times the run's own step at its
micro-batch and length, `bertkit.runtime.device.resolve_precision`), the CPU kernels of a training step (bmm
attention where the machine's probe measured its forward + backward faster than SDPA's, dropout masks counter-based
where those measured faster than torch's: `use_measured_kernels`, installed before the precision is measured, so
the step probe times the step the run will take), glibc's allocator thresholds (`bertkit.runtime.allocator`), the
device, and DistributedDataParallel under torchrun. torch.compile and gradient checkpointing are model transforms
the workflows' `build_model` applies (`bertkit.model.compile_model`, `enable_gradient_checkpointing`); how a
pre-training step runs on the device (static shapes, the whole step compiled, CUDA graphs, fused kernels) is one
`StepPlan`, decided here once from the settings and the device and recorded with the run.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.data import Dataset

from bertkit.config import BertConfig
from bertkit.errors import BertkitError
from bertkit.kernels import triton_support
from bertkit.model.accelerate import MeasuredDropout, cpu_kernels_enabled, train_as_measured
from bertkit.model.attention import MIN_BMM_FILL, Dispatch
from bertkit.model.feature_based import FeatureBasedModel
from bertkit.runtime import probe
from bertkit.runtime.allocator import keep_freed_memory
from bertkit.runtime.device import resolve_precision
from bertkit.settings import TrainConfig
from bertkit.train.distributed import DistributedContext, broadcast_object, wrap_model
from bertkit.workflows import fill_gate

logger = logging.getLogger(__name__)


def prepare_training(model: nn.Module, config: TrainConfig, ctx: DistributedContext, rows: int | None = None,
                     length: int | None = None) -> tuple[nn.Module, TrainConfig]:
    """(the model on `ctx.device`, wrapped for DDP under torchrun; `config` with its precision resolved).
    `--precision auto` measures the step at `rows` x `length` tokens on rank 0 (every rank runs its choice);
    large activations are reused rather than page-faulted from here on. The learning rate must be resolved by
    the workflow's own rule first (a recipe, the fine-tuning rule)."""
    keep_freed_memory()
    if config.learning_rate is None:
        raise ValueError("prepare_training: resolve the learning rate first (the workflow's rule decides it)")
    use_measured_kernels(model, ctx)
    precision = config.precision
    if precision == "auto":
        measured = resolve_precision("auto", ctx.device, model, rows, length) if ctx.is_main else None
        precision = broadcast_object(measured, ctx)
    use_measured_fill_gate(model, precision, rows, length, ctx)
    if ctx.is_main and _measured_dispatches(model) and ctx.device.type == "cpu":
        logger.info("attention for training on this CPU: %s", training_attention(model, ctx.device))
    model.to(ctx.device)
    return wrap_model(model, ctx), dataclasses.replace(config, precision=precision)


def use_measured_kernels(model: nn.Module, ctx: DistributedContext) -> None:
    """On a CPU (kernels not turned off by BERTKIT_CPU_KERNELS=0), every encoder of `model` on the default dispatch
    attends as this machine's probe measured fastest for training, and its dropouts draw counter-based masks where
    those measured faster (`accelerate.train_as_measured`): rank 0's measurements, so every rank runs the same
    kernels. The dropout's said in one line here (`training_dropout`), the attention's by `prepare_training` once
    its fill gate is set (`training_attention`)."""
    if ctx.device.type != "cpu" or not cpu_kernels_enabled():
        return
    width = probe.model_width(model)
    choices = broadcast_object(probe.choices(width) if ctx.is_main else None, ctx)
    if train_as_measured(model, choices) and ctx.is_main:  # (the attention's line comes once its fill gate is set)
        logger.info("dropout for training on this CPU: %s", training_dropout(model, ctx.device))


def use_measured_fill_gate(model: nn.Module, precision: str, rows: int | None, length: int | None,
                           ctx: DistributedContext) -> None:
    """On a CPU with measured attention choices, the least share of real tokens at which `model`'s training batches
    run bmm attention, measured on its own step at `rows` x `length` (`fill_gate`; rank 0's, so every rank runs the
    same) and said in one line; where nothing is measured the fixed gate (`attention.MIN_BMM_FILL`) stays."""
    if ctx.device.type != "cpu" or not _measured_dispatches(model):
        return
    gate = apply_fill_gate(model, precision, rows, length) if ctx.is_main else None
    gate = broadcast_object(gate, ctx)
    if gate is not None:
        for dispatch in _measured_dispatches(model):
            dispatch.min_bmm_fill = gate


def apply_fill_gate(model: nn.Module, precision: str, rows: int | None, length: int | None) -> float | None:
    """Measure the fill gate of `model`'s step (or read it from the cache; logged once a process) and set it on its
    encoders' measured dispatches; None where nothing is measured (`fill_gate.measured_gate`)."""
    measured = fill_gate.measured_gate(model, precision, rows, length)
    if measured is None:
        return None
    for dispatch in _measured_dispatches(model):
        dispatch.min_bmm_fill = measured.gate
    return measured.gate


def _measured_dispatches(model: nn.Module) -> list[Dispatch]:
    """The attention dispatches of `model`'s encoders that hold measured CPU choices."""
    found = (getattr(m, "attention", None) for m in model.modules())
    return [a for a in found if isinstance(a, Dispatch) and a.cpu is not None]


def training_attention(model: nn.Module, device: torch.device) -> str:
    """The attention kernels `model`'s training steps run on `device`, in words, as its encoders' dispatch will choose
    them: what a run records (pretrain_settings.json's "attention")."""
    if device.type == "cuda":
        return "CUDA, as Dispatch picks per batch: flash attention over the packed tokens (bf16/fp16), SDPA otherwise"
    choices = _attention_choices(model)
    if choices is None:
        return "SDPA (no measured CPU attention choices: BERTKIT_CPU_KERNELS=0 or a fixed backend)"
    return describe_training_attention(choices, _attention_dropout(model), _fill_gate(model))


def training_kernels(model: nn.Module, device: torch.device, precision: str, compiled: bool = False
                     ) -> dict[str, object]:
    """The kernels `model`'s training steps run on `device` in `precision` (resolved), as the JSON each checkpoint
    records (`Resume.context`; a resumed run lists a change): "attention" {precision: the lengths at which bmm
    attention runs (on batches full enough)}, "SDPA" without measured choices, "CUDA" on a GPU, "compiled" where
    torch.compile's graph decides; "dropout" the precisions whose masks are counter-based (fp32's too under bf16
    autocast: some dropouts see fp32 tensors), "none" (every probability 0), "torch's" or "compiled". A frozen
    feature-based encoder runs inference kernels: its attention's lengths are those of inference, and "packed"
    says whether its dense layers are packed."""
    dropouts = [m for m in model.modules() if isinstance(m, nn.Dropout)]
    counter = next((m.choices.counter_dropout for m in dropouts if isinstance(m, MeasuredDropout)), ())
    dtypes = {"fp32", precision}
    dropout: object = ("none" if not any(m.p > 0 for m in dropouts) else "torch's" if device.type == "cuda"
                       else "compiled" if compiled else [p for p in counter if p in dtypes] or "torch's")
    if device.type == "cuda" or compiled:
        return {"attention": "CUDA" if device.type == "cuda" else "compiled", "dropout": dropout}
    choices = _attention_choices(model)
    if choices is None:
        return {"attention": "SDPA", "dropout": dropout}
    if isinstance(model, FeatureBasedModel):  # the encoder is frozen: its features are computed as inference's
        dtype = "bf16" if precision == "bf16" else "fp32"  # the dtype its inference copy computes in
        return {"attention": {precision: list(choices.bmm_attention.get(precision, ()))},
                "packed": model.uses_encoder_copy and dtype in choices.packed_linear, "dropout": dropout}
    verdicts = choices.bmm_training_dropout if _attention_dropout(model) else choices.bmm_training
    recorded: dict[str, object] = {"attention": {precision: list(verdicts.get(precision, ()))}, "dropout": dropout}
    if _fill_gate(model) != MIN_BMM_FILL:  # (absent at the fixed gate, as in checkpoints from before it was measured)
        recorded["bmm_min_fill"] = _fill_gate(model)
    return recorded


def _fill_gate(model: nn.Module) -> float:
    """The least share of real tokens at which `model`'s training batches run bmm attention (its dispatch's gate)."""
    return next((d.min_bmm_fill for d in _measured_dispatches(model)), MIN_BMM_FILL)


def _attention_choices(model: nn.Module) -> probe.Choices | None:
    """The measured CPU choices `model`'s encoders attend by in training (their `Dispatch`'s), or None."""
    dispatches = [a for a in (getattr(m, "attention", None) for m in model.modules()) if isinstance(a, Dispatch)]
    return next((d.cpu for d in dispatches if isinstance(d.cpu, probe.Choices)), None)


def _attention_dropout(model: nn.Module) -> float:
    """The largest attention-dropout probability among `model`'s encoders' configs."""
    configs = [config for config in (getattr(m, "config", None) for m in model.modules())
               if isinstance(config, BertConfig)]
    return max((config.attention_probs_dropout_prob for config in configs), default=0.0)


def describe_training_attention(choices: probe.Choices, dropout: float = 0.0, min_fill: float = MIN_BMM_FILL) -> str:
    """The attention kernels training runs with attention dropout `dropout`, per precision, in words (the probe's
    verdicts), bmm on batches at least `min_fill` real tokens (the fill gate)."""
    verdicts = choices.bmm_training_dropout if dropout else choices.bmm_training
    said = [f"{p} bmm near {', '.join(map(str, verdicts[p]))} tokens, SDPA elsewhere" if verdicts.get(p)
            else f"{p} SDPA" for p in probe.FLOAT_PRECISIONS]
    how = f"with attention dropout {dropout:g} (bmm's mask counter-based)" if dropout else "without attention dropout"
    gate = "" if min_fill == MIN_BMM_FILL else ": the gate measured on the run's step"
    return (f"{'; '.join(said)} (bmm where its forward + backward {how} measured at least "
            f"{probe.FAST_PATH_MIN_SPEEDUP}x faster than SDPA's on this machine, on batches at least "
            f"{min_fill:.1%} real tokens{gate})")


def training_dropout(model: nn.Module, device: torch.device) -> str:
    """How `model`'s dropout modules draw their masks in training on `device`, in words: what a run records
    (pretrain_settings.json's "dropout")."""
    dropouts = [m for m in model.modules() if isinstance(m, nn.Dropout)]
    if not any(m.p > 0 for m in dropouts):
        return "none (every dropout probability is 0)"
    measured = next((m.choices for m in dropouts if isinstance(m, MeasuredDropout)), None)
    if device.type != "cpu" or measured is None:
        return "torch's dropout"
    precisions = ", ".join(measured.counter_dropout)
    return (f"counter-based masks (bertkit.kernels.dropout) in {precisions}, torch's dropout otherwise (measured at "
            f"least {probe.FAST_PATH_MIN_SPEEDUP}x faster than torch's on this machine; a step compiled by "
            "torch.compile runs torch's, which it fuses)")


@dataclass(frozen=True)
class StepPlan:
    """How a pre-training step runs on its device: each GPU lever (docs/performance.md, "The GPU step"),
    resolved once (`plan_step`)."""

    static_shapes: bool
    """Batches of one shape with the prediction index and the padding layout made on the host
    (`bertkit.data.collate_static`), so the step reads nothing from the device; else padded to each batch's
    longest (`collate_pretraining`), which the CPU path is tuned for."""
    compile: bool
    """The whole objective compiled (`bertkit.train.compiled.CompiledObjective`)."""
    cuda_graphs: bool
    """The compiled step replayed from CUDA graphs."""
    fused_norm: bool
    """dropout + residual + LayerNorm fused, bf16 residual stream (`bertkit.model.fused`)."""
    fused_gelu: bool
    """bias + GELU fused."""
    fused_loss: bool
    """The MLM loss from bf16 logits (`bertkit.kernels.cross_entropy.masked_lm_loss`)."""

    def describe(self) -> str:
        fused = [name for name, on in (("dropout+residual+LayerNorm", self.fused_norm), ("bias+GELU", self.fused_gelu),
                                       ("MLM loss", self.fused_loss)) if on]
        return (f"{'static' if self.static_shapes else 'per-batch'} shapes, "
                f"{'whole step compiled' if self.compile else 'eager'}"
                f"{' with CUDA graphs' if self.cuda_graphs else ''}, fused kernels: {', '.join(fused) or 'none'}")


def plan_step(config: TrainConfig, device: torch.device) -> StepPlan:
    """The StepPlan of `config` (its `compile` already resolved) on `device`: static shapes wherever the step runs
    on a GPU or is compiled; with --fused-kernels unset, only the kernel that measured faster where it did: the
    fused LayerNorm of an eager step on a GPU with Triton (a compiled step fuses that work itself, as fast; the
    GELU and loss kernels did not pay: docs/performance.md, "The GPU step"); a lever asked for where it cannot
    run is a BertkitError naming the flag."""
    cuda = device.type == "cuda"
    if config.fused_kernels and cuda and not triton_support.available(device):
        raise BertkitError(f"--fused-kernels: {triton_support.reason_unavailable(device)}; or pass --no-fused-kernels")
    if config.fused_kernels is None:  # what measured faster
        norm, others = cuda and not config.compile and triton_support.available(device), False
    else:
        norm = others = config.fused_kernels
    if config.cuda_graphs and not (cuda and config.compile):
        raise BertkitError("--cuda-graphs replays a compiled step on a GPU: use it with --compile on a CUDA device")
    if config.cuda_graphs:
        logger.warning("--cuda-graphs: the step replayed from CUDA graphs measured 5.8x slower than without them on "
                       "an H200 (docs/performance.md, \"The GPU step\"); it is kept to be measured, not yet to speed "
                       "anything up")
    return StepPlan(static_shapes=cuda or bool(config.compile), compile=bool(config.compile),
                    cuda_graphs=config.cuda_graphs, fused_norm=norm, fused_gelu=others, fused_loss=others)


def sample_length(dataset: Dataset, count: int) -> int | None:
    """The longest `input_ids` among the first `count` examples (the length a step runs at; the last
    dimension, for multiple choice's one row per choice), or None when the examples hold none."""
    lengths = []
    for index in range(min(count, len(dataset))):  # type: ignore[arg-type]  # fit's datasets are sized
        item = dataset[index]
        ids = item.get("input_ids") if isinstance(item, dict) else None
        if ids is None:
            return None
        try:
            lengths.append(int(torch.as_tensor(ids).shape[-1]))
        except (ValueError, TypeError, RuntimeError, IndexError):  # ragged rows, not token ids
            return None
    return max(lengths) if lengths else None
