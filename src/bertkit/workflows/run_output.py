"""The fine-tuning run's output directory (OUTPUT): what a run writes there, when an existing one may be
continued or replaced, the per-seed results, and the promotion of the best seed's model to OUTPUT/best.

    prepare_output(output, resume, overwrite, settings)   create, check resume/overwrite (the rulebook)
    record_run(output, settings)                           record the settings the run starts with
    finished_seed(seed_dir) -> results | None              a seed finished by an earlier run
    mark_seed_done(seed_dir, results)                      seed-N/seed_results.json
    keep_best_seed(output, per_seed, seed, main_metric)    OUTPUT/best = the best seed's best evaluation
    seed_summary(per_seed, metric_names)                   mean, std, max across seeds
    @stops_between_loops(what)                             SIGINT/SIGTERM between training loops: one line

Design decision: every step is idempotent and marked on disk, so a run killed anywhere (mid-seed, between
seeds, half-way through a promotion) continues with `--resume auto` and repairs itself; `--overwrite`
deletes only what a fine-tuning run writes and refuses a directory holding anything else.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import json
import logging
import shutil
import signal
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from bertkit.errors import BertkitError, Interrupted
from bertkit.io.atomic import check_outside, check_writable, replace_directory, write_text_atomic
from bertkit.io.bounded import file_present
from bertkit.io.digest import update_with_file
from bertkit.io.jsonfile import finite_number, read_json_object
from bertkit.settings.rules import check_resume, describe_changes
from bertkit.workflows.predict import RESULTS_FILE, write_results
from bertkit.workflows.random_init import PRETRAINED_ASIDE, RANDOM_INIT_DIRECTORY, STAGED

log = logging.getLogger(__name__)

SEED_DONE_FILE = "seed_results.json"
RUN_FILE = "finetune_run.json"
DISTILLATION_PATHS = ("teacher-outputs", "without-teacher")
"""What `bertkit distill` adds to a fine-tuning run's directory (bertkit.workflows.distill)."""
COMPARISON_PATHS = (RANDOM_INIT_DIRECTORY, PRETRAINED_ASIDE, *STAGED)
"""What `finetune --compare-random-init` adds to it (bertkit.workflows.random_init)."""

Run = TypeVar("Run", bound=Callable[..., Any])


def stops_between_loops(what: str) -> Callable[[Run], Run]:
    """Decorate a command's run function (with a `settings` argument whose `.output` is OUTPUT) so that a signal
    outside its training loops ends it as `stop_between_loops` says."""
    def decorate(run: Run) -> Run:
        signature = inspect.signature(run)

        @functools.wraps(run)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            settings = signature.bind(*args, **kwargs).arguments["settings"]
            with stop_between_loops(Path(settings.output), what):
                return run(*args, **kwargs)
        return wrapped  # type: ignore[return-value]
    return decorate


