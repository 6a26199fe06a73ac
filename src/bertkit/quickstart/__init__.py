"""`bertkit quickstart`: vocabulary -> pre-training data -> pre-training -> fine-tuning (pre-trained and
random initialisation) -> fill-mask -> report, on the bundled King James Bible, in one call and one time
budget.

`stages` runs the stages (each writes the directory the normal command would write), `plan` splits
`--minutes` between them from throughput measured on this machine, `report` writes report.md and its
figures from the run's summary.
"""

from bertkit.quickstart.plan import Rates, TimePlan, plan_time
from bertkit.quickstart.report import seed_table
from bertkit.quickstart.stages import (
    MODEL,
    QuickstartConfig,
    Recipe,
    build_data,
    fill_mask_examples,
    finetune_model,
    prepare_output,
    pretrain_model,
    run_quickstart,
    train_vocabulary,
)

__all__ = ["MODEL", "QuickstartConfig", "Rates", "Recipe", "TimePlan", "build_data", "fill_mask_examples",
           "finetune_model", "plan_time", "prepare_output", "pretrain_model", "run_quickstart", "seed_table",
           "train_vocabulary"]
