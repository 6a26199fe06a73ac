"""Worker for test_distillation_ddp.py, run under torchrun: one backward of the distillation loss through DDP over
gloo, each rank on its own batch; prints every rank's gradient of a student weight and of the width projection.

Usage: python -m torch.distributed.run --nproc-per-node 2 distill_ddp_worker.py
"""

from __future__ import annotations

import json

import numpy as np
import torch

from bertkit.config import preset
from bertkit.model import BertForSequenceClassification
from bertkit.model.student import student_from_teacher, uniform_layer_map, width_projection
from bertkit.settings import ClassificationSettings
from bertkit.tasks.classification import ClassificationTask
from bertkit.tasks.distillation import DistillationLoss, DistillationModel, LossWeights, collate_distillation
from bertkit.train import setup_distributed, teardown_distributed, wrap_model
from bertkit.train.distributed import all_gather_objects


def gathered_gradients(ctx) -> list[dict[str, float]]:
    """Every rank's gradient sums after one backward through DDP. The DDP wrapper dies with this frame, so
    teardown_distributed (called after it returns) can collect it while the process group exists: a wrapper still
    referenced at teardown is destroyed at the interpreter's exit instead, which aborts a gloo process now and then."""
    torch.manual_seed(0)
    teacher = BertForSequenceClassification(preset("bert-debug", vocab_size=12).replace(
        num_hidden_layers=4, num_labels=3)).eval()
    student = DistillationModel(student_from_teacher(teacher, (0, 2)), width_projection(32, 48))
    teacher_wide = BertForSequenceClassification(preset("bert-debug", vocab_size=12).replace(
        num_hidden_layers=4, num_labels=3, hidden_size=48)).eval()  # another width: the projection trains
    task = ClassificationTask(ClassificationSettings(labels=["a", "b", "c"], max_seq_length=16))
    loss_fn = DistillationLoss(task, LossWeights(soft=1.0, hard=1.0, hidden=1.0, temperature=2.0), teacher_wide,
                               uniform_layer_map(2, 4))
    features = [{"input_ids": [2, 5 + (i + ctx.rank) % 6, 6, 3], "token_type_ids": [0] * 4, "attention_mask": [1] * 4,
                 "labels": (i + ctx.rank) % 3, "labelled": True, "teacher": {"logits": np.array([0.5, -1.0, i])}}
                for i in range(4)]
    model = wrap_model(student, ctx)
    loss, _ = loss_fn(model, collate_distillation(features, 0))
    loss.backward()
    grads = {"layer": student.student.bert.layers[0].qkv.weight.grad.sum().item(),
             "projection": student.projection.weight.grad.sum().item()}
    return all_gather_objects(grads, ctx)


def main() -> None:
    ctx = setup_distributed("cpu")
    gathered = gathered_gradients(ctx)
    if ctx.is_main:
        print(json.dumps({"grads": gathered}), flush=True)
    teardown_distributed()


if __name__ == "__main__":
    main()
