"""Modules a study script attaches to `bertkit pretrain`'s model, kept beside every checkpoint it saves.

`keep_beside(model, names, filename, script)` binds the model's `save_pretrained` and `load_hf_state_dict` so that
bertkit's own save and load see the plain BertForMaskedLM (the attached modules taken off while they run, so final/
is a directory transformers loads with nothing left over) and the attached modules' weights travel in `filename`
beside it, written atomically. A run then resumes exactly through bertkit's checkpoints, whose record of their files
makes `--resume auto` pass over one that lost `filename`; loading such a directory anyway is a one-line error.
Used by electra_pretrain.py and untied_decoder_pretrain.py.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bertkit.io.atomic import write_file_atomic
from bertkit.model import BertForMaskedLM


@contextlib.contextmanager
def detached(model: nn.Module, names: tuple[str, ...]) -> Iterator[dict[str, nn.Module]]:
    """`model` without the modules `names`; yields them, attached again on leaving."""
    extras = {name: getattr(model, name) for name in names}
    for name in names:
        delattr(model, name)
    try:
        yield extras
    finally:
        for name, module in extras.items():
            setattr(model, name, module)


def keep_beside(model: nn.Module, names: tuple[str, ...], filename: str, script: str) -> None:
    """Save and load `model`'s modules `names` in `filename` beside what bertkit saves (module docstring)."""

    def save_pretrained(path: str | Path, tokenizer: Any = None) -> None:
        with detached(model, names) as extras:
            BertForMaskedLM.save_pretrained(model, path, tokenizer=tokenizer)
        write_file_atomic(Path(path) / filename,
                          lambda target: torch.save({name: module.state_dict() for name, module in extras.items()},
                                                    target))

    def load_hf_state_dict(hf_state: dict[str, torch.Tensor], source: str = "checkpoint") -> None:
        with detached(model, names) as extras:
            BertForMaskedLM.load_hf_state_dict(model, hf_state, source=source)
        saved = Path(source) / filename
        if not saved.is_file():
            raise SystemExit(f"{script}: {source} has no {filename}; resume a run this script saved, or start a new "
                             "one (--overwrite, or another --output)")
        state = torch.load(saved, weights_only=True)
        for name, module in extras.items():
            module.load_state_dict(state[name])

    model.save_pretrained = save_pretrained
    model.load_hf_state_dict = load_hf_state_dict
