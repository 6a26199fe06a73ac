"""The settings of the commands that run a trained model over files: `bertkit extract`, `export onnx`,
`predict` and `evaluate`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertkit.settings.fields import DeviceChoice, InferencePrecision, Settings, TorchThreads, sequence_length_field
from bertkit.settings.tasks import LongDocumentSettings

# --- inference (bertkit extract, export onnx, predict, evaluate) ---------------------------------------

POOLINGS = ("auto", "cls", "mean", "max", "mean_sqrt_len_tokens")
"""How `bertkit extract` pools .npy vectors: auto, or a mode of bertkit.inference.pooling.POOLINGS."""
QUANTIZATIONS = ("int8",)
"""The values of `bertkit export onnx --quantize` (onnxruntime dynamic quantization)."""


@dataclass
class ExtractSettings(InferencePrecision, TorchThreads):
    """What `bertkit extract` reads and writes, and how (bertkit.workflows.extract.extract_features)."""

    model: Path = dataclasses.field(metadata={"path": "any"})  # checked by check_model_directory
    """Checkpoint directory (config.json, model.safetensors, vocab.txt); any head; a sentence-transformers
    directory brings its own pooling."""
    input: Path = dataclasses.field(metadata={"path": "any"})
    """UTF-8 text, one input per line ('text_a ||| text_b' for a pair), or a Parquet file or `datasets`
    save_to_disk directory, one input per row (--text-column, --text-pair-column)."""
    output: Path = dataclasses.field(metadata={"path": "file"})
    """*.jsonl: per-token layer values; *.npy: one pooled vector per line (the extension picks the format)."""
    tokenizer: Path | None = dataclasses.field(default=None, metadata={"path": "any", "exists": True})
    """Directory with vocab.txt (or the file); unset: the --model directory."""
    layers: str | None = None
    """Encoder layers to output, comma-separated, -1 = last (as extract_features.py); unset: -1,-2,-3,-4 for
    .jsonl (all of a model with fewer than four layers), -1 for .npy."""
    pooling: str | None = dataclasses.field(default=None, metadata={"choices": POOLINGS})
    """How .npy vectors pool the tokens (layers concatenated); auto (unset): a sentence-transformers
    directory's pooling, else [CLS]."""
    normalize: bool | None = None
    """Unit-length .npy vectors; unset: as the sentence-transformers directory says, else no."""
    max_seq_length: int | None = sequence_length_field(None)
    """Longest input in tokens, specials included; longer lines are truncated (counted); at most the model's
    max_position_embeddings (more is refused); unset: the sentence-transformers directory's, else 128."""
    batch_size: int = dataclasses.field(default=32, metadata={"min": 1})
    """Lines per forward pass."""
    text_column: str = "text"
    """Parquet/`datasets` input: the column of the text."""
    text_pair_column: str | None = None
    """Parquet/`datasets` input: the column of the second text of a pair; unset: single texts."""
    overwrite: bool = False
    """Replace an existing --output file (otherwise it is refused, as fine-tuning refuses a used --output)."""


@dataclass
class ExportSettings(Settings):
    """What `bertkit export onnx` exports and checks (bertkit.export.onnx.export_onnx)."""

    model: Path = dataclasses.field(metadata={"path": "any"})  # checked by check_model_directory
    """Checkpoint directory; its config.json architectures entry picks the head and outputs."""
    output: Path = dataclasses.field(metadata={"path": "any"})
    """A directory to write model.onnx, config.json (with the label map), the tokenizer files and
    bertkit_task.json into (what onnxruntime, optimum and transformers' AutoTokenizer load); a path ending
    in .onnx: that file alone."""
    quantize: str | None = dataclasses.field(default=None, metadata={"choices": QUANTIZATIONS})
    """Dynamic int8 quantization (onnxruntime); prints the measured output change."""
    sample: Path | None = dataclasses.field(default=None, metadata={"path": "file", "exists": True})
    """Text file (one input per line) to check outputs on; unset: built-in sentences."""
    opset: int = dataclasses.field(default=17, metadata={"min": 14})
    """ONNX opset version."""
    optimize: bool = False
    """Write ONNX Runtime's fused BERT graph (Attention, SkipLayerNormalization, ...; runs in onnxruntime
    only), checked against PyTorch; prints the fused-operator counts."""


@dataclass
class PredictSettings(LongDocumentSettings, InferencePrecision, DeviceChoice, TorchThreads):
    """A fine-tuned directory on a file: `bertkit predict` / `bertkit evaluate`
    (bertkit.workflows.predict.predict_file)."""

    model: str = dataclasses.field(metadata={"path": "dir"})
    """Fine-tuned directory (OUTPUT/best of `bertkit finetune`)."""
    input: str = dataclasses.field(metadata={"path": "any"})
    """Classification: CSV/TSV with a header row, JSONL, Parquet or a `datasets` save_to_disk directory (or
    the GLUE layout it was trained on); tagging: CoNLL, or JSONL/Parquet/`datasets` with token and tag lists;
    SQuAD JSON, or the `datasets` squad layout as JSONL/Parquet/`datasets`; SWAG CSV, JSONL, or either
    layout as Parquet/`datasets` (multiple choice)."""
    output: str = dataclasses.field(metadata={"path": "dir"})
    """Directory for the results."""
    text_column: str | None = None
    """Classification: column/key of the text; unset: the one the model was fine-tuned with."""
    text_pair_column: str | None = None
    """Classification of pairs: column/key of the second text; unset: as fine-tuned."""
    id_column: str | None = None
    """Classification: column/key whose value identifies each row in the predictions; unset: a column named
    id if there is one, else file:line."""
    label_column: str | None = None
    """Classification: column/key of the gold label; unset: the one the model was fine-tuned with."""
    batch_size: int = dataclasses.field(default=64, metadata={"min": 1})
    """Inference batch size."""
    evaluate: bool = False
    """Score the predictions against the file's labels too (eval_results.json)."""
    header: bool | None = None
    """Classification, CSV/TSV: whether the first row names the columns (--no-header: the column flags are
    numbers, 0 the first); unset: as the model was fine-tuned."""
    tokens_column: str | None = None
    """Tagging, JSONL/Parquet/`datasets` input: column/key of the tokens; unset: as fine-tuned."""
    tags_column: str | None = None
    """Tagging, JSONL/Parquet/`datasets` input: column/key of the gold tags; unset: as fine-tuned."""
    overwrite: bool = False
    """Replace the results of an earlier predict/evaluate in a non-empty --output (otherwise it is refused, as
    fine-tuning refuses a used --output)."""


    def columns(self) -> dict[str, Any]:
        """The reading settings given for this file (they override the fine-tuned model's saved ones)."""
        names = ("text_column", "text_pair_column", "label_column", "id_column", "header", "tokens_column",
                 "tags_column")
        return {**{name: getattr(self, name) for name in names if getattr(self, name) is not None},
                **self.long_document_choices()}
