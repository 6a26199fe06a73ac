"""The distillation objective of any task kind: soft targets, the gold labels, hidden states.

    DistillationModel(student, projection)          what trains: the student, and the projection onto the
                                                    teacher's width that only the hidden-state loss uses
    DistillationLoss(task, weights, teacher, layer_map)   (model, batch) -> (loss, metrics), a per-example mean
    collate_distillation(features, pad_token_id)    a padded batch with the teacher's outputs and `labelled`
    MaskedLMDistillation(teacher, weights)          general distillation: DistilBERT's objective on
                                                    pre-training data (`bertkit distill pretraining`)

    loss = soft_weight * T^2 * KL(teacher_T || student_T) + hard_weight * task loss (labelled examples)
           + hidden_weight * mean over mapped layers of MSE(projection(student h), teacher h) (real tokens)
           + attention_weight * mean over mapped layers of KL(teacher attention || student attention)

Design decision: the objective reads the task only through the `Task` protocol: the soft targets are the task's
`output_names` (the teacher's, computed once before training and carried in each feature as `teacher`), and the
distribution each one is depends on its shape: a score per class (classification, multiple choice), a score per
class at every token (tagging: averaged over real tokens), a score per position (SQuAD's start and end: a
distribution over the real tokens), or one number (regression: mean squared error, no temperature). The hard loss
is the task's own `loss` on the labelled rows of the batch, given the student's outputs already computed, so a
batch mixing labelled and teacher-labelled examples costs one student forward. The hidden-state term needs the
teacher's hidden states, so with a positive weight the teacher (frozen, in eval mode) runs beside the student.

References: Hinton et al. 2015 (the T^2 factor keeps the soft gradients' scale across temperatures); Sanh et al.
2019 (DistilBERT); Jiao et al. 2020 (TinyBERT, the hidden-state MSE and the width projection).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bertkit.inference.batching import pad_batch
from bertkit.model.attention import AttentionProbes, recording_attention
from bertkit.model.padding import Unpadded
from bertkit.tasks.task import Task

TEACHER_KEY = "teacher"
"""A feature's teacher outputs: {output name: float32 array, cut to the feature's real length where token-level}."""
SOFT_MASK_KEY = "soft_mask"
"""Where a per-token distribution is a target (1) or not (0): a tagger's first sub-tokens, the positions it was
trained and predicts at; absent: every real token."""
LABELLED_KEY = "labelled"
"""Whether a feature carries gold labels (an unlabelled or augmented one has placeholders the hard loss skips)."""


@dataclass(frozen=True)
class LossWeights:
    """The weights of the three terms, and the soft targets' temperature."""

    soft: float
    hard: float
    hidden: float
    temperature: float
    attention: float = 0.0


class DistillationModel(nn.Module):
    """The student and the projection of its hidden states onto the teacher's width (`width_projection`). Evaluation
    and saving read `student` alone (the projection only serves the hidden-state loss); its forward is the
    student's, so whatever calls the trained module as a model gets the student."""

    def __init__(self, student: nn.Module, projection: nn.Module) -> None:
        super().__init__()
        self.student = student
        self.projection = projection

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.student(*args, **kwargs)


