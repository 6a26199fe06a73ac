"""What a resumed run may change: one rulebook for pre-training (the checkpoints `fit` writes), fine-tuning and
`bertkit glue` (their run records, finetune_run.json).

Every setting a run records is one of three kinds:

- **exact** (`EXACT`): part of what the run is - its data, model, vocabulary, objective, data order and global
  batch. A resumed run with another value is refused, unless `--allow-change NAME` accepts it: the run then goes
  on from its checkpoint but is no longer the run it continues (said in one line).
- **fixed** (`FIXED`): a change the saved state cannot follow at all, whatever `--allow-change` says: a
  classifier's label set sizes its head, a feature-based head's input is its layers. Refused with that reason.
- **free**: everything else - learning rate, budget (steps, epochs, time), cadence, warmup and schedule, precision,
  how the global batch is split. Applied from the next step and listed in the log: the learning rate is a function
  of the step and the settings, never restored state, so a longer budget or another peak rate takes effect.

Design decision: the rules are data here, and the one comparison (`check_resume`) is the only code that applies
them; `fit` compares its checkpoint's settings with it, fine-tuning and glue their run records, and the
`--allow-change` choices are `EXACT`'s names. No torch import (the CLI reads the choices for --help).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Set
from dataclasses import dataclass
from typing import Any

from bertkit.errors import BertkitError

EXACT: dict[str, str] = {
    "seed": "the initialisation, data order, masks and dropout",
    "shuffle": "the data order",
    "optimizer": "the optimizer state",
    "global_batch_size": "what a step averages over and where the data position is",
    "group_by_length": "the data order",
    "data": "the training examples",
    "held_out": "which instances are held out for evaluation (another count trains on some of them)",
    "model": "the weights being trained",
    "tokenizer": "the token ids",
    "max_seq_length": "the inputs",
    "masked_lm_prob": "the objective",
    "full_length_share": "the inputs' lengths",
    "full_length_placement": "the inputs' lengths",
    "nsp": "the objective",
    "dropout": "the model's regularisation",
    "freeze_encoder": "which weights train",
    "task": "the task's files and columns",
    "distillation": "the teacher, the student and the objective",
}
"""Settings a resumed run shares with its checkpoint unless --allow-change names them: name -> what it decides."""

FIXED: dict[str, str] = {
    "task.task": "another task kind is another head: a checkpoint of one cannot continue as the other",
    "task.labels": "the label set sizes the classifier's head (one output a label): the saved head cannot take "
                   "another",
    "task.tag_scheme": "the tags size the tagger's head",
    "feature_layers": "the feature-based head reads these layers: its input width follows them",
    "feature_combine": "the feature-based head's input width follows how its layers are combined",
}
"""Changes a resumed run refuses whatever --allow-change says: a dotted setting name -> why."""

PRETRAINING_ONLY = ("held_out", "masked_lm_prob", "nsp", "full_length_share", "full_length_placement")
"""EXACT settings only pre-training records: --allow-change refuses them on fine-tuning (they would be ignored)."""

RESUME_EXACT_SETTINGS = tuple(EXACT)
"""The names --allow-change accepts (EXACT's)."""


@dataclass(frozen=True)
class Difference:
    """One recorded value that differs between a run and its resumption."""

    name: str
    """Dotted ("task.labels"): the leaf that differs."""
    then: Any
    now: Any

    @property
    def setting(self) -> str:
        """The top-level setting it belongs to (what --allow-change names)."""
        return self.name.split(".", 1)[0]

    def describe(self, labels: Mapping[str, str] | None = None) -> str:
        """'name (label) was X and is Y now'; `labels` names what a dotted name stands for (a file, say)."""
        label = (labels or {}).get(self.name)
        return f"{self.name}{f' ({label})' if label else ''} was {_short(self.then)} and is {_short(self.now)} now"


def differences(then: Mapping[str, Any], now: Mapping[str, Any]) -> list[Difference]:
    """Every leaf where `now` differs from `then`, among the settings both recorded (a record written before a
    setting existed is not compared on it), nested mappings compared key by key (a key `then` lacks alike)."""
    found: list[Difference] = []
    for name in now:
        if name in then:
            found += _leaves(name, then[name], now[name])
    return found


def _leaves(name: str, then: Any, now: Any) -> list[Difference]:
    if isinstance(then, Mapping) and isinstance(now, Mapping):  # a key only `now` has: recorded since (not compared)
        return [leaf for key in sorted(then) for leaf in _leaves(f"{name}.{key}", then[key], now.get(key))]
    if isinstance(then, list | tuple) and isinstance(now, list | tuple) and len(then) == len(now) \
            and any(isinstance(item, Mapping) for item in then):  # e.g. each dev file's fingerprint
        return [leaf for index, (a, b) in enumerate(zip(then, now)) for leaf in _leaves(f"{name}.{index}", a, b)]
    return [] if _same(then, now) else [Difference(name, then, now)]


def _same(then: Any, now: Any) -> bool:
    """JSON equality (a tuple now equals the list recorded)."""
    return json.loads(json.dumps(then)) == json.loads(json.dumps(now))


def check_resume(then: Mapping[str, Any], now: Mapping[str, Any], allowed: Set[str], *, where: str,
                 exact: Set[str] = frozenset(), labels: Mapping[str, str] | None = None) -> list[Difference]:
    """Every difference between the recorded settings `then` and this run's `now`; a BertkitError for the first
    that the rules refuse: a FIXED one always, an exact one (EXACT, or `exact`: names the caller adds, e.g. its
    data fingerprints) unless `allowed` (--allow-change) names it. `where` names the run in the message,
    `labels` what a dotted name stands for (e.g. "data.train" -> the file)."""
    found = differences(then, now)
    for difference in found:
        fixed = next((why for name, why in FIXED.items()
                      if difference.name == name or difference.name.startswith(name + ".")), None)
        if fixed is not None:
            raise BertkitError(f"--resume {where}: {difference.describe(labels)}; it cannot change on resume "
                               f"({fixed}). Resume with the run's own value, or start a new run (--overwrite, or "
                               "another --output)")
    for difference in found:
        name = difference.setting
        if (name in EXACT or name in exact) and name not in allowed:
            raise BertkitError(f"--resume {where}: {difference.describe(labels)}; a resumed run with another {name} "
                               f"is no longer exact ({name} decides {EXACT.get(name, 'what the run is')}). Resume "
                               f"with the run's own {name}, continue anyway with --allow-change {name}, or start a "
                               "new run (--overwrite, or another --output)")
    return found


def describe_changes(found: list[Difference], labels: Mapping[str, str] | None = None) -> str:
    """'a was 1 and is 2 now; b ...' for a log line."""
    return "; ".join(difference.describe(labels) for difference in found)


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value) if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."
