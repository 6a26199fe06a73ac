"""The pre-training study of docs/pretraining.md (issue 17): which recipe pays at which budget, on which
corpus and task, with bertkit's own commands.

    python scripts/pretraining_study.py rates                               # steps per CPU-second, idle machine
    python scripts/pretraining_study.py run --root /tmp/study --data /tmp/study-data --rate-64 2.2 --rate-128 1.06
    python scripts/pretraining_study.py table --root /tmp/study
    python scripts/pretraining_study.py run ... --levers     # also the short-budget levers (issue 37, item 2)

The rows of 2026-11-23 (docs/study/wordnet-2026-11-23.jsonl) ran the short recipe of that day (batch 32, 15%
masking, 5% warmup); `--levers` measures that recipe as "before" beside each lever and the new recipe's parts.

A budget is in CPU-minutes (minutes of one core): `bertkit pretrain --max-time 10m` on a 2-core machine
is 20 CPU-minutes. A budget is turned into a step budget at the rate of the idle machine (bert-mini,
batch 32, precision auto: 4.4 steps/s at 64 tokens on two idle cores, docs/quickstart.md, i.e. 2.2
steps per CPU-second; 128 tokens at 0.48x that, measured as a ratio by `rates`; the short recipe's batch of 16
since issue 37 at twice the 64-token rate: the same tokens), so the results do not
depend on how busy the machine is while the study runs; every run uses one thread (`OMP_NUM_THREADS=1`,
two runs at a time on two cores). Everything else is the command a user runs:

- data: `bertkit data pretraining --max-seq-length 128 --masking dynamic` of each corpus with its own
  8,000-token vocabulary (`bertkit tokenizer train`);
- pre-training: `bertkit pretrain --model bert-mini --recipe R --max-steps N` (R = auto, which picks the
  short-budget recipe at these budgets and cuts the 128-token instances to 64 at load, or paper);
- fine-tuning: `scripts/study_finetune.py` on each task of the corpus, seeds 1, 2, 3, the learning rate
  chosen by the same rule for the pre-trained model and for random initialisation (`grid`: the best dev
  of 1e-4, 3e-4 and 1e-3 on seed 1), test scored at each seed's best dev epoch.

Corpora and tasks: the bundled King James Bible with its 6-way verse task (1,000 labels; the recipe was
tuned on it, docs/quickstart.md), and WordNet 3.0 (definitions and examples; scripts/study_data.py) with
its 45-way lexicographer-file task (2,000 labels) and its extractive QA task (4,000 questions) - the
held-out pair: nothing of the recipe was chosen on it. Jobs run in dependency order, `--jobs` at a time;
a job whose output exists is skipped, so an interrupted study continues where it stopped.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bertkit.workflows.recipes import REFERENCE_WIDTH, short_recipe

SCRIPTS = Path(__file__).resolve().parent
# The short recipe's batch: --rate-64 is measured at batch 32, and a smaller batch takes proportionally more steps
# per second (the same tokens per CPU-second; measured for 16 and 8 below), so `auto` rows get rate x 32 / batch.
SHORT_BATCH = short_recipe(REFERENCE_WIDTH).batch_size
# The short recipe at three budgets on the held-out corpus (20 CPU-minutes is `--max-time 10m` on two cores, the
# acceptance run; 40 did not fit the session that ran the study), one on the bundled corpus (the quickstart study
# covers more); the paper's recipe at one.
BUDGETS_CPU_MIN = {"wordnet": (5, 10, 20), "kjv": (10, 20)}
PAPER_BUDGETS_CPU_MIN = {"wordnet": (20,), "kjv": (20,)}
SEEDS = "1,2,3"
# corpus -> (tasks fine-tuned from it, with their epochs and learning-rate rule). The QA task's fine-tunings
# cost ~4x the classifier's, so it takes bertkit's own rule (`--learning-rate auto`, the same for a pre-trained
# and a random model of one size) instead of a 3-rate grid: 3 runs per row instead of 5.
CORPORA = {"wordnet": (("wordnet-lexname", 5, "grid"), ("wordnet-qa", 2, "default")),
           "kjv": (("kjv-verse", 5, "grid"),)}
TRAIN_EXAMPLES = {"kjv-verse": 1000}  # as the quickstart: few labels, where pre-training pays most
# The short-budget levers (issue 37, item 2), each the short recipe as it was before them (LEVER_BASE: batch 32, 15%
# masking, 5% warmup, at LEVER_BUDGET_CPU_MIN on the held-out corpus) with one thing changed, then the combinations
# the single levers pointed to: name -> (`bertkit pretrain` flags replacing the base's, the data it reads: "data" as
# the study builds it, "contiguous" packed with --packing contiguous (for --no-nsp), "vocab4000" a 4,000-piece
# vocabulary; the steps per CPU-second: "64" or "128", times a factor where the batch is not 32 (batch 16 takes
# 1.95-2.05x the steps per second of batch 32 at 64 tokens on one thread, batch 8 3.84-3.97x, measured with
# measure_steps_per_second: about the same tokens per CPU-second). Every row compares with "before".
# Not here: a batch-size ramp (bertkit has none) and sparse MLM prediction (always on: the head reads only the
# masked positions, the same loss at less cost; its gain is throughput, measured in docs/performance.md).
LEVER_CORPUS = "wordnet"
LEVER_BUDGET_CPU_MIN = 10
LEVER_BASE = {"--global-batch-size": "32", "--masked-lm-prob": "0.15", "--warmup-ratio": "0.05"}
LEVERS = {
    "before": ([], "data", "64"),  # the short recipe of 2026-11-23, unchanged
    "mask20": (["--masked-lm-prob", "0.2"], "data", "64"),  # Wettig et al. 2022: 15% is not optimal
    "mask30": (["--masked-lm-prob", "0.3"], "data", "64"),
    "no-nsp": (["--no-nsp"], "data", "64"),
    "contiguous": (["--no-nsp"], "contiguous", "64"),  # the data packed to fill every position
    "len128": (["--max-seq-length", "128"], "data", "128"),  # 128 tokens from the start, not 64
    "dropout": (["--dropout", "0.1"], "data", "64"),  # the recipe has none
    "one-cycle": (["--warmup-ratio", "0.5"], "data", "64"),  # Cramming's triangle: up half the steps, down the rest
    "vocab4000": ([], "vocab4000", "64"),  # a smaller vocabulary for a small corpus
    "lr1e-3": (["--learning-rate", "1e-3"], "data", "64"),  # twice the recipe's peak (Cramming trains at 1e-3)
    "batch16": (["--global-batch-size", "16"], "data", "64", 2.0),  # twice the updates of the same tokens
    # combinations
    "b16-m30": (["--global-batch-size", "16", "--masked-lm-prob", "0.3"], "data", "64", 2.0),
    "b16-m30-cycle": (["--global-batch-size", "16", "--masked-lm-prob", "0.3", "--warmup-ratio", "0.5"], "data", "64",
                      2.0),
    "b8-m30-cycle": (["--global-batch-size", "8", "--masked-lm-prob", "0.3", "--warmup-ratio", "0.5"], "data", "64",
                     3.9),
}


def lever_flags(flags: list[str]) -> list[str]:
    """LEVER_BASE with a lever's flags: a flag the base sets takes the lever's value, any other is added."""
    base, extra, i = dict(LEVER_BASE), [], 0
    while i < len(flags):
        if flags[i] in base:
            base[flags[i]] = flags[i + 1]
            i += 2
        else:
            extra.append(flags[i])
            i += 1
    return [item for pair in base.items() for item in pair] + extra


@dataclass
class Job:
    name: str
    command: list[str]
    done: Path
    """The job is finished when this exists."""
    after: list[str] = field(default_factory=list)


def corpus_path(corpus: str, data: Path) -> Path:
    if corpus == "kjv":
        from bertkit.assets import kjv_path

        return kjv_path("corpus.txt.gz")
    return data / corpus / "corpus.txt"


def bertkit(*args: str) -> list[str]:
    return [sys.executable, "-m", "bertkit", *args]


def jobs(args: argparse.Namespace) -> list[Job]:
    root, data = args.root, args.data
    out: list[Job] = []
    for corpus, tasks in CORPORA.items():
        vocab, built = root / corpus / "vocab", root / corpus / "data"
        out.append(Job(f"{corpus}:vocab", bertkit("tokenizer", "train", "--input", str(corpus_path(corpus, data)),
                                                  "--vocab-size", "8000", "--output", str(vocab)), vocab / "vocab.txt"))
        out.append(Job(f"{corpus}:data", bertkit("data", "pretraining", "--input", str(corpus_path(corpus, data)),
                                                 "--tokenizer", str(vocab), "--output", str(built), "--max-seq-length",
                                                 "128", "--masking", "dynamic", "--workers", "1"),
                       built / "manifest.json", [f"{corpus}:vocab"]))
        models = [("random", None, "-", f"{corpus}:vocab")]  # (recipe label, run, budget label, its job)
        for recipe, budgets in (("auto", BUDGETS_CPU_MIN[corpus]), ("paper", PAPER_BUDGETS_CPU_MIN[corpus])):
            for budget in budgets:
                rate = args.rate_64 * 32 / SHORT_BATCH if recipe == "auto" else args.rate_128
                run, name = root / corpus / f"pretrain-{recipe}-{budget}cpu", f"{corpus}:pretrain:{recipe}:{budget}"
                out.append(Job(name, bertkit(
                    "pretrain", "--data", str(built), "--tokenizer", str(vocab), "--model", "bert-mini", "--output",
                    str(run), "--recipe", recipe, "--max-steps", str(round(budget * 60 * rate)), "--eval-every",
                    "500", "--eval-examples", "1000", "--resume", "auto"), run / "final" / "model.safetensors",
                    [f"{corpus}:data"]))
                models.append((recipe, run, f"{budget} CPU-min", name))
        if args.levers and corpus == LEVER_CORPUS:
            out += _lever_data_jobs(corpus, root, data)
            models += _lever_models(corpus, root, args, out)
        for task, epochs, lr_rule in tasks:
            for recipe, run, budget, needs in models:
                source = (["--random", "bert-mini", "--tokenizer", str(vocab)] if run is None
                          else ["--model", str(run / "final")])
                output = root / corpus / f"finetune-{recipe}-{budget.split()[0]}-{task}"
                extra = ["--train-examples", str(TRAIN_EXAMPLES[task])] if task in TRAIN_EXAMPLES else []
                out.append(Job(f"{corpus}:finetune:{recipe}:{budget.split()[0]}:{task}", [
                    sys.executable, str(SCRIPTS / "study_finetune.py"), "run", "--task", task, "--data", str(data),
                    *source, "--seeds", SEEDS, "--lr-rule", lr_rule, "--epochs", str(epochs), "--threads", "1",
                    "--corpus", corpus, "--budget", budget, "--recipe", recipe, "--output", str(output),
                    "--results", str(root / "results.jsonl"), *extra], output / "row.done", [needs]))
    return out


def _lever_data_jobs(corpus: str, root: Path, data: Path) -> list[Job]:
    """The data the levers read besides the study's own: packed contiguously, and with a 4,000-piece vocabulary."""
    text, folder = str(corpus_path(corpus, data)), root / corpus
    build = ("--max-seq-length", "128", "--masking", "dynamic", "--workers", "1")
    packed = bertkit("data", "pretraining", "--input", text, "--tokenizer", str(folder / "vocab"), "--output",
                     str(folder / "data-contiguous"), *build, "--no-nsp", "--packing", "contiguous")
    vocab = bertkit("tokenizer", "train", "--input", text, "--vocab-size", "4000", "--output",
                    str(folder / "vocab4000"))
    small = bertkit("data", "pretraining", "--input", text, "--tokenizer", str(folder / "vocab4000"), "--output",
                    str(folder / "data-vocab4000"), *build)
    return [Job(f"{corpus}:data-contiguous", packed, folder / "data-contiguous" / "manifest.json", [f"{corpus}:vocab"]),
            Job(f"{corpus}:vocab4000", vocab, folder / "vocab4000" / "vocab.txt"),
            Job(f"{corpus}:data-vocab4000", small, folder / "data-vocab4000" / "manifest.json",
                [f"{corpus}:vocab4000"])]


