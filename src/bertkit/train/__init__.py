"""Model-agnostic training: the loop (`fit`, `TrainConfig`), optimizers and schedule, atomic
checkpoints, the resumable batch source, reporting, and torchrun/DDP set-up.

Design decision: nothing here imports BERT; pre-training and fine-tuning both call `fit` with their own
`loss_fn`, so every guarantee (exact resume, non-finite guard, atomic checkpoints, DDP) holds for both.
"""

from bertkit.train.distributed import DistributedContext, setup_distributed, teardown_distributed
from bertkit.train.loop import FitResult, TrainConfig, fit

__all__ = ["DistributedContext", "FitResult", "TrainConfig", "fit", "setup_distributed", "teardown_distributed"]
