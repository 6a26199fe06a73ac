"""A fine-tuning task's own settings, saved in a fine-tuned directory's bertkit_task.json so that predict,
evaluate and serve read inputs the same way; sentence-embedding training's (`EmbeddingSettings`); and how
classification reads inputs longer than the model (`LongDocumentSettings`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, cast

from bertkit.errors import BertkitError
from bertkit.settings.fields import Settings, sequence_length_field

TAG_SCHEMES = ("BIO", "IOB1", "BIOES")
"""Tagging schemes whose entities the tagging metrics read (bertkit.tasks.metrics.entity_scores)."""
LONG_DOCUMENTS = ("truncate", "windows")
"""How classification reads an input longer than --max-seq-length (bertkit.tasks.long_documents)."""
WINDOW_AGGREGATIONS = ("mean", "max")
"""How the window scores of a long document become its score (bertkit.tasks.long_documents.aggregate_logits)."""


# --- tasks (saved in bertkit_task.json) ----------------------------------------------------------------

class TaskSettings(Settings):
    """The settings of a fine-tuning task kind: its own fields, and what the command line needs to know of the
    kind without importing it (torch)."""

    kind: ClassVar[str]
    """bertkit_task.json's `task` and the `bertkit finetune` subcommand."""
    command_help: ClassVar[str]
    """The subcommand's help."""
    decided_by_data: ClassVar[tuple[str, ...]] = ()
    """Fields the training or dev data decides (label sets, SQuAD 2.0's threshold): no flag."""

    @classmethod
    def fitted_to(cls, positions: int) -> dict[str, Any]:
        """The fields to set so the kind's default windows fit a model of `positions` positions (none where they
        do): max_seq_length cut to them, the stride and question length that go with it cut in proportion."""
        defaults = {f.name: f.default for f in dataclasses.fields(cast(Any, cls)) if isinstance(f.default, int)}
        length = defaults.get("max_seq_length")
        if length is None or length <= positions:
            return {}
        return {"max_seq_length": positions, **{name: max(1, defaults[name] * positions // length)
                                                for name in ("doc_stride", "max_query_length") if name in defaults}}


@dataclass
class ClassificationSettings(TaskSettings):
    """Everything needed to read, encode and label inputs again (saved in bertkit_task.json)."""

    kind: ClassVar[str] = "classification"
    command_help: ClassVar[str] = ("Sentence or sentence-pair classification / regression (GLUE TSV, or "
                                   "CSV/TSV/JSONL/Parquet/`datasets` directory by column).")
    decided_by_data: ClassVar[tuple[str, ...]] = ("labels",)

    labels: list[str] | None
    """Label names by output index; None for regression."""
    max_seq_length: int = sequence_length_field(128)
    """Longest input in tokens, [CLS]/[SEP] included."""
    glue_task: str | None = None
    """GLUE task whose TSV layout and metrics to use: cola, sst2, mrpc, stsb, qqp, mnli, qnli, rte, wnli;
    unset: a generic table (CSV/TSV/JSONL by column)."""
    text_column: str = "text"
    """Column/key of the text (generic files)."""
    text_pair_column: str | None = None
    """Column/key of the second text of a pair (generic files)."""
    label_column: str = "label"
    """Column/key of the label (generic files)."""
    header: bool = True
    """CSV/TSV: the first row names the columns; --no-header: it is data, and --text-column,
    --text-pair-column and --label-column are column numbers (0 the first, -1 the last)."""
    long_documents: str = dataclasses.field(default="truncate", metadata={"choices": LONG_DOCUMENTS})
    """An input longer than --max-seq-length: truncate (longest-first, counted), or windows: cut into
    overlapping windows of --max-seq-length tokens (a pair keeps its first text and windows the second),
    each window trained with the input's label, scored, and the scores aggregated per input
    (docs/finetuning.md, "Documents longer than the model")."""
    doc_stride: int | None = dataclasses.field(default=None, metadata={"min": 1})
    """With --long-documents windows: tokens between the starts of consecutive windows; unset: half a
    window."""
    window_aggregation: str = dataclasses.field(default="mean", metadata={"choices": WINDOW_AGGREGATIONS})
    """With --long-documents windows: an input's logits are the mean of its windows' logits, or their
    maximum per label."""
    max_windows: int = dataclasses.field(default=16, metadata={"min": 1})
    """With --long-documents windows: most windows per input; a longer input keeps its first windows and its
    last one, and is counted as truncated."""

    def check(self) -> None:
        if self.long_documents not in LONG_DOCUMENTS:
            raise BertkitError(f"--long-documents {self.long_documents!r}: use one of {', '.join(LONG_DOCUMENTS)}")
        if self.window_aggregation not in WINDOW_AGGREGATIONS:
            raise BertkitError(f"--window-aggregation {self.window_aggregation!r}: use one of "
                               f"{', '.join(WINDOW_AGGREGATIONS)}")
        if self.long_documents == "truncate" and self.doc_stride is not None:
            raise BertkitError("--doc-stride applies to --long-documents windows; add that flag or drop --doc-stride")
        if self.long_documents == "windows" and self.max_seq_length < 4:
            raise BertkitError(f"--long-documents windows needs --max-seq-length of at least 4, got "
                               f"{self.max_seq_length}")
        if self.doc_stride is not None and self.doc_stride > self.max_seq_length - 2:
            raise BertkitError(f"--doc-stride {self.doc_stride} is longer than a window's {self.max_seq_length - 2} "
                               "text tokens (--max-seq-length minus [CLS] and [SEP]), so windows would skip tokens; "
                               "give at most that (half of it is the default)")


@dataclass
class TaggingSettings(TaskSettings):
    """Label names and window settings (saved in bertkit_task.json)."""

    kind: ClassVar[str] = "tagging"
    command_help: ClassVar[str] = ("Token tagging, e.g. named entities (CoNLL-2003 files, or JSONL/Parquet/`datasets` "
                                   "directory with token and tag lists by --tokens-column/--tags-column).")
    decided_by_data: ClassVar[tuple[str, ...]] = ("labels",)

    labels: list[str]
    max_seq_length: int = sequence_length_field(128)
    """Longest input in tokens, [CLS]/[SEP] included."""
    doc_stride: int = 64
    """Sub-tokens between the starts of consecutive windows of a long sentence."""
    tag_scheme: str = dataclasses.field(default="BIO", metadata={"choices": TAG_SCHEMES})
    """Tagging scheme of the labels (entity scores follow conlleval's rules, which read all three)."""
    tokens_column: str = "tokens"
    """JSONL/Parquet/`datasets` input: column/key of each sentence's tokens, a list of strings."""
    tags_column: str = "ner_tags"
    """JSONL/Parquet/`datasets` input: column/key of each sentence's tags, a list of strings (or a `datasets`
    list of ClassLabel, read as its names)."""


@dataclass
class SquadSettings(TaskSettings):
    """Window and decoding settings (saved in bertkit_task.json)."""

    kind: ClassVar[str] = "squad"
    command_help: ClassVar[str] = ("Extractive question answering (SQuAD v1.1 / v2.0 JSON, or JSONL/Parquet/`datasets` "
                                   "directory in the `datasets` squad layout).")
    decided_by_data: ClassVar[tuple[str, ...]] = ("null_score_diff_threshold",)

    max_seq_length: int = sequence_length_field(384, pairs=True)
    """Longest input in tokens, [CLS]/[SEP] included."""
    doc_stride: int = 128
    """Tokens between the starts of context windows."""
    max_query_length: int = 64
    """Question tokens kept."""
    version_2_with_negative: bool = False
    """SQuAD 2.0: questions may have no answer."""
    n_best_size: int = 20
    """Candidate starts/ends per window."""
    max_answer_length: int = 30
    """Longest answer in tokens."""
    null_score_diff_threshold: float = 0.0
    """SQuAD 2.0: answer "no answer" when its score beats the best span's by more than this (chosen on dev)."""


@dataclass
class MultipleChoiceSettings(TaskSettings):
    """Saved in bertkit_task.json."""

    kind: ClassVar[str] = "multiple-choice"
    command_help: ClassVar[str] = ("Multiple choice (SWAG CSV, or JSONL with context/endings/label; either layout as "
                                   "Parquet/`datasets`).")
    decided_by_data: ClassVar[tuple[str, ...]] = ()

    max_seq_length: int = sequence_length_field(128, pairs=True)
    """Longest input in tokens, [CLS]/[SEP] included."""


TASK_SETTINGS: tuple[type[TaskSettings], ...] = (ClassificationSettings, TaggingSettings, SquadSettings,
                                             MultipleChoiceSettings)
"""The settings of the fine-tuning task kinds, torch-free: each names its kind (bertkit_task.json's `task`, the
`bertkit finetune` subcommand), the subcommand's help and the fields the data decides (no flag). The task classes
take their kind from here (bertkit.tasks.kinds.TASK_CLASSES), so the command line and the registry agree."""
FINETUNE_KINDS: tuple[str, ...] = (*(settings.kind for settings in TASK_SETTINGS), "embedding")
"""The `bertkit finetune` subcommands: the task kinds, then sentence-embedding training."""


EMBEDDING_POOLINGS = ("mean", "cls", "max")
"""The values of `bertkit finetune embedding --pooling` (sentence-transformers' Pooling modes of those names)."""


@dataclass
class EmbeddingSettings(Settings):
    """How `bertkit finetune embedding` reads pairs and makes sentence vectors (the pooling, normalisation
    and length are saved as the sentence-transformers files of OUTPUT/best; bertkit.workflows.embedding)."""

    max_seq_length: int = sequence_length_field(128)
    """Longest text in tokens, [CLS]/[SEP] included (each text is encoded alone; longer ones are cut)."""
    pooling: str = dataclasses.field(default="mean", metadata={"choices": EMBEDDING_POOLINGS})
    """Sentence vector from the last layer: the mean of the real tokens' vectors, the [CLS] vector, or their
    maximum per dimension."""
    normalize: bool = False
    """Scale every sentence vector to unit length (a Normalize module in the saved directory), so that a dot
    product is the cosine; the loss and the evaluation use the cosine either way."""
    scale: float = 20.0
    """Multiple negatives ranking loss: the cosine similarities are multiplied by this before the softmax
    (20 = temperature 0.05, sentence-transformers' default)."""
    anchor_column: str = "anchor"
    """Column/key of the anchor (query) text."""
    positive_column: str = "positive"
    """Column/key of the text that matches the anchor."""
    negative_column: str | None = None
    """Column/key of a hard negative of the anchor in the training file (it joins the in-batch candidates);
    unset: in-batch negatives only."""
    header: bool = True
    """CSV/TSV: the first row names the columns; --no-header: it is data, and the column flags are column
    numbers (0 the first, -1 the last)."""
    given: tuple[str, ...] = ()
    """Which of max_seq_length, pooling and normalize the user chose (by flag); the others follow the starting
    directory's sentence-transformers files when it has them (its length, its pooling, its Normalize module)."""

    def check(self) -> None:
        if not 0 < self.scale < float("inf"):  # (also NaN)
            raise BertkitError(f"--scale must be a positive number, got {self.scale}")


@dataclass(kw_only=True)
class LongDocumentSettings(Settings):
    """How `bertkit predict`, `evaluate` and `serve` read classification inputs longer than the model;
    unset fields keep what the fine-tuned directory recorded (ClassificationSettings, bertkit_task.json)."""

    long_documents: str | None = dataclasses.field(default=None, metadata={"choices": LONG_DOCUMENTS})
    """Classification: truncate an input longer than the model's fine-tuned max_seq_length, or score it in
    overlapping windows and aggregate; unset: as fine-tuned."""
    doc_stride: int | None = dataclasses.field(default=None, metadata={"min": 1})
    """Classification with windows: tokens between the starts of consecutive windows; unset: as fine-tuned."""
    window_aggregation: str | None = dataclasses.field(default=None, metadata={"choices": WINDOW_AGGREGATIONS})
    """Classification with windows: mean of the windows' logits, or their maximum per label; unset: as
    fine-tuned."""
    max_windows: int | None = dataclasses.field(default=None, metadata={"min": 1})
    """Classification with windows: most windows per input (then its first windows and its last); unset: as
    fine-tuned."""

    def long_document_choices(self) -> dict[str, Any]:
        """The choices given (not None)."""
        names = ("long_documents", "doc_stride", "window_aggregation", "max_windows")
        return {name: getattr(self, name) for name in names if getattr(self, name) is not None}
