"""GLUE in one command: every task of a GLUE directory fine-tuned with the paper's recipe, the learning
rate chosen on dev, and one table like the paper's Table 1.

    find_tasks(data, names) -> (tasks, problems)       the usable task folders; one line per unusable one
    run_glue(settings, finetune, progress) -> results       the sweep; OUTPUT/glue_results.json and .md
    markdown_table(results) -> str                     the table of glue_results.md

Design decision: a sweep is nothing but `bertkit.workflows.finetune.run_finetuning` once per (task, learning
rate), each run in its own directory OUTPUT/<task>/lr-<rate> with every seed, so everything a fine-tuning
run promises holds per run (resume mid-seed, the best seed kept as best/, eval_results.json) and this
module only chooses, skips and summarises. A run counts as finished when its eval_results.json holds every
requested seed and its finetune_run.json the same settings; `--resume auto` keeps those and continues
the others from their checkpoints, so an interrupted sweep never starts over. The learning rate of a task
is the one with the best mean over seeds of the task's first metric (the one that also selects each
seed's best epoch), the first in grid order on ties.

The average is the paper's (Table 1, "Average"): the mean of the nine scores MNLI-m, MNLI-mm, QQP F1,
QNLI, SST-2, CoLA (Matthews), STS-B (Spearman), MRPC F1 and RTE, WNLI excluded; computed over those
found when some tasks are missing, and the table says how many. (Devlin et al. report test scores;
these are dev scores.)

References: Devlin et al. (2018), section 4.1, Table 1 and appendix A.3 (batch 32, 3 epochs, learning
rate among 5e-5, 4e-5, 3e-5, 2e-5 on dev); GLUE (Wang et al., 2018) and its download_glue_data.py.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertkit.data.glue import GLUE_TASKS, glue_task
from bertkit.errors import BertkitError
from bertkit.io.atomic import check_writable, write_text_atomic
from bertkit.io.jsonfile import finite_number, read_json_object
from bertkit.runtime.device import apply_threads
from bertkit.settings import FinetuneSettings, GlueSettings
from bertkit.settings.rules import EXACT, FIXED, differences
from bertkit.tasks.kinds import build_task
from bertkit.tasks.metrics import GLUE_METRICS
from bertkit.train.distributed import DistributedContext, barrier, rank0_decides, setup_distributed
from bertkit.workflows.finetune import check_length_fits, run_finetuning, run_settings
from bertkit.workflows.predict import RESULTS_FILE
from bertkit.workflows.run_output import RUN_FILE, upgraded_record
from bertkit.workflows.significance import compare_seeds

log = logging.getLogger(__name__)

SWEEP_FILE = "glue_sweep.json"
"""OUTPUT's marker: the sweep's settings and each run's wall time (what --resume reads back)."""
TABLE_JSON, TABLE_MD = "glue_results.json", "glue_results.md"


@dataclass(frozen=True)
class GlueFolder:
    """A task as download_glue_data.py lays it out, and how the paper's table shows it."""

    key: str
    """bertkit.data.glue.GLUE_TASKS's name (cola, sst2, ...)."""
    folder: str
    """The folder name download_glue_data.py writes."""
    dev_files: tuple[str, ...]
    """Dev files; the first selects the best epoch and the learning rate."""
    columns: tuple[tuple[str, str], ...]
    """(column title, metric in eval_results.json) of the table, in the paper's order."""
    averaged: tuple[str, ...]
    """The metrics that enter the paper's average (WNLI: none)."""


