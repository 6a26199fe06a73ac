"""Pre-training as a task kind: the masked-LM + next-sentence-prediction objective and its held-out metrics
(`bertkit pretrain` runs them: `bertkit.workflows.pretrain`).

Design decision: the MLM loss is computed from the sparse head - the vocabulary projection runs only at
the N masked positions, selected with `mlm_labels != -100` in row-major order, so `labels[mask]` lines up
with the (N, V) logits. It equals the dense (B, T, V) loss with ignore_index=-100 (tested to 1e-6).
`--no-nsp` (the paper's ablation) trains a BertForMaskedLM, which has no pooler or NSP head at all.

A batch of `bertkit.data.collate_static` (a GPU step's) names its predictions as Google's data does instead:
`masked_lm_positions`, `masked_lm_ids`, `masked_lm_weights` (B, P), a static size with weight-0 padding, and
the real tokens' layout when rows are padded; the loss is then the weighted sum over the B x P gathered
positions, the same number, with nothing read from the device. Its MLM loss function is a part that can be
swapped (`mlm_loss`): `weighted_mlm_loss` (fp32 logits, the reference) or the fused kernel
`bertkit.kernels.cross_entropy.masked_lm_loss` (the same sums without an fp32 copy of the logits).

References: Devlin et al. 2018, sections 3.1 and A.2; Geiping & Goldstein 2022 (cramming) for the sparse
MLM head.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

from bertkit.model.padding import Unpadded

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


MlmLoss = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
"""(logits (M, V), targets (M,), weights (M,)) -> (sum of weight x cross-entropy, sum of weight x correct)."""


def weighted_mlm_loss(logits: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference MlmLoss: cross-entropy of fp32 logits, each row weighted (0 for a padding entry)."""
    scores = logits.float()  # argmax too: on a CPU, over bf16 rows it took twice fp32's time (same answer)
    losses = F.cross_entropy(scores, targets, reduction="none")
    correct = (scores.argmax(-1) == targets).to(weights.dtype)
    return (losses * weights).sum(), (correct * weights).sum()


class PretrainingObjective:
    """The pre-training loss as the training loop normalises it (`bertkit.train.loop.Objective`): the MLM
    cross-entropy averaged over the masked tokens of the whole global batch (every micro-batch, every
    process), plus the NSP cross-entropy averaged over its pairs. Google's TF code averages the MLM loss per
    core and then over cores, which weights a masked token by how few its batch had; here every masked
    token of a step counts the same, however the batch is split (docs/pretraining.md). `mlm_loss` computes
    the MLM sums of a static batch (`weighted_mlm_loss`, or a fused kernel). `last_layer`: where the encoder's last
    layer runs, as the run's checkpoints record it (the masked-LM heads ask for the masked positions alone)."""

    last_layer = "masked positions"

    def __init__(self, nsp: bool = True, sparse: bool = True, mlm_loss: MlmLoss = weighted_mlm_loss) -> None:
        self.nsp, self.sparse, self.mlm_loss = nsp, sparse, mlm_loss

    def counts(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if "masked_lm_weights" in batch:  # a static batch: its weights count the real predictions
            counts = {"mlm": batch["masked_lm_weights"].sum().to(torch.int64)}
        else:
            counts = {"mlm": (batch["mlm_labels"] != IGNORE_INDEX).sum()}
        if self.nsp:
            counts["nsp"] = torch.tensor(len(batch["nsp_labels"]))
        return counts

    def __call__(self, model: nn.Module, batch: dict[str, torch.Tensor], totals: dict[str, torch.Tensor]
                 ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        if "masked_lm_positions" in batch:
            mlm_sum, correct, nsp_logits = self._static_mlm(model, batch)
        else:
            mlm_logits, targets, nsp_logits = mlm_logits_and_targets(model, batch, self.nsp, self.sparse)
            # A sum over no masked token is a zero that still reaches every MLM parameter (DDP needs them all).
            scores = mlm_logits.float()  # argmax too: on a CPU, over bf16 rows it took twice fp32's time
            mlm_sum = F.cross_entropy(scores, targets, ignore_index=IGNORE_INDEX, reduction="sum")
            correct = ((scores.argmax(-1) == targets) & (targets != IGNORE_INDEX)).sum()
        tokens = totals["mlm"]
        loss = mlm_sum / tokens
        metrics = {"mlm_loss": loss.detach(), "mlm_accuracy": correct / tokens}
        if nsp_logits is None:
            return loss, metrics
        pairs = totals["nsp"]
        nsp_loss = F.cross_entropy(nsp_logits.float(), batch["nsp_labels"], reduction="sum") / pairs
        metrics["nsp_loss"] = nsp_loss.detach()
        metrics["nsp_accuracy"] = (nsp_logits.argmax(-1) == batch["nsp_labels"]).sum() / pairs
        return loss + nsp_loss, metrics

    def _static_mlm(self, model: nn.Module, batch: dict[str, torch.Tensor]
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(MLM loss sum, correct predictions, NSP logits or None) of a `collate_static` batch: the head runs at
        the B x P listed positions, weight-0 entries count for nothing."""
        layout = None
        if "cu_seqlens" in batch:  # padded rows: the collator's layout, so the model reads nothing back
            layout = Unpadded.from_collated(batch["attention_mask"], batch["token_indices"], batch["cu_seqlens"])
        out = model(batch["input_ids"], batch["token_type_ids"], batch.get("attention_mask"),
                    masked_positions=batch["masked_lm_positions"], layout=layout)
        logits = out.prediction_logits if self.nsp else out.logits  # (B*P, V)
        mlm_sum, correct = self.mlm_loss(logits, batch["masked_lm_ids"].reshape(-1),
                                         batch["masked_lm_weights"].reshape(-1))
        return mlm_sum, correct, out.seq_relationship_logits if self.nsp else None


def pretraining_loss(model: nn.Module, batch: dict[str, torch.Tensor], nsp: bool = True, sparse: bool = True
                     ) -> tuple[torch.Tensor, dict[str, float]]:
    """Mean MLM cross-entropy over the masked tokens of this batch (+ mean NSP cross-entropy); metrics for
    the log. (Training normalises over the global batch instead: `PretrainingObjective`.)"""
    objective = PretrainingObjective(nsp, sparse)
    counts = {key: value.clamp(min=1) for key, value in objective.counts(batch).items()}
    loss, metrics = objective(model, batch, counts)
    return loss, {key: float(value) for key, value in metrics.items()}
