"""Predictions and scores of a fine-tuned model: dev evaluation during fine-tuning, and `bertkit predict` /
`bertkit evaluate` on a file with a fine-tuned directory.

    predict_features(model, task, examples, features, pad_token_id, batch_size, device) -> decoded
    predict_file(model_dir, input_path, output_dir, evaluate=False, ...) -> counts (+ metrics)
    write_results(path, results)                         eval_results.json

Design decision: one path from features to predictions (`predict_features`: length-sorted batches of
`bertkit.inference.batching`, then the task's `decode`), so the dev scores of fine-tuning are what
`bertkit evaluate` reproduces from the saved directory. Everything task-specific is a method of the
`bertkit.tasks.task.Task` protocol; nothing here asks which task it holds.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bertkit.atomic import write_text_atomic
from bertkit.inference.batching import model_outputs
from bertkit.model import for_inference
from bertkit.runtime import resolve_device
from bertkit.tasks.finetuned import load_finetuned
from bertkit.tasks.task import Task, warn_skipped

RESULTS_FILE = "eval_results.json"


def predict_features(model: nn.Module, task: Task, examples: Sequence[Any], features: Sequence[dict[str, Any]],
                     pad_token_id: int, batch_size: int, device: torch.device) -> Any:
    """The task's decoded predictions for `features`: the one path behind dev evaluation during fine-tuning
    and `predict` / `evaluate`, so both give the same predictions for the same model and file.

    The forward pass runs in the model's own precision (fp32) with autocast off, also inside the training
    loop's bf16/fp16 autocast: reduced-precision logits would move near-tied answers, and a dev score
    that `bertkit evaluate` cannot reproduce from the saved model is not worth the faster evaluation.
    Gradients are off with `torch.no_grad` (not inference mode): the model trains again afterwards."""
    was_training = model.training
    model.eval()
    with torch.autocast(device.type, enabled=False):
        outputs = model_outputs(model, features, task.output_names, task.token_level_outputs, batch_size,
                                pad_token_id, device, grad_free=torch.no_grad)
    model.train(was_training)
    return task.decode(examples, features, outputs)


def write_results(path: Path, results: dict[str, Any]) -> None:
    write_text_atomic(path, json.dumps(results, indent=2, sort_keys=True) + "\n")


def predict_file(model_dir: str | Path, input_path: str | Path, output_dir: str | Path, evaluate: bool = False,
                 batch_size: int = 64, device: str = "auto", columns: dict[str, str | None] | None = None,
                 precision: str = "fp32") -> dict[str, Any]:
    """Predict (and with `evaluate`, score) a file with a fine-tuned directory; writes predictions (and
    eval_results.json) into output_dir and returns the counts of examples and skipped records, plus the
    metrics when evaluating. `columns` (text_column, text_pair_column, label_column, id_column) override
    the saved reading settings of a classification model for this file. `precision` is an inference
    precision (`bertkit.model.for_inference`); fp32 reproduces the dev scores of fine-tuning exactly."""
    torch_device = resolve_device(device)
    task, model, tokenizer = load_finetuned(model_dir, torch_device)
    model = for_inference(model, precision, torch_device)
    given = {name: value for name, value in (columns or {}).items() if value is not None}
    if given:
        task = task.with_columns(**given)
    examples, skipped = task.read(input_path, labelled=evaluate)
    warn_skipped(input_path, examples, skipped)
    features = task.features(examples, tokenizer)
    decoded = predict_features(model, task, examples, features, tokenizer.pad_token_id, batch_size, torch_device)
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    task.write_predictions(examples, decoded, output_dir, "")
    counts = {"examples": len(examples), "skipped": len(skipped), "truncated": task.last_truncated}
    if not evaluate:
        return counts
    metrics = {**task.score(examples, decoded), **counts}
    write_results(output_dir / RESULTS_FILE, metrics)
    return metrics