def _lever_models(corpus: str, root: Path, args: argparse.Namespace, out: list[Job]) -> list[tuple]:
    """One pre-training job per lever (appended to `out`); the (label, run, budget, job) rows to fine-tune."""
    models = []
    for lever, (flags, source, length, *factor) in LEVERS.items():
        built = root / corpus / ("data" if source == "data" else f"data-{source}")
        vocab = root / corpus / ("vocab4000" if source == "vocab4000" else "vocab")
        needs = f"{corpus}:data" if source == "data" else f"{corpus}:data-{source}"
        rate = (args.rate_64 if length == "64" else args.rate_128) * (factor[0] if factor else 1.0)
        budget = LEVER_BUDGET_CPU_MIN
        run, name = root / corpus / f"pretrain-{lever}-{budget}cpu", f"{corpus}:pretrain:{lever}:{budget}"
        out.append(Job(name, bertkit(
            "pretrain", "--data", str(built), "--tokenizer", str(vocab), "--model", "bert-mini", "--output", str(run),
            "--recipe", "auto", *lever_flags(flags), "--max-steps", str(round(budget * 60 * rate)), "--eval-every",
            "500", "--eval-examples", "1000", "--resume", "auto"), run / "final" / "model.safetensors", [needs]))
        models.append((lever, run, f"{budget} CPU-min", name))
    return models