@contextlib.contextmanager
def stop_between_loops(output: Path, what: str = "fine-tuning") -> Iterator[None]:
    """Signals outside a training loop (whose own handler saves and says so): between seeds, or between two
    trainings and a choice. SIGINT and SIGTERM end the command in one line, with `--resume auto` once this run's
    RUN_FILE is written (every finished step was published atomically, so it continues); before that (the
    files still being read, an `--overwrite` still removing the old run) there is nothing of this run to
    continue. One request is served once: a scheduler and torchrun both send SIGTERM, milliseconds apart. The
    replaced SIGTERM handler is restored; off the main thread signals are left alone."""
    started, requested = time.time(), False

    def stopped(signum: int) -> Interrupted:
        record, name = output / RUN_FILE, signal.Signals(signum).name
        # A record older than this command is the run --overwrite is removing, not this one.
        if record.is_file() and record.stat().st_mtime >= started - 1.0:
            return Interrupted(f"{what} stopped by {name} between training loops; what finished is saved in "
                               f"{output}", signum, "--resume auto")
        return Interrupted(f"{what} stopped by {name} before the run started; run the command again", signum)

    def on_sigterm(signum: int, frame: Any) -> None:
        nonlocal requested
        if not requested:
            requested = True
            raise stopped(signum)

    try:
        previous, installed = signal.signal(signal.SIGTERM, on_sigterm), True
    except ValueError:  # not the main thread
        previous, installed = None, False
    try:
        yield
    except Interrupted:
        raise
    except KeyboardInterrupt:
        raise stopped(signal.SIGINT) from None
    finally:
        if installed:  # None: the handler was not set from Python, i.e. the default
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def prepare_output(output: Path, resume: bool, overwrite: bool, settings: dict[str, Any],
                   allow_change: Sequence[str] = (), labels: dict[str, str] | None = None,
                   inputs: dict[str, str | Path | None] | None = None) -> None:
    """Create --output; a non-empty one needs --resume auto (continue) or --overwrite (start over), which refuses to
    delete what `inputs` (flag -> path: the model, the tokenizer) name inside it. On resume,
    `settings` (what `record_run` will record) are checked against the interrupted run's RUN_FILE under the
    rulebook (`bertkit.settings.rules`: exact settings need --allow-change, fixed ones cannot change, the rest
    apply); nothing is written here, so a refused resume leaves the run directory as it was."""
    if output.exists() and not output.is_dir():
        raise BertkitError(f"--output {output} is a file; give a directory")
    if resume and overwrite:
        raise BertkitError("--resume and --overwrite contradict each other; pick one")
    check_writable(output, "--output")
    if output.is_dir() and any(output.iterdir()) and not resume:
        if not overwrite:
            raise BertkitError(f"--output {output} is not empty; pass --resume auto to continue the run in it, "
                               "--overwrite to start over, or choose another directory")
        for flag, path in (inputs or {}).items():
            check_outside(output, flag, path)
        _remove_run(output)
    output.mkdir(parents=True, exist_ok=True)
    if resume:
        _check_same_run(output, settings, set(allow_change), labels or {})


def record_run(output: Path, settings: dict[str, Any]) -> None:
    """Write RUN_FILE: the settings the run starts with (after every check, once its data has been read)."""
    write_text_atomic(output / RUN_FILE, json.dumps(settings, indent=2) + "\n")


def _remove_run(output: Path) -> None:
    """Delete an earlier fine-tuning run; refuse a directory holding anything a run does not write."""
    def ours(path: Path) -> bool:
        return (path.name in ("best", RESULTS_FILE, RUN_FILE, "tensorboard", *DISTILLATION_PATHS, *COMPARISON_PATHS)
                or path.name.startswith("seed-")
                or "predictions" in path.name or path.name.endswith("null_odds.json"))
    foreign = sorted(p.name for p in output.iterdir() if not ours(p))
    if foreign:
        raise BertkitError(f"--overwrite: {output} holds files fine-tuning does not write ({', '.join(foreign[:5])}); "
                           "remove them yourself or choose another --output")
    for path in output.iterdir():
        shutil.rmtree(path) if path.is_dir() else path.unlink()


def _check_same_run(output: Path, settings: dict[str, Any], allowed: set[str], labels: dict[str, str]) -> None:
    """Refuse what the rulebook refuses against the interrupted run's record; log what --allow-change accepted
    and what changed freely. Runs written before a setting was recorded are not compared on it."""
    path = output / RUN_FILE
    if not file_present(path):
        return
    earlier = upgraded_record(read_json_object(path, fix="start over with --overwrite"))
    found = check_resume(earlier, settings, allowed, where=str(output), labels=labels)
    accepted = [d for d in found if d.setting in allowed]
    if accepted:
        log.warning("--allow-change %s: resuming the run in %s with other %s than it started with; it is no longer "
                    "the run it continues (%s)", " --allow-change ".join(sorted({d.setting for d in accepted})),
                    output, ", ".join(sorted({d.setting for d in accepted})), describe_changes(accepted, labels))
    free = [d for d in found if d not in accepted]
    if free:
        log.info("resuming the run in %s with changed settings, applied to the seeds not yet finished: %s", output,
                 describe_changes(free, labels))


