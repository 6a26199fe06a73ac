"""`bertkit quickstart`: vocabulary -> pre-training data -> pre-training -> fine-tuning (pre-trained and
random initialisation) -> fill-mask -> report, on the bundled King James Bible, in one call and one time
budget.

`config` holds the settings (the command's flags), `stages` runs the stages (each writes the directory the
normal command would write), `plan` splits `--minutes` between them from throughput measured on this
machine, `report` writes report.md and its figures from the run's summary.

Design decision: the names of `stages` (which imports torch) are imported on first use (PEP 562), so
`bertkit quickstart --help`, which reads `config`, answers without torch.
"""

from __future__ import annotations

import importlib
from typing import Any

from bertkit.quickstart.config import MODEL, QuickstartSettings, Recipe
from bertkit.quickstart.plan import Rates, TimePlan, plan_time
from bertkit.quickstart.report import seed_table

_STAGES = ("build_data", "fill_mask_examples", "finetune_model", "prepare_output", "pretrain_model",
           "run_quickstart", "train_vocabulary")


def __getattr__(name: str) -> Any:
    if name in _STAGES:
        return getattr(importlib.import_module("bertkit.quickstart.stages"), name)
    raise AttributeError(f"module 'bertkit.quickstart' has no attribute {name!r}")


__all__ = ["MODEL", "QuickstartSettings", "Rates", "Recipe", "TimePlan", "build_data", "fill_mask_examples",
           "finetune_model", "plan_time", "prepare_output", "pretrain_model", "run_quickstart", "seed_table",
           "train_vocabulary"]