class DistillationLoss:
    """The distillation loss of a `DistillationModel` on a `collate_distillation` batch: (mean loss, metrics with
    each term's mean, so the log shows what each contributes)."""

    def __init__(self, task: Task, weights: LossWeights, teacher: nn.Module | None = None,
                 layer_map: Sequence[tuple[int, int]] = ()) -> None:
        if (weights.hidden > 0 or weights.attention > 0) and (teacher is None or not layer_map):
            raise ValueError("the hidden-state and attention losses need the teacher and a layer map")
        self.task, self.weights, self.teacher, self.layer_map = task, weights, teacher, tuple(layer_map)
        if teacher is not None:
            teacher.eval().requires_grad_(False)

    def __call__(self, model: nn.Module, batch: dict[str, Any]) -> tuple[torch.Tensor, dict[str, Any]]:
        w = self.weights
        parts = _distillation_model(model)
        inputs = (batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
        with _probes(parts.student, w.attention > 0) as probes:
            # through `model` itself: under torchrun, DDP's wrapper averages the gradients only of its own forward
            outputs = model(*inputs, output_hidden_states=w.hidden > 0)
        loss = torch.zeros((), device=batch["input_ids"].device)
        metrics: dict[str, Any] = {}
        if w.soft > 0:
            where = batch.get(SOFT_MASK_KEY, batch["attention_mask"])
            soft = soft_target_loss(self.task, outputs, batch[TEACHER_KEY], where, w.temperature)
            loss, metrics["soft_loss"] = loss + w.soft * soft, soft.detach()
        if w.hard > 0:
            hard = self._hard_loss(outputs, batch)
            loss, metrics["hard_loss"] = loss + w.hard * hard, hard.detach()
        if w.hidden > 0 or w.attention > 0:
            teacher, teacher_probes = self._teacher(inputs, w.attention > 0)
            if w.hidden > 0:
                hidden = self._hidden_loss(outputs.hidden_states, teacher.hidden_states, parts.projection, inputs)
                loss, metrics["hidden_loss"] = loss + w.hidden * hidden, hidden.detach()
            if w.attention > 0:
                attention = self._attention_loss(probes.probabilities, teacher_probes, inputs[2])
                loss, metrics["attention_loss"] = loss + w.attention * attention, attention.detach()
        return loss, metrics

    def _teacher(self, inputs: tuple[torch.Tensor, ...], attention: bool) -> tuple[Any, list[torch.Tensor]]:
        """The teacher's outputs with its hidden states, and its attention distributions when asked."""
        assert self.teacher is not None  # __init__ refuses these terms without one
        with torch.no_grad(), _probes(self.teacher, attention) as probes:
            out = self.teacher(*inputs, output_hidden_states=True)
        return out, probes.probabilities

    def _hard_loss(self, outputs: Any, batch: dict[str, Any]) -> torch.Tensor:
        """The task's loss on the labelled rows, times their share of the batch (so the batch's loss stays a mean
        per example); 0 for a batch without labels."""
        labelled = batch[LABELLED_KEY]
        count = int(labelled.sum())  # one read of the device a step: which rows the task's loss may see
        if count == 0:
            return torch.zeros((), device=labelled.device)
        rows = labelled.bool()
        subset = dataclasses.replace(outputs, hidden_states=None,
                                     **{name: getattr(outputs, name)[rows] for name in self.task.output_names})
        hard, _ = self.task.loss(_Outputs(subset), {k: v[rows] for k, v in batch.items()
                                                    if isinstance(v, torch.Tensor)})
        return hard * (count / labelled.numel())

    def _hidden_loss(self, student_hidden: Sequence[torch.Tensor], teacher_hidden: Sequence[torch.Tensor],
                     projection: nn.Module, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """Mean over the mapped layers of the MSE between projected student and teacher states at real tokens."""
        real = inputs[2].reshape(-1, inputs[2].shape[-1]).bool()  # (B, T); multiple choice: (B*C, T)
        terms = [F.mse_loss(projection(student_hidden[s][real]).float(), teacher_hidden[t][real].float())
                 for s, t in self.layer_map]
        return torch.stack(terms).mean()

    def _attention_loss(self, student: Sequence[torch.Tensor], teacher: Sequence[torch.Tensor],
                        attention_mask: torch.Tensor) -> torch.Tensor:
        """Mean over the mapped layers (the embeddings have none) of KL(teacher || student) between attention
        distributions (B, A, T, T), each query's averaged over the real queries and the heads."""
        real = attention_mask.reshape(-1, attention_mask.shape[-1]).bool()  # (B, T)
        terms = []
        for s, t in self.layer_map:
            if s == 0:
                continue
            p_student, p_teacher = student[s - 1].float(), teacher[t - 1].float()
            # xlogy: a padded key has probability 0 in both, and 0 * log 0 counts 0.
            kl = (torch.xlogy(p_teacher, p_teacher) - p_teacher * p_student.clamp_min(1e-30).log()).sum(-1)
            terms.append(kl.mean(1)[real].mean())  # (B, A, T) -> (B, T) -> the real queries
        return torch.stack(terms).mean()


def _probes(model: nn.Module, record: bool) -> Any:
    """`recording_attention` around the task model's encoder when `record`, else nothing."""
    bert = model.bert
    assert isinstance(bert, nn.Module)  # every task model's encoder
    return recording_attention(bert) if record else contextlib.nullcontext(AttentionProbes())


def _distillation_model(model: nn.Module) -> DistillationModel:
    """The DistillationModel that trains (inside DDP's wrapper under torchrun; tasks/ does not reach train/)."""
    plain = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
    if not isinstance(plain, DistillationModel):
        raise TypeError(f"the distillation loss trains a DistillationModel, not {type(plain).__name__}")
    return plain


class _Outputs(nn.Module):
    """Stands in for the model in a task's `loss`: returns the outputs computed already, whatever it is given."""

    def __init__(self, outputs: Any) -> None:
        super().__init__()
        self.outputs = outputs

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.outputs


def soft_target_loss(task: Task, outputs: Any, teacher: dict[str, torch.Tensor], attention_mask: torch.Tensor,
                     temperature: float) -> torch.Tensor:
    """The mean over the task's outputs of each output's soft-target loss (see the module docstring); token-level
    outputs are read where `attention_mask` is 1 (a tagger's first sub-tokens, with `SOFT_MASK_KEY`)."""
    terms = []
    for name in task.output_names:
        student, target = getattr(outputs, name).float(), teacher[name].float()
        if name in task.token_level_outputs:
            real = attention_mask.bool()
            target = target[:, :student.shape[1]]
            if student.dim() == 2:  # a score per position: a distribution over the real tokens of each row
                terms.append(_kl(student, target, temperature, real))
            else:  # a distribution over classes at each real token
                terms.append(_kl(student[real], target[real], temperature))
        elif student.shape[-1] == 1:  # regression: the teacher's score
            terms.append(F.mse_loss(student, target))
        else:
            terms.append(_kl(student, target, temperature))
    return torch.stack(terms).mean()


def _kl(student: torch.Tensor, teacher: torch.Tensor, temperature: float, real: torch.Tensor | None = None
        ) -> torch.Tensor:
    """T^2 * KL(softmax(teacher / T) || softmax(student / T)) over the last axis, the mean over rows; `real` (same
    shape) leaves the other entries out of both distributions (padding in a distribution over positions)."""
    if student.shape[0] == 0:
        return student.sum() * 0.0
    student, teacher = student / temperature, teacher / temperature
    if real is not None:  # a large finite score, not -inf: exp gives 0 and no inf - inf appears
        student, teacher = student.masked_fill(~real, -1e30), teacher.masked_fill(~real, -1e30)
    log_student = F.log_softmax(student, dim=-1)
    log_teacher = F.log_softmax(teacher, dim=-1)
    terms = log_teacher.exp() * (log_teacher - log_student)
    if real is not None:
        terms = terms.masked_fill(~real, 0.0)
    return terms.sum(-1).mean() * temperature ** 2


def collate_distillation(features: Sequence[dict[str, Any]], pad_token_id: int) -> dict[str, Any]:
    """`pad_batch` of the features, with `labelled` (B,) and each teacher output padded with zeros to the longest
    (token-level outputs are cut to their feature's length; padded positions are masked by the loss)."""
    batch: dict[str, Any] = pad_batch(features, pad_token_id)
    batch[LABELLED_KEY] = torch.tensor([bool(f[LABELLED_KEY]) for f in features])
    if SOFT_MASK_KEY in features[0]:
        longest = batch["input_ids"].shape[-1]
        batch[SOFT_MASK_KEY] = torch.tensor([[*f[SOFT_MASK_KEY], *[0] * (longest - len(f[SOFT_MASK_KEY]))]
                                             for f in features])
    if TEACHER_KEY in features[0]:  # (a hidden-state loss alone reads no teacher outputs)
        batch[TEACHER_KEY] = {name: _pad_arrays([f[TEACHER_KEY][name] for f in features])
                              for name in features[0][TEACHER_KEY]}
    return batch


def _pad_arrays(arrays: list[np.ndarray]) -> torch.Tensor:
    """Arrays of one rank, zero-padded along the first axis to the longest: (B, *longest shape) float32."""
    if arrays[0].ndim == 0:
        return torch.tensor(np.stack(arrays), dtype=torch.float32)
    longest = max(a.shape[0] for a in arrays)
    out = np.zeros((len(arrays), longest, *arrays[0].shape[1:]), dtype=np.float32)
    for row, array in enumerate(arrays):
        out[row, :array.shape[0]] = array
    return torch.from_numpy(out)


class MaskedLMDistillation:
    """General (pre-training) distillation as the training loop normalises it (`bertkit.train.loop.Objective`),
    DistilBERT's objective (Sanh et al. 2019, section 3): at the masked positions, the soft targets of the
    teacher's masked-LM distribution at a temperature (x T^2) and the masked-LM cross-entropy on the original
    tokens, each averaged over the masked tokens of the whole global batch; and the cosine distance between the
    student's and the teacher's last hidden states, averaged over the real tokens. The teacher (a masked-LM model,
    frozen, eval mode) reads the same batch; a static batch (`collate_static`'s listed positions, padding entries
    of weight 0) and a dynamic one (`mlm_labels`) both work."""

    def __init__(self, teacher: nn.Module, weights: LossWeights) -> None:
        self.teacher, self.weights = teacher.eval().requires_grad_(False), weights

    @property
    def last_layer(self) -> str | None:
        """Where the student's last layer runs, as the run's checkpoints record it: at the masked positions alone
        without the hidden-state loss; None (in full, as before the record) with it, which reads every state."""
        return None if self.weights.hidden > 0 else "masked positions"

    def counts(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if "masked_lm_weights" in batch:
            masked = batch["masked_lm_weights"].sum().to(torch.int64)
        else:
            masked = (batch["mlm_labels"] != -100).sum()
        mask = batch.get("attention_mask")  # a static batch without padding has none
        return {"mlm": masked, "tokens": mask.sum() if mask is not None else torch.tensor(batch["input_ids"].numel())}

    def __call__(self, model: nn.Module, batch: dict[str, torch.Tensor], totals: dict[str, torch.Tensor]
                 ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        w = self.weights
        hidden = w.hidden > 0
        student, targets, weights = _masked_lm(model, batch, hidden)
        with torch.no_grad():
            teacher, _, _ = _masked_lm(self.teacher, batch, hidden)
        logits = student.logits.float()  # (M, V) at the masked positions
        mlm = (F.cross_entropy(logits, targets.clamp(min=0), reduction="none") * weights).sum() / totals["mlm"]
        t = w.temperature
        log_student = F.log_softmax(logits / t, -1)
        log_teacher = F.log_softmax(teacher.logits.float() / t, -1)
        kl = (log_teacher.exp() * (log_teacher - log_student)).sum(-1)
        soft = (kl * weights).sum() / totals["mlm"] * t ** 2
        loss = w.soft * soft + w.hard * mlm
        correct = ((logits.argmax(-1) == targets).float() * weights).sum() / totals["mlm"]
        metrics = {"mlm_loss": mlm.detach(), "mlm_accuracy": correct, "soft_loss": soft.detach()}
        if hidden:
            mask = batch.get("attention_mask")
            real = mask.bool() if mask is not None else torch.ones_like(batch["input_ids"], dtype=torch.bool)
            cosine = F.cosine_similarity(student.hidden_states[-1][real].float(),
                                         teacher.hidden_states[-1][real].float(), dim=-1)
            distance = (1.0 - cosine).sum() / totals["tokens"]
            loss = loss + w.hidden * distance
            metrics["cosine_loss"] = distance.detach()
        return loss, metrics


def _masked_lm(model: nn.Module, batch: dict[str, torch.Tensor], hidden: bool
               ) -> tuple[Any, torch.Tensor, torch.Tensor]:
    """(the masked-LM model's outputs at the masked positions, their targets (M,), their weights (M,): 0 for a
    static batch's padding entries)."""
    if "masked_lm_positions" in batch:
        layout = None
        if "cu_seqlens" in batch:  # the collator's layout: the model reads nothing back from the device
            layout = Unpadded.from_collated(batch["attention_mask"], batch["token_indices"], batch["cu_seqlens"])
        out = model(batch["input_ids"], batch["token_type_ids"], batch.get("attention_mask"), hidden,
                    masked_positions=batch["masked_lm_positions"], layout=layout)
        return out, batch["masked_lm_ids"].reshape(-1), batch["masked_lm_weights"].reshape(-1).float()
    masked = batch["mlm_labels"] != -100  # (B, T)
    out = model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"], hidden,
                masked_positions=masked)
    targets = batch["mlm_labels"][masked]
    return out, targets, torch.ones_like(targets, dtype=torch.float32)