def upgraded_record(record: dict[str, Any]) -> dict[str, Any]:
    """A run record as today's runs write it: data fingerprints as {"sha256": ...} (older runs kept the bare
    hash), and the batch fields, which `fit`'s checkpoints now compare, left out."""
    record = {k: v for k, v in record.items() if k not in _UNRECORDED}
    data = record.get("data")
    if isinstance(data, dict):
        record["data"] = {name: _as_fingerprint(value) for name, value in data.items()}
    return record


_UNRECORDED = ("global_batch_size", "micro_batch_size", "gradient_accumulation_steps", "batch_size")


def _as_fingerprint(value: Any) -> Any:
    if isinstance(value, str):
        return {"sha256": value}
    if isinstance(value, list):
        return [_as_fingerprint(item) for item in value]
    return value


def data_record(train_path: str | Path, dev_paths: Sequence[str | Path]) -> tuple[dict[str, Any], dict[str, str]]:
    """(what a run records of its files: their contents' fingerprints, so a moved file is the same file and an
    edited one is not; labels naming each file for the messages of a refused resume)."""
    record = {"train": {"sha256": data_fingerprint(train_path)},
              "dev": [{"sha256": data_fingerprint(path)} for path in dev_paths]}
    labels = {"data.train.sha256": f"the training file {train_path}"}
    labels |= {f"data.dev.{index}.sha256": f"the dev file {path}" for index, path in enumerate(dev_paths)}
    return {"data": record}, labels


def data_fingerprint(path: str | Path) -> str:
    """The sha256 (first 16 hex digits) of a data file's bytes, or of a directory's files (`datasets`
    save_to_disk: names and bytes, in sorted order): what a resumed run compares, wherever the files moved."""
    path = Path(path)
    digest = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for file in files:
        if path.is_dir():
            digest.update(str(file.relative_to(path)).encode())
        update_with_file(digest, file)
    return digest.hexdigest()[:16]


def finished_seed(seed_dir: Path) -> dict[str, float] | None:
    """The results of a seed that finished in an earlier run, or None."""
    path = seed_dir / SEED_DONE_FILE
    if not path.is_file():
        return None
    results = read_json_object(path, damaged=None)  # a damaged marker: train the seed again
    if results is None:
        return None
    step = results.get("step")
    if not (isinstance(step, int) and not isinstance(step, bool) and step >= 0 and all(
            finite_number(v) for v in results.values())):
        log.warning("%s: not the results bertkit writes (a step and finite metrics); the seed is trained again", path)
        return None
    return results


def mark_seed_done(seed_dir: Path, results: dict[str, float]) -> None:
    """Record a finished seed's best metrics (it is never trained again)."""
    write_results(seed_dir / SEED_DONE_FILE, results)


def keep_best_seed(output: Path, per_seed: dict[int, dict[str, float]], seed: int, main: str | None) -> None:
    """Make `seed` the run's best (OUTPUT/best, its predictions) if it is, else drop its best/ copy (`main`
    None: no dev set, one seed, the best). Idempotent, so a run killed half-way through this repairs itself
    when resumed."""
    best_seed = max(per_seed, key=lambda s: per_seed[s][main] if main else 0.0)
    seed_dir = output / f"seed-{seed}"
    if seed != best_seed:
        shutil.rmtree(seed_dir / "best", ignore_errors=True)
    elif (seed_dir / "best").is_dir():  # not yet promoted
        _promote(output, seed_dir)


def _promote(output: Path, seed_dir: Path) -> None:
    """Make this seed's best model and dev predictions the run's (OUTPUT/best, OUTPUT/predictions...)."""
    for path in seed_dir.iterdir():
        if "predictions" in path.name or path.name.endswith("null_odds.json"):
            shutil.copyfile(path, output / path.name)
    replace_directory(seed_dir / "best", output / "best")


def seed_summary(per_seed: dict[int, dict[str, float]], names: tuple[str, ...]) -> dict[str, dict[str, float]]:
    """Mean, sample standard deviation (0 for one seed), and max of each metric across seeds."""
    summary = {}
    for name in names:
        values = [m[name] for m in per_seed.values()]
        summary[name] = {"mean": statistics.fmean(values),
                         "std": statistics.stdev(values) if len(values) > 1 else 0.0, "max": max(values)}
    return summary