# In the order of the paper's Table 1 (WNLI last: the paper leaves it out).
GLUE_FOLDERS: dict[str, GlueFolder] = {f.key: f for f in (
    GlueFolder("mnli", "MNLI", ("dev_matched.tsv", "dev_mismatched.tsv"),
               (("MNLI-m", "accuracy"), ("MNLI-mm", "dev_mismatched_accuracy")),
               ("accuracy", "dev_mismatched_accuracy")),
    GlueFolder("qqp", "QQP", ("dev.tsv",), (("QQP F1", "f1"), ("QQP acc", "accuracy")), ("f1",)),
    GlueFolder("qnli", "QNLI", ("dev.tsv",), (("QNLI", "accuracy"),), ("accuracy",)),
    GlueFolder("sst2", "SST-2", ("dev.tsv",), (("SST-2", "accuracy"),), ("accuracy",)),
    GlueFolder("cola", "CoLA", ("dev.tsv",), (("CoLA", "matthews_correlation"),), ("matthews_correlation",)),
    GlueFolder("stsb", "STS-B", ("dev.tsv",), (("STS-B Pearson", "pearson"), ("STS-B Spearman", "spearman")),
               ("spearman",)),
    GlueFolder("mrpc", "MRPC", ("dev.tsv",), (("MRPC F1", "f1"), ("MRPC acc", "accuracy")), ("f1",)),
    GlueFolder("rte", "RTE", ("dev.tsv",), (("RTE", "accuracy"),), ("accuracy",)),
    GlueFolder("wnli", "WNLI", ("dev.tsv",), (("WNLI", "accuracy"),), ()),
)}
assert set(GLUE_FOLDERS) == set(GLUE_TASKS)

AVERAGE_RULE = ("the paper's Table 1 average: the mean of MNLI-m, MNLI-mm, QQP F1, QNLI, SST-2, CoLA, STS-B "
                "Spearman, MRPC F1 and RTE (WNLI excluded)")


@dataclass
class FoundTask:
    """A usable task folder, its files and their example counts (skipped rows counted, not dropped)."""

    spec: GlueFolder
    folder: Path
    train: Path
    devs: list[Path]
    counts: dict[str, int]
    """train / dev examples read, and skipped_* rows."""


# --- the GLUE directory ----------------------------------------------------------------------------------

def find_tasks(data: Path, names: str | None, max_seq_length: int = 128) -> tuple[list[FoundTask], list[str]]:
    """The usable tasks in `data` (the `names` asked for, comma-separated, or every one found), and one line
    for each task that cannot run (its folder missing, a file missing or unreadable). Raises BertkitError
    when `data` holds no usable task at all."""
    if not data.is_dir():
        raise BertkitError(f"--data {data}: no such directory; give the GLUE directory download_glue_data.py wrote")
    asked = [glue_task(name.strip()).name for name in names.split(",") if name.strip()] if names else None
    if asked is not None and not asked:
        raise BertkitError("--tasks is empty; give e.g. cola,sst-2,mrpc or leave it out for every task found")
    present = {_folder_key(p.name): p for p in sorted(data.iterdir()) if p.is_dir()}
    found, problems = [], []
    for key in dict.fromkeys(asked) if asked else GLUE_FOLDERS:
        spec = GLUE_FOLDERS[key]
        folder = present.get(_folder_key(spec.folder))
        if folder is None:
            if asked:  # every task found: a folder not there is simply not run
                problems.append(f"{data / spec.folder}: no such folder; {spec.folder} skipped")
            continue
        try:
            found.append(_check_folder(spec, folder, max_seq_length))
        except BertkitError as exc:
            problems.append(f"{exc}; {spec.folder} skipped")
    if not found:
        if not problems:
            folders = ", ".join(f.folder for f in GLUE_FOLDERS.values())
            raise BertkitError(f"--data {data} holds no GLUE task folder ({folders}) in download_glue_data.py's "
                               f"layout, e.g. {data / 'CoLA' / 'train.tsv'}")
        raise BertkitError(f"--data {data}: no usable GLUE task ({len(problems)} skipped), first: {problems[0]}")
    return found, problems


def _folder_key(name: str) -> str:
    return name.lower().replace("-", "").replace("_", "")


def _check_folder(spec: GlueFolder, folder: Path, max_seq_length: int) -> FoundTask:
    """The task's files, read once as fine-tuning reads them, so a broken folder is named before any training."""
    files = {"train": folder / "train.tsv", **{Path(name).stem: folder / name for name in spec.dev_files}}
    for path in files.values():
        if not path.is_file():
            raise BertkitError(f"{folder}: no {path.name} (download_glue_data.py writes {spec.folder}/"
                               f"{', '.join(['train.tsv', *spec.dev_files])})")
    task = build_task("classification", files["train"], {"glue_task": spec.key, "max_seq_length": max_seq_length})
    counts = {}
    for name, path in files.items():
        examples, skipped = task.read(path, labelled=True, training=name == "train")
        counts[name], counts[f"skipped_{name}"] = len(examples), len(skipped)
    devs = [folder / name for name in spec.dev_files]
    return FoundTask(spec, folder, files["train"], devs, counts)


