"""Fine-tuning random initialisation beside a pre-trained model and keeping the better (`finetune
--compare-random-init`): where a short pre-training was measured to lose to random initialisation on long inputs,
a run that compares both cannot end below random initialisation on dev.

    keep_better_initialisation(output, metric, pretrained, random_init, decision) -> results   OUTPUT/best, report
    restore_pretrained(output)                          OUTPUT/best the pre-trained model's again (no comparison now)
    INITIALISATION_FILE                                                  OUTPUT/best/initialisation.json: the report

The run itself is `bertkit.workflows.finetune`'s: the pre-trained model's seeds as always (OUTPUT/seed-N), then the
same architecture from random initialisation with the same seeds and settings in OUTPUT/random-init (an ordinary
fine-tuning run directory), the learning rate `auto` resolved for each as its own rule says.

Design decision: the initialisation whose seeds score higher on the first dev set, in the mean, is kept (a tie
keeps the pre-trained model): a choice between two configurations is a choice between their means, and within
the kept one its best seed is OUTPUT/best as in any run. The other's best is never deleted: random
initialisation's stays in OUTPUT/random-init/best, a pre-trained model set aside goes to OUTPUT/pretrained-best
(with its dev predictions). Every step is idempotent and the kept choice is written into OUTPUT/best, so a run
killed half-way, or resumed with more seeds that change the choice, repairs itself.
"""

from __future__ import annotations

import json
import logging
import shutil
import statistics
from pathlib import Path
from typing import Any

from bertkit.io.atomic import replace_directory, write_text_atomic
from bertkit.io.jsonfile import read_json_object
from bertkit.workflows.predict import RESULTS_FILE, write_results
from bertkit.workflows.significance import compare_seeds

log = logging.getLogger(__name__)

RANDOM_INIT_DIRECTORY = "random-init"
"""OUTPUT/random-init: the fine-tuning run from random initialisation."""
PRETRAINED_ASIDE = "pretrained-best"
"""OUTPUT/pretrained-best: the pre-trained model's best, set aside when random initialisation is kept."""
STAGED = (".best.staged", f".{PRETRAINED_ASIDE}.staged")
"""Copies being made, published by a rename (a killed run leaves them; the next one starts them again)."""
INITIALISATION_FILE = "initialisation.json"
"""In OUTPUT/best: the comparison, and which initialisation the model is."""
PRETRAINED, RANDOM = "pre-trained", "random initialisation"


def keep_better_initialisation(output: Path, metric: str, pretrained: dict[str, Any], random_init: dict[str, Any],
                               decision: dict[str, Any]) -> dict[str, Any]:
    """Compare the two runs' results (`train_seeds`'s) on `metric`, make the better one's best OUTPUT/best, and
    return (and write as OUTPUT/eval_results.json) the kept run's results with the comparison under
    "random_init": both sides' scores by seed and their means, the difference (random - pre-trained) with Welch's p,
    which was kept, and where the other's best model is."""
    ours = {seed: scores[metric] for seed, scores in pretrained["seeds"].items()}
    theirs = {seed: scores[metric] for seed, scores in random_init["seeds"].items()}
    comparison = compare_seeds(list(theirs.values()), list(ours.values()))
    kept = RANDOM if comparison.difference > 0 else PRETRAINED
    report = {**decision, "metric": metric, "kept": kept,
              PRETRAINED: {"mean": statistics.fmean(ours.values()), "seeds": ours},
              RANDOM: {"mean": statistics.fmean(theirs.values()), "seeds": theirs},
              "difference": comparison.difference, "p_value": comparison.p_value, "note": comparison.note,
              "other": _other(kept),
              "other_model": str(output / (PRETRAINED_ASIDE if kept == RANDOM else f"{RANDOM_INIT_DIRECTORY}/best"))}
    _keep(output, kept == RANDOM, report)
    log.info("kept %s: dev %s mean %.4f against %.4f (%s), random - pre-trained %+.4f; %s", kept, metric,
             report[kept]["mean"], report[_other(kept)]["mean"], _other(kept), comparison.difference,
             comparison.note)
    results = {**pretrained, **random_init} if kept == RANDOM else dict(pretrained)
    results["random_init"] = report
    write_results(output / RESULTS_FILE, results)
    return results


def _other(kept: str) -> str:
    return PRETRAINED if kept == RANDOM else RANDOM


def _keep(output: Path, random_kept: bool, report: dict[str, Any]) -> None:
    """OUTPUT/best (and OUTPUT's dev predictions) made the kept initialisation's, the other kept beside it."""
    best, aside = output / "best", output / PRETRAINED_ASIDE
    marker = read_json_object(best / INITIALISATION_FILE, missing={}, damaged={})
    holds_random = marker.get("kept") == RANDOM
    if random_kept:
        if best.is_dir() and not holds_random:  # the pre-trained model's best: set it aside with its predictions
            shutil.rmtree(aside, ignore_errors=True)
            staged = output / STAGED[1]
            shutil.rmtree(staged, ignore_errors=True)
            shutil.copytree(best, staged)
            for path in _predictions(output):
                shutil.copyfile(path, staged / path.name)
            replace_directory(staged, aside)
        _install(output / RANDOM_INIT_DIRECTORY, output, report)
    else:
        restore_pretrained(output)
        if best.is_dir():
            write_text_atomic(best / INITIALISATION_FILE, json.dumps(report, indent=2) + "\n")


def restore_pretrained(output: Path) -> None:
    """Make OUTPUT/best the pre-trained model's again where an earlier run kept random initialisation there (its
    best set aside in OUTPUT/pretrained-best): for a choice that now keeps the pre-trained model, and for a resumed
    run that no longer compares, whose results are the pre-trained model's. An aside no longer the pre-trained
    best (a resumed seed promoted a better one into OUTPUT/best) is dropped."""
    best, aside = output / "best", output / PRETRAINED_ASIDE
    marker = read_json_object(best / INITIALISATION_FILE, missing={}, damaged={})
    if marker.get("kept") == RANDOM and aside.is_dir():
        _install(aside, output, None)
    shutil.rmtree(aside, ignore_errors=True)
    (best / INITIALISATION_FILE).unlink(missing_ok=True)  # the choice that wrote it is no longer this run's


def _install(run: Path, output: Path, report: dict[str, Any] | None) -> None:
    """Copy `run`'s best model and dev predictions to OUTPUT/best and OUTPUT, the report (if any) written into the
    copy."""
    staged = output / STAGED[0]
    shutil.rmtree(staged, ignore_errors=True)
    shutil.copytree(run / "best" if (run / "best").is_dir() else run, staged,
                    ignore=shutil.ignore_patterns("*predictions*", "*null_odds.json"))
    (staged / INITIALISATION_FILE).unlink(missing_ok=True)
    if report is not None:
        write_text_atomic(staged / INITIALISATION_FILE, json.dumps(report, indent=2) + "\n")
    replace_directory(staged, output / "best")
    for path in _predictions(run):
        shutil.copyfile(path, output / path.name)


def _predictions(directory: Path) -> list[Path]:
    """The dev prediction files a fine-tuning run keeps at its top level (`run_output._promote`'s)."""
    return [path for path in directory.iterdir()
            if path.is_file() and ("predictions" in path.name or path.name.endswith("null_odds.json"))]
