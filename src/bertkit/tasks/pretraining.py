"""Pre-training as a task kind: the masked-LM + next-sentence-prediction objective and its held-out metrics
(`bertkit pretrain` runs them: `bertkit.workflows.pretrain`).

Design decision: the MLM loss is computed from the sparse head - the vocabulary projection runs only at
the N masked positions, selected with `mlm_labels != -100` in row-major order, so `labels[mask]` lines up
with the (N, V) logits. It equals the dense (B, T, V) loss with ignore_index=-100 (tested to 1e-6).
`--no-nsp` (the paper's ablation) trains a BertForMaskedLM, which has no pooler or NSP head at all.

References: Devlin et al. 2018, sections 3.1 and A.2; Geiping & Goldstein 2022 (cramming) for the sparse
MLM head.
"""

from __future__ import annotations

import logging

import torch
from torch import nn
from torch.nn import functional as F

logger = logging.getLogger(__name__)

IGNORE_INDEX = -100


# --- loss and metrics ----------------------------------------------------------------------------

def mlm_logits_and_targets(model: nn.Module, batch: dict[str, torch.Tensor], nsp: bool, sparse: bool
                            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(MLM logits, their targets, NSP logits or None); sparse: (N, V) and (N,), dense: (B*T, V), (B*T,)."""
    labels = batch["mlm_labels"]
    masked = labels != IGNORE_INDEX  # (B, T)
    out = model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"],
                masked_positions=masked if sparse else None)
    logits = out.prediction_logits if nsp else out.logits
    if sparse:
        return logits, labels[masked], out.seq_relationship_logits if nsp else None
    return logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), out.seq_relationship_logits if nsp else None


class PretrainingObjective:
    """The pre-training loss as the training loop normalises it (`bertkit.train.loop.Objective`): the MLM
    cross-entropy averaged over the masked tokens of the whole global batch (every micro-batch, every
    process), plus the NSP cross-entropy averaged over its pairs. Google's TF code averages the MLM loss per
    core and then over cores, which weights a masked token by how few its batch had; here every masked
    token of a step counts the same, however the batch is split (docs/pretraining.md)."""

    def __init__(self, nsp: bool = True, sparse: bool = True) -> None:
        self.nsp, self.sparse = nsp, sparse

    def counts(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        counts = {"mlm": (batch["mlm_labels"] != IGNORE_INDEX).sum()}
        if self.nsp:
            counts["nsp"] = torch.tensor(len(batch["nsp_labels"]))
        return counts

    def __call__(self, model: nn.Module, batch: dict[str, torch.Tensor], totals: dict[str, torch.Tensor]
                 ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        mlm_logits, targets, nsp_logits = mlm_logits_and_targets(model, batch, self.nsp, self.sparse)
        predicted = targets != IGNORE_INDEX
        tokens = totals["mlm"]
        # A sum over no masked token is a zero that still reaches every MLM parameter (DDP needs them all).
        mlm_sum = F.cross_entropy(mlm_logits.float(), targets, ignore_index=IGNORE_INDEX, reduction="sum")
        correct = ((mlm_logits.argmax(-1) == targets) & predicted).sum()
        loss = mlm_sum / tokens
        metrics = {"mlm_loss": loss.detach(), "mlm_accuracy": correct / tokens}
        if nsp_logits is None:
            return loss, metrics
        pairs = totals["nsp"]
        nsp_loss = F.cross_entropy(nsp_logits.float(), batch["nsp_labels"], reduction="sum") / pairs
        metrics["nsp_loss"] = nsp_loss.detach()
        metrics["nsp_accuracy"] = (nsp_logits.argmax(-1) == batch["nsp_labels"]).sum() / pairs
        return loss + nsp_loss, metrics


def pretraining_loss(model: nn.Module, batch: dict[str, torch.Tensor], nsp: bool = True, sparse: bool = True
                     ) -> tuple[torch.Tensor, dict[str, float]]:
    """Mean MLM cross-entropy over the masked tokens of this batch (+ mean NSP cross-entropy); metrics for
    the log. (Training normalises over the global batch instead: `PretrainingObjective`.)"""
    objective = PretrainingObjective(nsp, sparse)
    counts = {key: value.clamp(min=1) for key, value in objective.counts(batch).items()}
    loss, metrics = objective(model, batch, counts)
    return loss, {key: float(value) for key, value in metrics.items()}
