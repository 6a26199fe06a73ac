"""ONNX export of any bertkit head, checked against onnxruntime, optionally fused by ONNX Runtime's BERT
optimizer and dynamically quantized to int8, written as a directory that deploys on its own.

`export_onnx(ExportSettings(model_dir, output))` writes an ONNX graph with inputs `input_ids`, `token_type_ids`,
`attention_mask` (int64, dynamic batch and sequence axes; multiple choice adds a dynamic choices axis)
and the head's outputs under their Hugging Face names (`heads()`: the encoder's and the pre-training heads', and
each task kind's as its class declares them, `bertkit.tasks.kinds.TASK_CLASSES`). `output` is a directory
(model.onnx beside config.json with the label map, the tokenizer files and bertkit_task.json:
bertkit.export.directory) or,
when it ends in .onnx, that file alone (the graph only, as earlier versions wrote); an export that fails
leaves no directory it created. It then runs the graph in
onnxruntime on a sample batch of a *different* shape than the one traced and reports the largest difference
from PyTorch's padding-free model. `optimize=True` writes ONNX Runtime's fused graph instead
(bertkit.export.fusion) and reports its fused operators and its own difference from PyTorch.
`quantize="int8"` applies onnxruntime's dynamic quantization (int8 weights, activations quantized on the
fly) and measures what it changes on the sample: the largest output difference and how often the top-1
prediction (argmax of the logits) stays the same.

Design decision: the TorchScript-based exporter (`dynamo=False`): in torch 2.13 the default
torch.export-based exporter needs the `onnxscript` package, which bertkit does not depend on. The
graph is traced with the padded layout (`attention = PaddedSDPA()`), since the padding-free path's
data-dependent gather sizes would be frozen by tracing, and with the encoder in the form ONNX Runtime's
BERT fusions recognise (`export.fusion.fusable_encoder`: separate q/k/v projections, explicit masked
softmax; same numbers), so the plain graph is fusable by users' own optimizers too; the trace batch is
padded so the masked-attention branch is the one recorded. A feature-based fine-tuned directory
(frozen encoder + feature_head.safetensors) is exported whole, encoder and head: it answers as its task's
model does (e.g. `logits` of BertForSequenceClassification), so its graph has that model's outputs.

References: PyTorch `torch.onnx.export`; onnxruntime `quantization.quantize_dynamic`
(Zafrir et al. 2019, "Q8BERT", for int8 BERT inference); onnxruntime.transformers.optimizer.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import numpy as np
import torch
from torch import nn

from bertkit.config import BertConfig, check_model_directory
from bertkit.data.text_inputs import iter_lines, read_lines
from bertkit.errors import BertkitError
from bertkit.export.directory import GRAPH_FILE, check_output_directory, exported, write_deploy_files
from bertkit.export.fusion import OPT_LEVEL, fusable_encoder, optimize_graph
from bertkit.inference.batching import pad_batch
from bertkit.io.atomic import (
    TEMP_SUFFIX,
    check_outside,
    check_writable,
    failed_write_advice,
    fsync_path,
    replace_directory,
)
from bertkit.io.columnar import is_table_input
from bertkit.model import MODEL_CLASSES, BertModel
from bertkit.model.attention import PaddedSDPA
from bertkit.model.feature_based import FeatureBasedModel
from bertkit.settings import QUANTIZATIONS, ExportSettings
from bertkit.tasks.finetuned import TASK_FILE, load_finetuned, read_task_file
from bertkit.tasks.kinds import TASK_CLASSES
from bertkit.tokenizer import WordPieceTokenizer, check_model_vocabulary

INPUT_NAMES = ("input_ids", "token_type_ids", "attention_mask")


@dataclass(frozen=True)
class Head:
    """What a head's graph takes and gives: its outputs (Hugging Face names), those with a sequence axis, and the
    axes of its inputs (the outputs without a sequence axis keep the others: batch, and multiple choice's choices)."""

    outputs: tuple[str, ...]
    token_level: tuple[str, ...] = ()
    input_axes: tuple[str, ...] = ("batch", "sequence")


def heads() -> dict[str, Head]:
    """Architecture (config.json's `architectures`) -> its `Head`: the heads no task kind trains, then each
    kind's (the first kind of a head class decides, as `kind_of_architecture` does)."""
    found = {"BertModel": Head(("last_hidden_state", "pooler_output"), ("last_hidden_state",)),
             "BertForPreTraining": Head(("prediction_logits", "seq_relationship_logits"), ("prediction_logits",)),
             "BertForMaskedLM": Head(("logits",), ("logits",))}
    for cls in TASK_CLASSES.values():
        found.setdefault(cls.model_class.__name__, Head(cls.output_names, cls.token_level_outputs, cls.input_axes))
    return found


log = logging.getLogger(__name__)

SAMPLE_TEXTS = (
    "The quick brown fox jumps over the lazy dog.",
    "BERT is pre-trained with a masked language model and next sentence prediction.",
    "Paris is the capital of France.",
    "Where did the cat sit? It sat on the mat near the door.",
    "A short one.",
    "Fine-tuning adds one output layer and trains all parameters end to end on the task.",
)
MAX_SAMPLE_TEXTS = 256
"""Most --sample lines checked: they run as one batch through PyTorch and onnxruntime (and int8's calibration)."""


@dataclass
class ExportReport:
    """What was written and how far onnxruntime's outputs are from PyTorch's on the sample batch."""

    path: Path
    architecture: str
    outputs: tuple[str, ...]
    max_abs_diff: float
    """fp32 ONNX vs PyTorch, largest |difference| over all outputs at real positions."""
    size_bytes: int
    sample_size: int
    quantized: dict[str, float] = field(default_factory=dict)
    """int8 only: max_abs_diff vs fp32 (the optimized graph with --optimize), top1_agreement (share of equal
    argmax), fp32_size_bytes."""
    fused: dict[str, int] = field(default_factory=dict)
    """--optimize only: count of each fused operator in the ONNX Runtime-optimized graph (export.fusion.FUSED_OPS)."""
    optimized_max_abs_diff: float | None = None
    """--optimize only: the optimized fp32 graph vs PyTorch, as max_abs_diff."""
    files: list[str] = field(default_factory=list)
    """Directory output only: the files written into it."""

    def lines(self) -> list[str]:
        weights = "int8 (dynamic quantization)" if self.quantized else "fp32"
        graph = "ONNX Runtime-optimized, " if self.fused else ""
        lines = [f"wrote {self.path} ({graph}{weights}, {self.architecture}: {', '.join(self.outputs)}; "
                 f"{self.size_bytes / 1e6:.2f} MB)",
                 f"onnxruntime vs PyTorch (fp32): max |diff| = {self.max_abs_diff:.2e}"]
        if self.fused:
            counts = ", ".join(f"{op} {n}" for op, n in self.fused.items() if n)
            lines.append(f"fused by onnxruntime.transformers.optimizer (model_type bert, opt_level {OPT_LEVEL}): "
                         f"{counts or 'nothing'}; optimized vs PyTorch (fp32): max |diff| = "
                         f"{self.optimized_max_abs_diff:.2e}")
        if self.quantized:
            q = self.quantized
            top1 = (f"top-1 agreement = {q['top1_agreement']:.2%} over {int(q['positions'])} predictions"
                    if q["positions"] else "no top-1 prediction in these outputs")
            lines.append(f"int8 dynamic quantization: size {q['fp32_size_bytes'] / 1e6:.2f} MB -> "
                         f"{self.size_bytes / 1e6:.2f} MB; outputs vs fp32 on {self.sample_size} sample texts: "
                         f"max |diff| = {q['max_abs_diff']:.3e}, {top1}")
        if self.files:
            lines.append(f"directory {self.path.parent}: {', '.join(self.files)} (loads with onnxruntime + "
                         "transformers.AutoTokenizer or optimum's ORTModel)")
        elif self.path.suffix.lower() == ".onnx":
            lines.append("(the graph alone: give --output a directory to write the tokenizer and config.json "
                         "beside it)")
        return lines


class _TupleOutputs(nn.Module):
    """The model with positional inputs and a tuple of named outputs (what the ONNX exporter takes)."""

    def __init__(self, model: nn.Module, names: tuple[str, ...]) -> None:
        super().__init__()
        self.model, self.names = model, names

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                attention_mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = self.model(input_ids, token_type_ids, attention_mask)
        return tuple(getattr(out, name) for name in self.names)


def export_onnx(settings: ExportSettings) -> ExportReport:
    """Export the directory's head to `settings.output` (a directory, or a .onnx file: the graph alone),
    checked on the lines of `settings.sample` (else SAMPLE_TEXTS); see the module docstring."""
    if settings.quantize is not None and settings.quantize not in QUANTIZATIONS:
        raise BertkitError(f"--quantize {settings.quantize!r}: supported: {', '.join(QUANTIZATIONS)}")
    model_dir, output = check_model_directory(settings.model), Path(settings.output)
    directory = output.suffix.lower() != ".onnx"
    check_writable(output, "--output", directory=directory)
    if directory:
        check_output_directory(output, model_dir)
        check_outside(output, "--model", model_dir)  # e.g. a sentence-transformers directory's 0_BERT/
        _check_replaceable(output)
    in_place = directory and (output.is_dir() or output.is_symlink())  # '.', a mount, a link: written into
    home = output if in_place else output.parent
    staged = home / (f".export.{os.getpid()}{TEMP_SUFFIX}" if in_place else
                     f".{output.name}.{os.getpid()}-export{TEMP_SUFFIX}")
    _remove_stale(home, output.name, in_place)
    try:
        with _removed_on_failure(output.parent):
            try:
                report = _export(settings, model_dir, staged, staged / GRAPH_FILE if directory else staged)
                if in_place:
                    _move_into(staged, output)
                elif directory:
                    replace_directory(staged, output)
                else:
                    fsync_path(staged)
                    os.replace(staged, output)
                    fsync_path(output.parent)
            finally:
                shutil.rmtree(staged, ignore_errors=True) if staged.is_dir() else staged.unlink(missing_ok=True)
    except OSError as exc:  # a disk that filled while writing
        raise BertkitError(f"--output {output}: cannot write it ({exc.strerror}); "
                           f"{failed_write_advice(exc, home)}") from None
    report.path = output / GRAPH_FILE if directory else output
    return report


def _remove_stale(home: Path, name: str, in_place: bool) -> None:
    """Remove what an export killed outright left in `home` for this output (its own temp names only: another
    output's, e.g. `name.v2`'s, are not this one's)."""
    pattern = re.compile(r"\.export\.\d+" if in_place else rf"\.{re.escape(name)}\.\d+-export")
    for stale in home.glob(f".*{TEMP_SUFFIX}"):
        if pattern.fullmatch(stale.name.removesuffix(TEMP_SUFFIX)):
            shutil.rmtree(stale) if stale.is_dir() else stale.unlink()


def _move_into(staged: Path, output: Path) -> None:
    """Put the staged export's files into an existing --output (a link, a mount or '.' cannot be renamed onto): each
    by a rename, the graph last, then the files of an earlier export this one did not write removed. A kill midway
    leaves each file whole, old or new."""
    names = sorted((p.name for p in staged.iterdir()), key=lambda name: name == GRAPH_FILE)
    for name in names:
        target = output / name
        if (staged / name).is_dir():
            replace_directory(staged / name, target)  # a sentence-transformers module folder
        else:
            os.replace(staged / name, target)
    for earlier in output.iterdir():
        if exported(earlier.name) and earlier.name not in names:
            shutil.rmtree(earlier) if earlier.is_dir() else earlier.unlink()
    fsync_path(output)


def _check_replaceable(output: Path) -> None:
    """Refuse to replace an --output directory that holds files no export writes (the user's own)."""
    if not output.is_dir():
        return
    foreign = sorted(p.name for p in output.iterdir() if not exported(p.name)
                     and not re.fullmatch(rf"\.export\.\d+{re.escape(TEMP_SUFFIX)}", p.name))  # a killed export's
    if foreign:
        raise BertkitError(f"--output {output} holds files an export does not write ({', '.join(foreign[:5])}); "
                           "export replaces what an earlier export wrote there, so give a new directory or move them")


@contextlib.contextmanager
def _removed_on_failure(directory: Path) -> Iterator[None]:
    """Remove what of `directory` did not exist before, should the export fail (nothing half-written stays)."""
    missing = [d for d in (directory, *directory.parents) if not d.exists()]  # nearest first
    try:
        yield
    except BaseException:
        if missing:
            shutil.rmtree(missing[-1], ignore_errors=True)
        raise


def _export(settings: ExportSettings, model_dir: Path, output: Path, graph: Path) -> ExportReport:
    quantize, opset, directory = settings.quantize, settings.opset, output != graph
    model, architecture, tokenizer = _load(model_dir)
    encoder = model if isinstance(model, BertModel) else cast(BertModel, model.get_submodule("bert"))
    head = heads()[architecture]
    names = head.outputs
    if isinstance(model, BertModel) and model.pooler is None:
        names = names[:1]
    texts = list(SAMPLE_TEXTS) if settings.sample is None else sample_texts(Path(settings.sample))
    longest = min(128, encoder.config.max_position_embeddings)  # a sample line of any length fits the model
    batch = sample_batch(tokenizer, texts, architecture, max_length=longest)  # another shape than the traced one
    with torch.inference_mode():  # the model as bertkit runs it (padding-free), before the export transform
        expected = [t.float().numpy() for t in _TupleOutputs(model, names).eval()(*batch.values())]
    encoder.attention = PaddedSDPA()  # the padded layout, which FusableLayer reads
    fusable_encoder(encoder)
    wrapper = _TupleOutputs(model, names).eval()  # the exporter restores the mode it finds, so set it here
    graph.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=graph.parent, prefix=f".{graph.name}.", suffix=TEMP_SUFFIX))
    try:
        fp32_path = graph if quantize is None and not settings.optimize else work / "fp32.onnx"
        _trace(wrapper, sample_batch(tokenizer, texts[:2], architecture, pad_to_length=True, max_length=longest),
               fp32_path, head, opset)
        fp32 = run_onnx(fp32_path, batch)
        mask = batch["attention_mask"].bool().numpy()
        shown = f"feature-based {architecture}" if isinstance(model, FeatureBasedModel) else architecture
        report = ExportReport(graph, shown, names, _max_diff(expected, fp32, mask), fp32_path.stat().st_size,
                              len(texts))
        reference_path, reference = fp32_path, fp32
        if settings.optimize:
            optimized_path = graph if quantize is None else work / "optimized.onnx"
            with _root_logger_quiet():
                report.fused = optimize_graph(fp32_path, optimized_path, encoder.config)
            reference_path, reference = optimized_path, run_onnx(optimized_path, batch)
            report.optimized_max_abs_diff = _max_diff(expected, reference, mask)
            report.size_bytes = optimized_path.stat().st_size
        if quantize == "int8":
            report.quantized = _quantize(reference_path, graph, batch, reference, mask, names)
            report.size_bytes = graph.stat().st_size
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if directory:
        report.files = [GRAPH_FILE, *write_deploy_files(output, model_dir, tokenizer, architecture)]
    return report