# --- the sweep -------------------------------------------------------------------------------------------

def run_glue(settings: GlueSettings, finetune: FinetuneSettings, progress: Callable[[str], None] = log.info,
             ) -> dict[str, Any]:
    """Fine-tune every usable task of `settings.data` at every learning rate of the grid, `finetune.seeds` each,
    into `finetune.output`; write the table after every task and return its JSON (see module docstring).
    `finetune.resume` keeps finished runs and continues interrupted ones; `finetune.overwrite` starts over.
    Under torchrun every process takes part in every run (one process group for the whole sweep); rank 0
    alone reads and writes the sweep's files and reports progress."""
    apply_threads(finetune.train.threads)
    ctx = setup_distributed(finetune.train.device)
    progress = progress if ctx.is_main else _silent
    tasks, problems = rank0_decides(lambda: find_tasks(Path(settings.data), settings.tasks, settings.max_seq_length),
                                    ctx)
    out = Path(finetune.output)
    if ctx.is_main:
        check_writable(out, "--output")
    check_length_fits(finetune, settings.max_seq_length)  # before the sweep's files are written
    sweep = rank0_decides(lambda: _prepare_output(out, finetune.resume, finetune.overwrite, settings, finetune), ctx)
    for line in problems:
        progress(line)
    tasks.sort(key=lambda t: t.train.stat().st_size)  # small tasks first: early results, early failures
    progress(f"GLUE: {len(tasks)} task(s) to run ({', '.join(t.spec.folder for t in tasks)}), {len(problems)} "
             f"skipped; {len(settings.learning_rates)} learning rate(s) x {len(finetune.seeds)} seed(s) each, "
             f"output {out}")
    per_task: dict[str, dict[str, Any]] = {}
    failed: list[str] = []
    total, done = len(tasks) * len(settings.learning_rates), 0
    for found in tasks:
        runs = {}
        for rate in settings.learning_rates:
            done += 1
            counter = f"[{done}/{total}] {found.spec.folder} lr {rate:g}"
            try:
                runs[rate] = _run_one(found, rate, settings, finetune, sweep, out, counter, progress, ctx)
            except BertkitError as exc:  # e.g. a rate that diverged: the other runs still count
                if ctx.distributed:  # an error may be rank 0's alone (a full disk); the others wait in a collective
                    raise
                failed.append(f"{counter}: failed: {exc}")
                progress(failed[-1])
        if runs:
            per_task[found.spec.key] = chosen = _choose(found, runs, finetune.seeds)
            choice = _choice_line(chosen)
            progress(f"{found.spec.folder}: learning rate {chosen['learning_rate']:g} chosen on dev "
                     f"({_score_line(chosen['metrics'], found.spec)})" + (f", {choice}" if choice else ""))
            if ctx.is_main:
                _write_tables(out, _results(per_task, problems, failed, settings, finetune))
    if not per_task:
        raise BertkitError(f"every GLUE run failed ({len(failed)}), first: {failed[0]}")
    results = _results(per_task, problems, failed, settings, finetune)
    if ctx.is_main:
        _write_tables(out, results)
    barrier(ctx)
    return results


def _silent(line: str) -> None:
    """The progress of ranks other than 0 (rank 0 reports the sweep once)."""


def _run_one(found: FoundTask, rate: float, settings: GlueSettings, finetune: FinetuneSettings, sweep: dict[str, Any],
             out: Path, label: str, progress: Callable[[str], None], ctx: DistributedContext) -> dict[str, Any]:
    """One (task, learning rate) run: kept when an earlier sweep finished it, else fine-tuned (continued
    from its checkpoints when resuming); its per-seed metrics and wall time."""
    name = f"{found.spec.key}/lr-{rate:g}"
    directory = out / name
    continuing = rank0_decides(lambda: finetune.resume and directory.is_dir(), ctx)
    # compare_random_init off: the table scores the model given, never random initialisation in its place
    one_run = dataclasses.replace(finetune, output=directory, overwrite=False, resume=continuing,
                                  compare_random_init="off",
                                  train=dataclasses.replace(finetune.train, learning_rate=rate))
    results = rank0_decides(lambda: _finished(directory, one_run) if finetune.resume else None, ctx)
    if results is None:
        start = time.perf_counter()
        task_settings = {"glue_task": found.spec.key, "max_seq_length": settings.max_seq_length}
        results = run_finetuning("classification", found.train, list(found.devs), one_run, task_settings)
        wall = time.perf_counter() - start
        sweep["runs"][name] = {"wall_s": round(wall, 1)}
        if ctx.is_main:
            write_text_atomic(out / SWEEP_FILE, json.dumps(sweep, indent=2) + "\n")
        status = f"{wall:,.0f} s"
    else:
        wall = sweep["runs"].get(name, {}).get("wall_s")
        status = "finished earlier, kept" + (f" ({wall:,.0f} s then)" if wall is not None else "")
    per_seed = {seed: results["seeds"][str(seed)] for seed in finetune.seeds}
    metrics = _seed_stats(per_seed, _metric_names(found.spec))
    progress(f"{label}: {_score_line(metrics, found.spec, main_only=True)}, {status}")
    return {"directory": str(directory), "wall_s": wall, "metrics": metrics,
            "truncated_train_examples": results.get("truncated_train_examples", 0),
            "truncated_dev_examples": results.get("truncated_dev_examples", 0)}


