"""The fine-tuned directory: what `bertkit finetune` writes as OUTPUT/best, and what `bertkit predict` /
`evaluate`, the predictors and the server, and `bertkit info` read.

Layout: a Hugging Face checkpoint (config.json with id2label and architectures, model.safetensors,
vocab.txt, tokenizer_config.json) plus bertkit_task.json, `{"task": kind, **settings}` (the task's
`to_json`). A feature-based model (`bertkit.model.feature_based`) stores its frozen encoder as the
checkpoint, adds `feature_layers` and `feature_combine` to bertkit_task.json and keeps its linear layer
in feature_head.safetensors.

    save_finetuned(model, task, tokenizer, directory)        write (atomically: staged, then renamed)
    load_finetuned(directory, device, task=None, tokenizer_dir=None) -> (task, model, tokenizer)
    read_task_file(directory) -> dict | None                 bertkit_task.json, checked, or None
    load_weights(directory, model_class) -> model            a checkpoint whose head weights must exist

Design decision: the one reader and writer of the format, so fine-tuning, predict, evaluate, serve and
info cannot disagree about it (a feature-based model is served like any other). A directory without
bertkit_task.json (a Hugging Face model) is read with the task its caller builds from config.json.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, cast

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from bertkit.config import BertConfig, check_model_directory
from bertkit.errors import BertkitError
from bertkit.io.atomic import replace_directory, write_file_atomic, write_text_atomic
from bertkit.io.bounded import file_present
from bertkit.io.jsonfile import read_json
from bertkit.model import BertModel
from bertkit.model.feature_based import FeatureBasedModel
from bertkit.model.pretrained import PreTrainedMixin
from bertkit.tasks.kinds import TASK_CLASSES, kind_of_architecture, task_class
from bertkit.tasks.task import Task
from bertkit.tokenizer import WordPieceTokenizer, check_model_vocabulary

TASK_FILE = "bertkit_task.json"
FEATURE_HEAD_FILE = "feature_head.safetensors"
FEATURE_KEYS = ("feature_layers", "feature_combine")  # bertkit_task.json entries of a feature-based model


def feature_based_model(task: Task, bert: BertModel, layers: tuple[int, ...], combine: str,
                        dropout: float) -> FeatureBasedModel:
    """The feature-based model of `task` over the encoder `bert` (frozen by the model)."""
    return FeatureBasedModel(bert, task.feature_head(), layers, combine, dropout)


def save_finetuned(model: nn.Module, task: Task, tokenizer: WordPieceTokenizer, directory: Path) -> None:
    """Write the self-contained fine-tuned directory (replacing an older one only once complete)."""
    staging = directory.with_name(f".{directory.name}.{os.getpid()}.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        _write_finetuned(model, task, tokenizer, staging)
        replace_directory(staging, directory)
    except BaseException:  # a full disk, a signal: no half-written staging directory stays behind
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _write_finetuned(model: nn.Module, task: Task, tokenizer: WordPieceTokenizer, staging: Path) -> None:
    settings = task.to_json()
    if isinstance(model, FeatureBasedModel):
        encoder_config = model.bert.config
        model.bert.config = encoder_config.replace(**task.config_overrides())  # id2label etc. in config.json
        model.bert.save_pretrained(staging, tokenizer=tokenizer)
        model.bert.config = encoder_config
        head = {k: v.contiguous() for k, v in model.head.state_dict().items()}
        write_file_atomic(staging / FEATURE_HEAD_FILE, lambda path: save_file(head, str(path)))
        settings.update(feature_layers=list(model.layers), feature_combine=model.combine)
    else:  # a task model (possibly wrapped, e.g. compiled, which forwards attributes): PreTrainedMixin's API
        cast(PreTrainedMixin, model).save_pretrained(staging, tokenizer=tokenizer)
    write_text_atomic(staging / TASK_FILE, json.dumps(settings, indent=2) + "\n")


def read_task_file(directory: str | Path) -> dict[str, Any] | None:
    """bertkit_task.json as a dict, or None when the directory has none (a model not fine-tuned here)."""
    path = Path(directory) / TASK_FILE
    data = read_json(path, missing=None, fix="re-run fine-tuning or fix the file")
    if data is None:
        return None
    if not isinstance(data, dict) or "task" not in data:
        raise BertkitError(f"{path}: expected a JSON object with a 'task' key ({', '.join(TASK_CLASSES)})")
    return data


def load_finetuned(directory: str | Path, device: torch.device = torch.device("cpu"), task: Task | None = None,
                   tokenizer_dir: str | Path | None = None) -> tuple[Task, nn.Module, WordPieceTokenizer]:
    """(task, model in eval mode on `device`, tokenizer) of a fine-tuned directory. `task` stands in for
    a missing bertkit_task.json (a Hugging Face model); `tokenizer_dir` replaces the directory's vocabulary
    (`check_model_vocabulary` decides whether it fits)."""
    directory = check_model_directory(directory)
    settings = read_task_file(directory)
    if settings is not None or task is None:
        task = load_task(directory)
    features = {key: settings[key] for key in FEATURE_KEYS if key in settings} if settings else {}
    tokenizer = WordPieceTokenizer.from_pretrained(directory if tokenizer_dir is None else tokenizer_dir)
    vocab_size = BertConfig.from_json_file(directory / "config.json").vocab_size
    check_model_vocabulary(tokenizer, vocab_size, directory, tokenizer_dir)  # before the weights are read
    if features.get("feature_layers"):
        model: nn.Module = _load_feature_based(directory, task, tuple(features["feature_layers"]),
                                               features.get("feature_combine", "concat"))
    else:
        model = load_weights(directory, task.model_class)
    return task, model.to(device).eval(), tokenizer


def load_task(directory: str | Path) -> Task:
    """The task of a fine-tuned directory from its bertkit_task.json alone (no weights read): what a command
    needs to read and check its input before it loads the model."""
    directory = check_model_directory(directory)
    settings = read_task_file(directory)
    if settings is None:
        return task_of_config(directory)
    for key in FEATURE_KEYS:
        settings.pop(key, None)
    source = str(directory / TASK_FILE)
    return task_class(settings["task"], source).from_json(settings, source=source)


def task_of_config(directory: Path, max_seq_length: int | None = None) -> Task:
    """The task of a model fine-tuned elsewhere (a transformers directory: no bertkit_task.json) from its config.json:
    the kind whose head its `architectures` names, with its labels and the kind's default settings (windows cut to
    its positions, or `max_seq_length`: a CrossEncoder's); a directory of no task's head is refused, saying what to
    run instead."""
    config = BertConfig.from_json_file(directory / "config.json")
    kind = kind_of_architecture((config.architectures or [""])[0])
    if kind is None:
        raise BertkitError(_no_task_file(directory))
    return TASK_CLASSES[kind].from_config(config, max_seq_length, source=str(directory / "config.json"))


def _no_task_file(directory: Path) -> str:
    """Why a directory without bertkit_task.json has no task, and what to run instead."""
    if file_present(directory / "modules.json"):  # sentence-transformers layout: `finetune embedding` writes it
        return (f"{directory}: a sentence-embedding model (modules.json, no {TASK_FILE}): it has no labels to "
                "predict; embed texts with `bertkit extract --model DIR`, or serve it with `bertkit serve`")
    return (f"{directory}: no {TASK_FILE}; --model must be a directory written by `bertkit finetune "
            f"{'|'.join(TASK_CLASSES)}` (OUTPUT/best)")


def _load_feature_based(directory: Path, task: Task, layers: tuple[int, ...], combine: str) -> FeatureBasedModel:
    head_file = directory / FEATURE_HEAD_FILE
    if not file_present(head_file):
        raise BertkitError(f"{directory}: a feature-based model (feature_layers in {TASK_FILE}) needs its "
                           f"linear layer in {FEATURE_HEAD_FILE}, which is missing; copy the whole directory "
                           "that fine-tuning wrote")
    model = feature_based_model(task, BertModel.from_pretrained(directory), layers, combine, 0.0)
    try:
        model.head.load_state_dict(load_file(str(head_file)))
    except (RuntimeError, OSError) as exc:
        raise BertkitError(f"{head_file}: not the linear layer of this model ({exc})") from None
    return model


def load_weights(directory: str | Path, model_class: type[Any]) -> nn.Module:
    """`model_class.from_pretrained(directory)`, refusing a checkpoint without the head's weights (a
    pre-trained model is not a fine-tuned one; a missing pooler is fine: heads that need it have it)."""
    model = model_class.from_pretrained(directory)
    fresh = [k for k in getattr(model, "newly_initialized", []) if ".pooler." not in f".{k}"]
    if fresh:
        raise BertkitError(f"{directory}: the checkpoint has no weights for {', '.join(fresh[:4])}; "
                           f"it is not a fine-tuned {model_class.__name__} (fine-tune it first)")
    return model
