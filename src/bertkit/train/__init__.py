"""Model-agnostic training: the loop (`fit`, with `TrainingData`, `Hooks` and `Resume`), what a checkpoint holds
and the resume rules (resume.py), optimizers and schedule, atomic checkpoint directories, the resumable batch
source, reporting, and torchrun/DDP set-up.

Design decision: nothing here imports BERT, and nothing here prepares a model: a workflow places, wraps and
compiles it and resolves the precision (`bertkit.workflows.prepare`), then pre-training and fine-tuning both
call `fit` with their own loss, so every guarantee (exact resume, non-finite guard, atomic checkpoints, DDP)
holds for both.
"""

from bertkit.settings import TrainConfig
from bertkit.train.distributed import DistributedContext, setup_distributed, teardown_distributed, wrap_model
from bertkit.train.loop import FitResult, Hooks, TrainingData, fit
from bertkit.train.resume import Resume

__all__ = ["DistributedContext", "FitResult", "Hooks", "Resume", "TrainConfig", "TrainingData", "fit",
           "setup_distributed", "teardown_distributed", "wrap_model"]