def _finished(directory: Path, one_run: FinetuneSettings) -> dict[str, Any] | None:
    """The eval_results.json of a run that finished every requested seed with settings the rulebook
    (`bertkit.settings.rules`) calls the same run - no exact or fixed setting changed; a free one (a budget, say)
    applies to seeds not yet finished - or None."""
    results = read_json_object(directory / RESULTS_FILE, missing=None, damaged=None)
    recorded = read_json_object(directory / RUN_FILE, missing=None, damaged=None)
    if results is None or recorded is None:
        return None
    now = run_settings(one_run)
    if any(d.setting in EXACT or d.name in FIXED for d in differences(upgraded_record(recorded), now)):
        return None
    seeds = results.get("seeds")
    if not isinstance(seeds, dict) or not all(str(seed) in seeds for seed in one_run.seeds):
        return None  # a seed added since: run_finetuning keeps the finished ones and trains it
    return results


def _prepare_output(out: Path, resume: bool, overwrite: bool, settings: GlueSettings,
                    finetune: FinetuneSettings) -> dict[str, Any]:
    """Create OUTPUT or check it holds an earlier sweep (--resume auto continues it, --overwrite deletes
    it); the sweep record, with the run times of an earlier sweep when resuming."""
    if resume and overwrite:
        raise BertkitError("--resume and --overwrite contradict each other; pick one")
    if out.exists() and not out.is_dir():
        raise BertkitError(f"--output {out} is a file; give a directory")
    marker = out / SWEEP_FILE
    earlier: dict[str, Any] = {}
    if out.is_dir() and any(out.iterdir()):
        if not marker.is_file():
            raise BertkitError(f"--output {out} is not empty and holds no GLUE sweep ({SWEEP_FILE}); "
                               "choose another directory")
        if not (resume or overwrite):
            raise BertkitError(f"--output {out} holds an earlier GLUE sweep; pass --resume auto to continue it "
                               "(finished runs are kept), --overwrite to start over, or choose another directory")
        if overwrite:
            _remove_sweep(out)
        else:
            # a damaged record loses only the run times; each run's own files decide what is finished
            earlier = read_json_object(marker, missing={}, damaged={})
    out.mkdir(parents=True, exist_ok=True)
    kept: dict[str, Any] = earlier["runs"] if isinstance(earlier.get("runs"), dict) else {}
    # only the run times bertkit wrote: an edited entry would fail the table's sums (each run's own files, not
    # this record, say what is finished)
    runs = {name: run for name, run in kept.items()
            if isinstance(run, dict) and finite_number(run.get("wall_s"), 0)}
    sweep = {"model": finetune.model, "data": str(settings.data), "learning_rates": list(settings.learning_rates),
             "seeds": list(finetune.seeds), "runs": runs}
    write_text_atomic(marker, json.dumps(sweep, indent=2) + "\n")
    return sweep


def _remove_sweep(out: Path) -> None:
    """Delete what a sweep writes in OUTPUT (its task folders and tables), nothing else."""
    for key in GLUE_FOLDERS:
        shutil.rmtree(out / key, ignore_errors=True)
    for name in (SWEEP_FILE, TABLE_JSON, TABLE_MD):
        (out / name).unlink(missing_ok=True)


# --- choosing and summarising ----------------------------------------------------------------------------