def sample_texts(path: Path) -> list[str]:
    """--sample's texts: its first MAX_SAMPLE_TEXTS lines with text (one batch through PyTorch and onnxruntime: the
    file is read no further), what was left out said in the log; a file without text is refused."""
    if is_table_input(path):
        return [a for a, _ in read_lines(path, "--sample", limit=MAX_SAMPLE_TEXTS)]
    texts: list[str] = []
    blank = pairs = 0
    for _, text, pair in iter_lines(path, "--sample"):
        if not text:
            blank += 1
            continue
        pairs += pair is not None
        texts.append(text)
        if len(texts) == MAX_SAMPLE_TEXTS:
            log.info("--sample %s: checking on its first %d texts (read no further)", path, MAX_SAMPLE_TEXTS)
            break
    if blank or pairs:
        log.info("--sample %s: %d blank line(s) skipped; the second text of %d 'a ||| b' line(s) not used (the check "
                 "reads one text an input)", path, blank, pairs)
    if not texts:
        raise BertkitError(f"--sample {path}: no text in it; write one text per line")
    log.info("--sample %s: %d text(s) checked", path, len(texts))
    return texts


def _load(model_dir: Path) -> tuple[nn.Module, str, WordPieceTokenizer]:
    """(model in eval mode, the architecture whose outputs it has, tokenizer) of a checkpoint directory."""
    task_file = read_task_file(model_dir)
    if task_file is not None and task_file.get("feature_layers"):
        task, model, tokenizer = load_finetuned(model_dir)
        return model, task.model_class.__name__, tokenizer
    config = BertConfig.from_json_file(model_dir / "config.json")
    architecture = (config.architectures or ["BertModel"])[0]
    if architecture not in heads():
        raise BertkitError(f"{model_dir}/config.json: cannot export architecture {architecture!r}; "
                           f"supported: {', '.join(heads())}")
    kind = task_file and task_file.get("task")
    if kind in TASK_CLASSES and TASK_CLASSES[kind].model_class.__name__ != architecture:
        raise BertkitError(f"{model_dir}: config.json's architectures says {architecture}, {TASK_FILE} a {kind} "
                           f"model ({TASK_CLASSES[kind].model_class.__name__}); the deploy directory would contradict "
                           "itself: copy the directory fine-tuning wrote again, or fix architectures in config.json")
    tokenizer = WordPieceTokenizer.from_pretrained(model_dir)
    check_model_vocabulary(tokenizer, config.vocab_size, model_dir)
    model = MODEL_CLASSES[architecture].from_pretrained(model_dir).eval()
    fresh = [k for k in getattr(model, "newly_initialized", []) if ".pooler." not in f".{k}"]
    if fresh:  # exported, they would be random numbers in the graph (predict refuses such a directory too)
        raise BertkitError(f"{model_dir}: the weights have none for {', '.join(fresh[:4])}, which {architecture} "
                           "needs; copy the whole model directory, or set config.json's architectures to the head "
                           "the weights have (BertModel for the encoder alone)")
    return model, architecture, tokenizer


