"""The settings of every run: one dataclass per thing a command configures, and the values they accept, by group.

- `fields`: the `Settings` base (bounds, choices and a class's own rules checked when an object is made), the
  settings several commands share (`TorchThreads`, `DeviceChoice`), flag names for messages.
- `training`: `TrainConfig` (the loop's run description), `PretrainSettings`, `FinetuneSettings` (holding a
  TrainConfig with fine-tuning's defaults, `finetune_training`), `GlueSettings`.
- `tasks`: a fine-tuned task's own settings (saved in bertkit_task.json): `ClassificationSettings`,
  `TaggingSettings`, `SquadSettings`, `MultipleChoiceSettings`, `LongDocumentSettings`; and `EmbeddingSettings`.
- `data`: `InstanceSettings` (what changes pre-training data, recorded in the manifest) and
  `PretrainingDataSettings` (`bertkit data pretraining`'s files and workers); `TokenizerTrainSettings`,
  `TokenizerExtendSettings`, `TokenizerEncodeSettings`.
- `distillation`: `DistillSettings` (`bertkit distill`'s teacher, student and losses).
- `inference`: `ExtractSettings`, `ExportSettings`, `PredictSettings`.
- `serving`: `Limits`, `ServerSettings`, `ServeSettings`.

(`bertkit quickstart`'s QuickstartSettings and Recipe live in bertkit.quickstart.config: their defaults come
from bertkit.workflows.recipes.)

Design decision: these dataclasses are the one source of each setting. The command line is generated from
them (`bertkit.cli.options`: a field is a flag, its docstring the help, its `choices` metadata the accepted
values, `min`/`max` its bounds), the library functions take them, and a settings object checks itself when it
is made (`fields.Settings`). The choices are what the implementing modules check against (a test asserts that
each implements exactly these). No module here imports torch, numpy or starlette, so every command's `--help`
answers at once. This package re-exports every group's names: `from bertkit.settings import TrainConfig`.
"""

from bertkit.settings.data import (
    DATA_RNGS,
    DUPE_FACTORS,
    MASKINGS,
    MAX_INSTANCE_TOKENS,
    PACKINGS,
    VOCABULARY_INITS,
    InstanceSettings,
    PretrainingDataSettings,
    TokenizerEncodeSettings,
    TokenizerExtendSettings,
    TokenizerTrainSettings,
    VocabularySettings,
)
from bertkit.settings.distillation import (
    DISTILL_KINDS,
    UNLABELED_KINDS,
    DistillSettings,
    every_other_layer,
    student_layers,
)
from bertkit.settings.fields import (
    DEVICES,
    INFERENCE_PRECISIONS,
    PAIR_TOKENS,
    PRECISIONS,
    SINGLE_TEXT_TOKENS,
    DeviceChoice,
    InferencePrecision,
    Settings,
    TorchThreads,
    check_fields,
    check_positions,
    field_flag,
    flag_of,
    sequence_length_field,
)
from bertkit.settings.inference import (
    POOLINGS,
    QUANTIZATIONS,
    ExportSettings,
    ExtractSettings,
    PredictSettings,
)
from bertkit.settings.serving import (
    LOG_LEVELS,
    Limits,
    ServerSettings,
    ServeSettings,
)
from bertkit.settings.tasks import (
    EMBEDDING_POOLINGS,
    FINETUNE_KINDS,
    LONG_DOCUMENTS,
    TAG_SCHEMES,
    TASK_SETTINGS,
    WINDOW_AGGREGATIONS,
    ClassificationSettings,
    EmbeddingSettings,
    LongDocumentSettings,
    MultipleChoiceSettings,
    SquadSettings,
    TaggingSettings,
    TaskSettings,
)
from bertkit.settings.training import (
    DEFAULT_GLOBAL_BATCH_SIZE,
    FEATURE_COMBINES,
    GLUE_LEARNING_RATES,
    GLUE_SEEDS,
    LR_SCHEDULES,
    MLM_BIAS_INITS,
    OPTIMIZERS,
    RANDOM_INIT_COMPARISONS,
    RECIPES,
    RESUME_EXACT_SETTINGS,
    BatchSizes,
    FinetuneSettings,
    GlueSettings,
    PretrainSettings,
    TrainConfig,
    finetune_training,
)

__all__ = [
    "DATA_RNGS",
    "DEFAULT_GLOBAL_BATCH_SIZE",
    "DEVICES",
    "DISTILL_KINDS",
    "DUPE_FACTORS",
    "EMBEDDING_POOLINGS",
    "FEATURE_COMBINES",
    "FINETUNE_KINDS",
    "GLUE_LEARNING_RATES",
    "GLUE_SEEDS",
    "INFERENCE_PRECISIONS",
    "LOG_LEVELS",
    "LONG_DOCUMENTS",
    "LR_SCHEDULES",
    "MASKINGS",
    "MAX_INSTANCE_TOKENS",
    "MLM_BIAS_INITS",
    "OPTIMIZERS",
    "PACKINGS",
    "PAIR_TOKENS",
    "POOLINGS",
    "PRECISIONS",
    "QUANTIZATIONS",
    "RANDOM_INIT_COMPARISONS",
    "RECIPES",
    "RESUME_EXACT_SETTINGS",
    "SINGLE_TEXT_TOKENS",
    "TAG_SCHEMES",
    "TASK_SETTINGS",
    "UNLABELED_KINDS",
    "VOCABULARY_INITS",
    "WINDOW_AGGREGATIONS",
    "BatchSizes",
    "ClassificationSettings",
    "DeviceChoice",
    "DistillSettings",
    "EmbeddingSettings",
    "ExportSettings",
    "ExtractSettings",
    "FinetuneSettings",
    "GlueSettings",
    "InferencePrecision",
    "InstanceSettings",
    "Limits",
    "LongDocumentSettings",
    "MultipleChoiceSettings",
    "PredictSettings",
    "PretrainSettings",
    "PretrainingDataSettings",
    "ServeSettings",
    "ServerSettings",
    "Settings",
    "SquadSettings",
    "TaggingSettings",
    "TaskSettings",
    "TokenizerEncodeSettings",
    "TokenizerExtendSettings",
    "TokenizerTrainSettings",
    "TorchThreads",
    "TrainConfig",
    "VocabularySettings",
    "check_fields",
    "check_positions",
    "every_other_layer",
    "field_flag",
    "finetune_training",
    "flag_of",
    "sequence_length_field",
    "student_layers",
]