def run_all(args: argparse.Namespace) -> None:
    run_jobs(jobs(args), args.root, args.jobs, _priority)


def run_jobs(all_jobs: list[Job], root: Path, workers: int, priority: Callable[[Job], Any]) -> None:
    """Every job in dependency order, `workers` at a time, one thread each, the ready ones by `priority`; a job
    whose mark exists is skipped (an interrupted study continues); the first failure stops the study."""
    todo = {job.name: job for job in all_jobs}
    done = {name for name, job in todo.items() if job.done.exists()}
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    root.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(workers) as pool:
        running: dict = {}
        while len(done) < len(todo):
            ready = [j for n, j in todo.items() if n not in done and n not in running.values()
                     and all(a in done for a in j.after)]
            ready.sort(key=priority)
            for job in ready[:workers - len(running)]:
                print(f"{time.strftime('%H:%M:%S')} start {job.name}", flush=True)
                log = root / "logs" / f"{job.name.replace(':', '_')}.log"
                log.parent.mkdir(parents=True, exist_ok=True)
                running[pool.submit(_run, job, log, env)] = job.name
            if not running:
                raise SystemExit(f"stuck: {sorted(set(todo) - done)} wait on jobs that failed")
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                name = running.pop(future)
                code = future.result()
                print(f"{time.strftime('%H:%M:%S')} {'done' if code == 0 else f'FAILED ({code})'} {name}", flush=True)
                if code == 0:
                    todo[name].done.parent.mkdir(parents=True, exist_ok=True)
                    todo[name].done.touch()
                    done.add(name)
                else:
                    raise SystemExit(f"{name} failed; see {root / 'logs'}")