def _metric_names(spec: GlueFolder) -> tuple[str, ...]:
    """The task's metrics as eval_results.json names them: its GLUE metrics, then MNLI's mismatched ones."""
    return tuple(dict.fromkeys([*GLUE_METRICS[spec.key], *(metric for _, metric in spec.columns)]))


def _seed_stats(per_seed: dict[int, dict[str, float]], names: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Mean, sample standard deviation (0 for one seed) and the per-seed values of each metric."""
    stats = {}
    for name in names:
        values = [float(metrics[name]) for metrics in per_seed.values() if name in metrics]
        if values:
            stats[name] = {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1
                           else 0.0, "values": values}
    return stats


def _choose(found: FoundTask, runs: dict[float, dict[str, Any]], seeds: Sequence[int]) -> dict[str, Any]:
    """The task's entry: the learning rate whose mean main metric is best (the first in grid order on ties)."""
    main = GLUE_METRICS[found.spec.key][0]
    best = max(runs, key=lambda rate: runs[rate]["metrics"][main]["mean"])  # max keeps the first of equals
    return {"folder": str(found.folder), "learning_rate": best, "main_metric": main, "seeds": list(seeds),
            "metrics": runs[best]["metrics"], "directory": runs[best]["directory"], "examples": found.counts,
            "by_learning_rate": {f"{rate:g}": run for rate, run in runs.items()},
            "versus_runner_up": _versus_runner_up(runs, best, main)}


def _versus_runner_up(runs: dict[float, dict[str, Any]], best: float, main: str) -> dict[str, Any] | None:
    """The chosen rate against the next best on the main metric: is the choice more than seed noise?"""
    others = [rate for rate in runs if rate != best]
    if not others:
        return None
    runner_up = max(others, key=lambda rate: runs[rate]["metrics"][main]["mean"])
    comparison = compare_seeds([100 * v for v in runs[best]["metrics"][main]["values"]],
                               [100 * v for v in runs[runner_up]["metrics"][main]["values"]])
    return {"learning_rate": runner_up, "difference": comparison.difference, "p_value": comparison.p_value,
            "note": comparison.note}


def _choice_line(entry: dict[str, Any]) -> str:
    """"ahead of lr R by D points (note)", or "" when only one learning rate ran."""
    versus = entry.get("versus_runner_up")
    if not versus:
        return ""
    if versus["difference"] == 0:
        return f"tied with {versus['learning_rate']:g}, the first in grid order kept ({versus['note']})"
    return f"ahead of {versus['learning_rate']:g} by {versus['difference']:.1f} points ({versus['note']})"


def _results(per_task: dict[str, dict[str, Any]], problems: list[str], failed: list[str], settings: GlueSettings,
             finetune: FinetuneSettings) -> dict[str, Any]:
    """glue_results.json: the recipe, each task's entry, the table's columns and the paper's average."""
    columns, averaged, missing = [], [], []
    for key, spec in GLUE_FOLDERS.items():
        for title, metric in spec.columns:
            entry = per_task.get(key)
            stats = entry["metrics"].get(metric) if entry else None
            in_average = metric in spec.averaged
            if stats is None:
                missing += [title] if in_average else []
                continue
            columns.append({"title": title, "task": key, "metric": metric, "mean": 100 * stats["mean"],
                            "std": 100 * stats["std"], "in_average": in_average})
            averaged += [columns[-1]] if in_average else []
    average = {"value": statistics.fmean(c["mean"] for c in averaged) if averaged else None,
               "scores": [c["title"] for c in averaged], "missing": missing, "rule": AVERAGE_RULE}
    return {"model": finetune.model, "data": str(settings.data), "split": "dev",
            "recipe": {"learning_rates": list(settings.learning_rates), "seeds": list(finetune.seeds),
                       "epochs": finetune.train.num_epochs, "max_steps": finetune.train.max_steps,
                       "global_batch_size": finetune.train.batch_plan(1)[0], "max_seq_length": settings.max_seq_length,
                       "selection": "per task, the learning rate with the best mean dev score over the seeds "
                                    "(first metric of the task; MNLI: matched)"},
            "tasks": per_task, "columns": columns, "average": average, "skipped_tasks": problems,
            "failed_runs": failed}


def _score_line(metrics: dict[str, dict[str, Any]], spec: GlueFolder, main_only: bool = False) -> str:
    names = _metric_names(spec)[:1] if main_only else _metric_names(spec)
    seeds = len(next(iter(metrics.values()))["values"])
    shown = ", ".join(f"{name} {metrics[name]['mean']:.4f}" + (f" ± {metrics[name]['std']:.4f}" if seeds > 1 else "")
                      for name in names if name in metrics)
    return f"{shown} ({seeds} seed{'s' if seeds > 1 else ''})"


def markdown_table(results: dict[str, Any]) -> str:
    """glue_results.md: the paper's Table 1 layout (a row for the model, a column per task, the average),
    then per task the chosen learning rate, the dev score of every rate and mean ± std over seeds."""
    by_task: dict[str, list[dict[str, Any]]] = {}
    for column in results["columns"]:
        by_task.setdefault(column["task"], []).append(column)
    titles = [_task_title(GLUE_FOLDERS[key]) for key in by_task]
    cells = ["/".join(f"{c['mean']:.1f}" for c in cols) for cols in by_task.values()]
    average = results["average"]
    shown = "-" if average["value"] is None else f"{average['value']:.1f}"
    recipe = results["recipe"]
    seeds = ", ".join(map(str, recipe["seeds"]))
    lines = ["# GLUE dev results", "",
             f"| Model | {' | '.join(titles)} | Average |", "|---" * (len(titles) + 2) + "|",
             f"| {results['model']} | {' | '.join(cells)} | {shown} |", "",
             f"Dev sets, not the test sets of the paper's Table 1. Each score x 100 is the mean over seeds {seeds} at "
             f"the learning rate chosen on dev among {', '.join(f'{r:g}' for r in recipe['learning_rates'])} "
             f"(batch {recipe['global_batch_size']}, "
             + (f"{recipe['max_steps']} steps" if recipe["max_steps"] else f"{recipe['epochs']:g} epochs")
             + f", {recipe['max_seq_length']} tokens). Average: {AVERAGE_RULE}"
             + (f"; here over {len(average['scores'])} of those 9 scores (missing: {', '.join(average['missing'])})"
                if average["missing"] else "") + ".", "",
             "| Task | learning rate | dev score (mean ± std over seeds) | main metric per learning rate | "
             "train / dev examples |", "|---|---|---|---|---|"]
    for key, entry in results["tasks"].items():
        spec = GLUE_FOLDERS[key]
        scores = ", ".join(f"{title} {100 * entry['metrics'][metric]['mean']:.1f} ± "
                           f"{100 * entry['metrics'][metric]['std']:.1f}" for title, metric in spec.columns
                           if metric in entry["metrics"])
        main = entry["main_metric"]
        per_rate = ", ".join(f"{rate}: {100 * run['metrics'][main]['mean']:.1f}"
                             for rate, run in entry["by_learning_rate"].items())
        counts = entry["examples"]
        dev = "+".join(str(counts[Path(name).stem]) for name in spec.dev_files)
        lines.append(f"| {spec.folder} | {entry['learning_rate']:g} | {scores} | {main} {per_rate} | "
                     f"{counts['train']} / {dev} |")
    choices = [f"- {GLUE_FOLDERS[key].folder}: {entry['learning_rate']:g} {_choice_line(entry)}"
               for key, entry in results["tasks"].items() if _choice_line(entry)]
    if choices:
        lines += ["", "Each chosen learning rate against the next best (main metric, x 100):", *choices]
    for title, problems in (("Skipped tasks", results["skipped_tasks"]), ("Failed runs", results["failed_runs"])):
        if problems:
            lines += ["", f"{title} ({len(problems)}):", *(f"- {line}" for line in problems)]
    return "\n".join(lines) + "\n"


def _task_title(spec: GlueFolder) -> str:
    """One table column per task, as the paper heads it: MNLI-m/mm, QQP F1/acc, STS-B Pearson/Spearman."""
    if len(spec.columns) == 1:
        return spec.columns[0][0]
    first, *rest = (title for title, _ in spec.columns)
    return first + "".join("/" + title.removeprefix(spec.folder).strip(" -") for title in rest)


def _write_tables(out: Path, results: dict[str, Any]) -> None:
    write_text_atomic(out / TABLE_JSON, json.dumps(results, indent=2) + "\n")
    write_text_atomic(out / TABLE_MD, markdown_table(results))
