"""Predictions and scores of a fine-tuned model: dev evaluation during fine-tuning, and `bertkit predict` /
`bertkit evaluate` on a file with a fine-tuned directory.

    predict_features(model, task, examples, features, pad_token_id, batch_size, device) -> decoded
    predict_file(PredictSettings(model_dir, input_path, output_dir, ...)) -> counts (+ metrics)
    write_results(path, results)                         eval_results.json

Design decision: one path from features to predictions (`predict_features`: length-sorted batches of
`bertkit.inference.batching`, then the task's `decode`), so the dev scores of fine-tuning are what
`bertkit evaluate` reproduces from the saved directory. Everything task-specific is a method of the
`bertkit.tasks.task.Task` protocol; nothing here asks which task it holds. A non-empty --output is refused
before any work unless `--overwrite`, which replaces the results an earlier predict/evaluate wrote there, as
`bertkit finetune` refuses to write over a run.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bertkit.config import BertConfig, check_model_directory
from bertkit.errors import BertkitError
from bertkit.inference.batching import check_finite, model_outputs
from bertkit.inference.smoothquant import int8_smoothing
from bertkit.interop.sentence_transformers import cross_encoder_length
from bertkit.io.atomic import check_writable, write_text_atomic
from bertkit.model import for_inference
from bertkit.runtime.allocator import keep_freed_memory
from bertkit.runtime.device import apply_threads, check_inference_precision, resolve_device
from bertkit.settings import PredictSettings
from bertkit.tasks.finetuned import load_finetuned, load_task, read_task_file, task_of_config
from bertkit.tasks.task import Task, warn_skipped
from bertkit.train.distributed import DistributedContext, all_gather_objects

RESULTS_FILE = "eval_results.json"


def predict_features(model: nn.Module, task: Task, examples: Sequence[Any], features: Sequence[dict[str, Any]],
                     pad_token_id: int, batch_size: int, device: torch.device,
                     ctx: DistributedContext | None = None, model_id: str | None = None) -> Any:
    """The task's decoded predictions for `features`: the one path behind dev evaluation during fine-tuning
    and `predict` / `evaluate`, so both give the same predictions for the same model and file.

    The forward pass runs in the model's own precision (fp32) with autocast off, also inside the training
    loop's bf16/fp16 autocast: reduced-precision logits would move near-tied answers, and a dev score
    that `bertkit evaluate` cannot reproduce from the saved model is not worth the faster evaluation.
    Gradients are off with `torch.no_grad` (not inference mode): the model trains again afterwards.

    Under torchrun (`ctx`), each process runs its contiguous share of the features and the outputs are
    gathered in order, so every process decodes the whole set exactly as one process would. With `model_id`
    (predict, evaluate), NaN or infinite outputs raise ModelFault naming it instead of being decoded; dev
    evaluation during training leaves them to the loop, which refuses a non-finite metric."""
    ctx = ctx or DistributedContext()
    first, last = len(features) * ctx.rank // ctx.world_size, len(features) * (ctx.rank + 1) // ctx.world_size
    was_training = model.training
    model.eval()
    with torch.autocast(device.type, enabled=False):
        outputs = model_outputs(model, features[first:last], task.output_names, task.token_level_outputs,
                                batch_size, pad_token_id, device, grad_free=torch.no_grad)
    model.train(was_training)
    if ctx.distributed:
        shares = all_gather_objects(outputs, ctx)
        outputs = {name: [row for share in shares for row in share[name]] for name in task.output_names}
    if model_id is not None:
        check_finite(outputs, model_id)
    return task.decode(examples, features, outputs)


def write_results(path: Path, results: dict[str, Any]) -> None:
    write_text_atomic(path, json.dumps(results, indent=2, sort_keys=True) + "\n")


def check_output(output: Path, overwrite: bool) -> None:
    """Refuse an --output that is a file, or a directory holding anything unless `overwrite`."""
    if output.exists() and not output.is_dir():
        raise BertkitError(f"--output {output} is a file; give a directory")
    if output.is_dir() and any(output.iterdir()) and not overwrite:
        raise BertkitError(f"--output {output} is not empty; pass --overwrite to replace the results in it, or "
                           "choose another directory")
    check_writable(output, "--output")


def _remove_earlier_results(output: Path) -> None:
    """Delete what an earlier predict/evaluate wrote (eval_results.json, the task's predictions files), so no
    result of another run is left beside this one's; other files stay."""
    for path in output.iterdir():
        if path.is_file() and (path.name == RESULTS_FILE or "predictions" in path.name
                               or path.name.endswith("null_odds.json")):
            path.unlink()


def _task(directory: Path) -> Task:
    """The directory's task: its bertkit_task.json's, or for a model fine-tuned elsewhere its config.json's (with the
    length a CrossEncoder keeps, as serve reads it)."""
    directory = check_model_directory(directory)
    if read_task_file(directory) is not None:
        return load_task(directory)
    positions = BertConfig.from_json_file(directory / "config.json").max_position_embeddings
    return task_of_config(directory, cross_encoder_length(directory, positions))


def predict_file(settings: PredictSettings) -> dict[str, Any]:
    """Predict (and with `settings.evaluate`, score) a file with a fine-tuned directory; writes predictions
    (and eval_results.json) into `settings.output` and returns the counts of examples and skipped records,
    plus the metrics when evaluating. The column settings given override the saved reading settings of a
    classification model for this file. `precision` is an inference precision (`bertkit.model.for_inference`);
    fp32 reproduces the dev scores of fine-tuning exactly."""
    apply_threads(settings.threads)
    torch_device = resolve_device(settings.device)
    check_inference_precision(settings.precision)
    task = _task(Path(settings.model))  # the input is read and checked before the model is loaded and timed
    output_dir = Path(settings.output)
    check_output(output_dir, settings.overwrite)
    if settings.columns():
        task = task.with_columns(**settings.columns())
    input_path, evaluate = settings.input, settings.evaluate
    examples, skipped = task.read(input_path, labelled=evaluate)
    warn_skipped(input_path, examples, skipped)
    keep_freed_memory()  # the process reuses large activations from here on (bertkit.runtime.allocator)
    _, model, tokenizer = load_finetuned(settings.model, torch_device, task=task)
    model = for_inference(model, settings.precision, torch_device,  # int8: with the kept or calibrated scales
                          lambda: int8_smoothing(model, Path(settings.model), settings.calibration, tokenizer,
                                                 task.settings.max_seq_length))
    features = task.features(examples, tokenizer)
    decoded = predict_features(model, task, examples, features, tokenizer.pad_token_id, settings.batch_size,
                               torch_device, model_id=str(settings.model))
    output_dir.mkdir(parents=True, exist_ok=True)
    _remove_earlier_results(output_dir)
    task.write_predictions(examples, decoded, output_dir, "")
    counts = {"examples": len(examples), "skipped": len(skipped), "truncated": task.last_truncated}
    if not evaluate:
        return counts
    metrics = {**task.score(examples, decoded), **counts}
    write_results(output_dir / RESULTS_FILE, metrics)
    return metrics