def sample_batch(tokenizer: WordPieceTokenizer, texts: list[str], architecture: str,
                 pad_to_length: bool = False, max_length: int = 128) -> dict[str, torch.Tensor]:
    """A padded (B, T) batch of the texts, each cut to `max_length` tokens ((1, B, T) for a head with a choices
    axis: the texts as the choices); `pad_to_length` adds one row two tokens longer (within `max_length`), so the
    others are padded and a trace records the masked attention path."""
    encodings = tokenizer.encode_batch(texts, max_length=max_length - 2 if pad_to_length else max_length)
    features = [{"input_ids": e.input_ids, "token_type_ids": e.token_type_ids, "attention_mask": e.attention_mask}
                for e in encodings]
    if pad_to_length:
        features.append({key: [1] * (max(len(e) for e in encodings) + 2) for key in INPUT_NAMES})
        features[-1]["token_type_ids"] = [0] * len(features[-1]["input_ids"])
    batch = pad_batch(features, tokenizer.pad_token_id)
    if "choices" in heads()[architecture].input_axes:
        batch = {k: v.unsqueeze(0) for k, v in batch.items()}
    return batch


def _trace(wrapper: _TupleOutputs, batch: dict[str, torch.Tensor], path: Path, head: Head, opset: int) -> None:
    per_example = tuple(axis for axis in head.input_axes if axis != "sequence")  # e.g. (B, C) choice scores
    dynamic = {name: dict(enumerate(head.input_axes)) for name in INPUT_NAMES}
    for name in wrapper.names:
        dynamic[name] = dict(enumerate(head.input_axes if name in head.token_level else per_example))
    with warnings.catch_warnings(), torch.inference_mode():
        # The tracer warns about the Python branches it freezes (output_hidden_states=False, the padded path).
        warnings.simplefilter("ignore")
        torch.onnx.export(wrapper, tuple(batch.values()), str(path), dynamo=False, input_names=list(INPUT_NAMES),
                          output_names=list(wrapper.names), dynamic_axes=dynamic, opset_version=opset)