def _priority(job: Job) -> tuple[int, float, int]:
    """The held-out corpus first, smaller budgets first, a model's fine-tunings before the next pre-training:
    an interrupted study has complete rows for what it covered."""
    parts = job.name.split(":")
    corpus = list(CORPORA).index(parts[0]) if parts[0] in CORPORA else 0
    if parts[1] not in ("pretrain", "finetune"):
        return corpus, -1.0, 0
    budget = 0.0 if parts[3] == "-" else float(parts[3]) + (0.5 if parts[2] == "paper" else 0.0)
    return corpus, budget, 0 if parts[1] == "finetune" else 1


def _run(job: Job, log: Path, env: dict) -> int:
    running = _running(job.command)
    if running is not None:  # left by a study that was stopped and restarted: wait for it, do not start it twice
        while Path(f"/proc/{running}").exists():
            time.sleep(10)
        return 0 if job.done.exists() else 1  # row.done is the driver's mark: adopt only pre-trainings
    with open(log, "a", encoding="utf-8") as handle:
        return subprocess.run(job.command, stdout=handle, stderr=subprocess.STDOUT, env=env).returncode


def _running(command: list[str]) -> int | None:
    """The pid of a process already running exactly this command (Linux /proc), if any."""
    wanted = "\0".join(command[1:])
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and wanted in (entry / "cmdline").read_bytes().decode(errors="replace"):
                return int(entry.name)
        except OSError:
            continue
    return None


def rates(args: argparse.Namespace) -> None:
    """Pre-training steps per second of bert-mini, batch 32, one thread, at 64 and 128 tokens (their ratio
    holds on a busy machine too; the absolute rates only on an idle one)."""
    import torch

    torch.set_num_threads(1)
    from bertkit.config import preset
    from bertkit.workflows.pretrain import measure_steps_per_second

    for length in (64, 128):
        rate = measure_steps_per_second(preset("bert-mini", vocab_size=8000), length, 32, "auto", "cpu", seconds=20)
        print(f"--rate-{length} {rate:.3f}  (steps per CPU-second: bert-mini, {length} tokens, batch 32, 1 thread)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("rates")
    run = commands.add_parser("run")
    run.add_argument("--root", type=Path, required=True)
    run.add_argument("--data", type=Path, required=True, help="Output of scripts/study_data.py.")
    run.add_argument("--rate-64", type=float, required=True, help="Steps per CPU-second at 64 tokens (`rates`).")
    run.add_argument("--rate-128", type=float, required=True, help="Steps per CPU-second at 128 tokens (`rates`).")
    run.add_argument("--jobs", type=int, default=2)
    run.add_argument("--levers", action="store_true", help="Also the short-budget levers (LEVERS), each at "
                     f"{LEVER_BUDGET_CPU_MIN} CPU-minutes on {LEVER_CORPUS}.")
    table = commands.add_parser("table")
    table.add_argument("--root", type=Path, required=True)
    args = parser.parse_args()
    if args.command == "rates":
        rates(args)
    elif args.command == "run":
        run_all(args)
    else:
        subprocess.run([sys.executable, str(SCRIPTS / "study_finetune.py"), "table", str(args.root / "results.jsonl")],
                       check=True)


if __name__ == "__main__":
    main()