def run_onnx(path: Path, batch: dict[str, torch.Tensor]) -> list[np.ndarray]:
    """The graph's outputs on `batch`, computed by onnxruntime on CPU."""
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {name: batch[name].numpy() for name in INPUT_NAMES})


def _real(array: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Values at real positions when the output has the inputs' (B, T) / (1, C, T) leading axes."""
    return array[mask] if array.shape[:mask.ndim] == mask.shape else array


def _max_diff(a: list[np.ndarray], b: list[np.ndarray], mask: np.ndarray) -> float:
    return max(float(np.abs(_real(x, mask) - _real(y, mask)).max()) for x, y in zip(a, b))


@contextlib.contextmanager
def _root_logger_quiet() -> Iterator[None]:
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        yield
    finally:
        root.setLevel(level)


def _quantize(fp32_path: Path, output: Path, batch: dict[str, torch.Tensor], fp32: list[np.ndarray],
              mask: np.ndarray, names: tuple[str, ...]) -> dict[str, float]:
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # onnxruntime logs advice ("consider pre-processing") on the root logger at WARNING for every model;
    # it is about static quantization of vision models, not this, and reads like a problem to users.
    with _root_logger_quiet():
        # The fused graph's contrib ops (Attention, SkipLayerNormalization) have no ONNX shape inference, so
        # the quantizer is told the float type it cannot infer.
        quantize_dynamic(str(fp32_path), str(output), weight_type=QuantType.QInt8,
                         extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    int8 = run_onnx(output, batch)
    agree = total = 0
    for name, x, y in zip(names, fp32, int8):
        if not name.endswith("logits") or x.shape[-1] == 1:  # hidden states and regression have no top-1
            continue
        if x.shape == mask.shape:  # per-position scores (QA start/end): the best real position of each row
            x, y = np.where(mask, x, -np.inf), np.where(mask, y, -np.inf)
        else:
            x, y = _real(x, mask), _real(y, mask)
        agree += int((x.argmax(-1) == y.argmax(-1)).sum())
        total += x.argmax(-1).size
    return {"max_abs_diff": _max_diff(fp32, int8, mask), "top1_agreement": agree / total if total else float("nan"),
            "positions": float(total), "fp32_size_bytes": float(fp32_path.stat().st_size)}
