"""`bertkit quickstart`: vocabulary -> pre-training data -> pre-training -> fine-tuning (pre-trained and
random initialisation) -> fill-mask -> report, on the bundled King James Bible, in one call.

Design decision: every stage writes exactly the directory the normal command would write - `vocab/`
(`bertkit tokenizer train`), `data/` (`bertkit data pretraining`), `pretrain/` with `final/`
(`bertkit pretrain`), `finetune-pretrained/` and `finetune-random/` with `best/` (`bertkit finetune
classification`) - by calling the same library functions, so each output can be reused by those
commands, and `resume` skips a stage whose output is complete and continues an interrupted one (the
pre-training from its newest checkpoint, the fine-tunings seed by seed). A signal stops the whole command
(`Interrupted`, exit 130/143) after the running stage has saved; the time spent is accumulated across
runs in `timings.json`, so a resumed run reports the whole run. The pre-training recipe (`Recipe`
defaults) is the one measured in docs/quickstart.md: a small vocabulary trained on the corpus, short
sequences, no dropout, a high peak learning rate with short warmup and linear decay to zero at the time
budget. Both fine-tunings share one recipe and the same seeds, so their difference is pre-training alone.

References: Devlin et al. 2018; Izsak et al. 2021 (arXiv:2104.07705) and Geiping & Goldstein 2022
(arXiv:2212.14034) for training BERT on a small budget; Turc et al. 2019 (arXiv:1908.08962) for the
miniature shapes and their fine-tuning learning rates.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import random
import shutil
import signal
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from bertkit.assets import kjv_path
from bertkit.atomic import write_text_atomic
from bertkit.errors import BertkitError, Interrupted

MODEL = "bert-mini"
REPORT_FILE = "report.md"
SUMMARY_FILE = "quickstart.json"
TIMINGS_FILE = "timings.json"
MIN_HELPFUL_STEPS = 1000
"""Pre-training steps below which the study (docs/quickstart.md) saw no gain: 400 steps were worse than
random initialisation, 1,500 gave +11 points."""
PRETRAIN_FIGURE = "pretraining.png"
FINETUNE_FIGURE = "finetuning.png"
FILL_MASK_SENTENCES = (
    "In the beginning God created the [MASK] and the earth.",
    "And God said, Let there be [MASK]: and there was light.",
    "The Lord is my [MASK]; I shall not want.",
    "For God so loved the [MASK], that he gave his only begotten Son.",
    "And the children of [MASK] went up out of the land of Egypt.",
)
STAGE_OUTPUTS = ("vocab", "data", "pretrain", "labels", "finetune-pretrained", "finetune-random")


@dataclass(frozen=True)
class Recipe:
    """Pre-training and fine-tuning settings; the defaults are the recipe measured in docs/quickstart.md."""

    vocab_size: int = 8000
    """WordPiece vocabulary trained on the corpus (small: fewer embedding rows to learn)."""
    max_seq_length: int = 64
    """Pre-training instance length in tokens (a verse is about 35; short instances, more steps)."""
    masked_lm_prob: float = 0.15
    """Fraction of tokens masked (dynamic masking: new masks every epoch)."""
    max_predictions_per_seq: int = 10
    """Most masked tokens per instance."""
    nsp: bool = True
    """Train next sentence prediction too."""
    dropout: float = 0.0
    """Dropout while pre-training (fine-tuning uses 0.1)."""
    batch_size: int = 32
    """Pre-training sequences per optimizer step (small: a short budget needs many updates)."""
    learning_rate: float = 5e-4
    """Peak pre-training learning rate."""
    warmup_ratio: float = 0.05
    """Warmup as a fraction of the budget; then linear decay to 0 at the end of the budget."""
    finetune_learning_rate: float = 3e-4
    """Fine-tuning learning rate (both initialisations)."""
    finetune_epochs: float = 5.0
    """Fine-tuning epochs; the best epoch on dev is kept."""
    finetune_batch_size: int = 32
    """Fine-tuning batch size."""
    train_examples: int | None = 1000
    """Labelled training examples used (a seeded subset of the bundled 4,000; few labels are where
    pre-training pays most, and it keeps fine-tuning short); None: all."""


@dataclass
class QuickstartConfig:
    """Where and how long; `recipe` says how."""

    output: Path
    """Directory for every stage's output and the report."""
    minutes: float | None = 10.0
    """Pre-training time budget in minutes (the schedule follows it)."""
    max_steps: int | None = None
    """Pre-training step budget instead of (or with) the time budget: deterministic, for comparisons."""
    seeds: tuple[int, ...] = (1, 2, 3)
    """Fine-tuning seeds, each run for both initialisations."""
    recipe: Recipe = field(default_factory=Recipe)
    eval_every: int = 50
    """Held-out pre-training evaluation every N steps (and at the end)."""
    eval_examples: int = 500
    """Pre-training instances held out for the MLM/NSP curves."""
    random_baseline: bool = True
    """Also fine-tune the same architecture from random initialisation."""
    overwrite: bool = False
    """Delete an existing non-empty output directory first."""
    resume: bool = False
    """Keep the stages already complete in the output directory and run the rest."""
    seed: int = 42
    """Seed of pre-training (initialisation, data order, masks)."""
    workers: int = 1
    """Processes for data creation."""
    device: str = "auto"
    """auto, cpu or cuda."""

    def validate(self) -> None:
        if self.minutes is None and self.max_steps is None:
            raise BertkitError("no pre-training budget: give --minutes (or a step budget)")
        if self.minutes is not None and not self.minutes > 0:
            raise BertkitError(f"--minutes must be positive, got {self.minutes}")
        if self.max_steps is not None and not self.max_steps > 0:
            raise BertkitError(f"--max-steps must be positive, got {self.max_steps}")
        if not self.seeds:
            raise BertkitError("--seeds: give at least one seed")
        if self.overwrite and self.resume:
            raise BertkitError("--overwrite and --resume contradict each other; pick one")
        train = self.recipe.train_examples
        if train is not None and train < 6:
            raise BertkitError(f"--train-examples must be at least 6 (one per label), got {train}")


Echo = Callable[[str], None]


# --- stages ---------------------------------------------------------------------------------------

def prepare_output(cfg: QuickstartConfig) -> None:
    """Create the output directory; refuse a non-empty one unless overwriting or resuming."""
    output = cfg.output
    if output.exists() and not output.is_dir():
        raise BertkitError(f"--output {output} is a file; give a directory")
    if output.is_dir() and any(output.iterdir()):
        if cfg.overwrite:
            _remove_stage_outputs(output)
        elif not cfg.resume:
            raise BertkitError(f"--output {output} is not empty; pass --resume to continue the run in it, "
                               "--overwrite to start over, or choose another directory")
    output.mkdir(parents=True, exist_ok=True)


def _remove_stage_outputs(output: Path) -> None:
    """Delete what a quickstart writes; refuse directories that do not look like one (user data)."""
    known = set(STAGE_OUTPUTS) | {REPORT_FILE, SUMMARY_FILE, TIMINGS_FILE, PRETRAIN_FIGURE, FINETUNE_FIGURE}
    foreign = sorted(p.name for p in output.iterdir() if p.name not in known)
    if foreign:
        raise BertkitError(f"--overwrite: {output} holds files a quickstart does not write "
                           f"({', '.join(foreign[:5])}); remove them yourself or choose another --output")
    for path in output.iterdir():
        shutil.rmtree(path) if path.is_dir() else path.unlink()


def train_vocabulary(cfg: QuickstartConfig, echo: Echo) -> Any:
    """vocab/: a WordPiece vocabulary trained on the bundled corpus (kept when resuming)."""
    from bertkit.tokenizer import WordPieceTokenizer

    directory = cfg.output / "vocab"
    if cfg.resume and (directory / "vocab.txt").is_file():
        echo(f"[1/5] vocabulary: kept {directory}")
        return WordPieceTokenizer.from_pretrained(directory)
    echo(f"[1/5] vocabulary: training {cfg.recipe.vocab_size:,} WordPiece tokens on the bundled corpus")
    tokenizer = WordPieceTokenizer.train([kjv_path("corpus.txt.gz")], vocab_size=cfg.recipe.vocab_size)
    tokenizer.save_pretrained(directory)
    return tokenizer


def build_data(cfg: QuickstartConfig, tokenizer: Any, echo: Echo) -> Path:
    """data/: dynamically masked pre-training instances (kept when resuming)."""
    from bertkit.data import PretrainingDataOptions, build_pretraining_data

    directory, recipe = cfg.output / "data", cfg.recipe
    if cfg.resume and (directory / "manifest.json").is_file():
        echo(f"[2/5] pre-training data: kept {directory}")
        return directory
    echo(f"[2/5] pre-training data: instances of up to {recipe.max_seq_length} tokens, "
         f"{recipe.masked_lm_prob:.0%} masked dynamically")
    options = PretrainingDataOptions(
        max_seq_length=recipe.max_seq_length, masked_lm_prob=recipe.masked_lm_prob,
        max_predictions_per_seq=recipe.max_predictions_per_seq, dupe_factor=1, masking="dynamic", seed=cfg.seed)
    build_pretraining_data([str(kjv_path("corpus.txt.gz"))], tokenizer, directory, options,
                           workers=cfg.workers, overwrite=cfg.resume)
    return directory


def pretrain_model(cfg: QuickstartConfig, echo: Echo) -> Path:
    """pretrain/: bert-mini pre-trained within the budget; returns pretrain/final (kept when resuming;
    an interrupted run continues from its newest checkpoint)."""
    from bertkit.tasks.pretraining import PretrainSettings, pretrain
    from bertkit.train import TrainConfig

    run, recipe = cfg.output / "pretrain", cfg.recipe
    final = run / "final"
    if cfg.resume and (final / "model.safetensors").is_file():
        echo(f"[3/5] pre-training: kept {final}")
        return final
    budget = " and ".join(filter(None, (f"{cfg.minutes:g} min" if cfg.minutes else "",
                                        f"{cfg.max_steps} steps" if cfg.max_steps else "")))
    echo(f"[3/5] pre-training {MODEL} for {budget}: batch {recipe.batch_size}, peak lr {recipe.learning_rate:g}, "
         f"{'MLM + NSP' if recipe.nsp else 'MLM only'}, dropout {recipe.dropout:g}")
    settings = PretrainSettings(data=str(cfg.output / "data"), model=MODEL, output=str(run),
                                tokenizer=str(cfg.output / "vocab"), nsp=recipe.nsp, dropout=recipe.dropout,
                                eval_examples=cfg.eval_examples, resume="auto" if cfg.resume else None,
                                device=cfg.device)
    train_config = TrainConfig(
        max_steps=cfg.max_steps, max_time_s=cfg.minutes * 60 if cfg.minutes else None,
        micro_batch_size=recipe.batch_size, learning_rate=recipe.learning_rate, warmup_ratio=recipe.warmup_ratio,
        seed=cfg.seed, eval_every=cfg.eval_every, save_every=max(cfg.eval_every, 200), keep_last=1)
    result = pretrain(settings, train_config)
    if result.stop_reason == "signal":
        raise Interrupted(f"quickstart stopped by {signal.Signals(result.signal).name} while pre-training, at "
                          f"step {result.step}; saved {result.checkpoint}", result.signal, "--resume")
    return final


def label_files(cfg: QuickstartConfig) -> tuple[Path, Path, Path]:
    """(train, dev, test) TSV paths; with recipe.train_examples, a seeded subset of train in labels/."""
    train, dev, test = (kjv_path(name) for name in ("train.tsv", "dev.tsv", "test.tsv"))
    count = cfg.recipe.train_examples
    if count is None:
        return train, dev, test
    header, *rows = train.read_text(encoding="utf-8").splitlines(keepends=True)
    if count > len(rows):
        raise BertkitError(f"--train-examples {count}: the bundled train.tsv has only {len(rows)} examples")
    subset = cfg.output / "labels" / f"train-{count}.tsv"
    subset.parent.mkdir(parents=True, exist_ok=True)
    chosen = sorted(random.Random(0).sample(range(len(rows)), count))  # the same subset in every run
    subset.write_text(header + "".join(rows[i] for i in chosen), encoding="utf-8")
    return subset, dev, test


def finetune_model(cfg: QuickstartConfig, model: str, name: str, echo: Echo) -> dict[str, Any]:
    """finetune-NAME/: the bundled classification task fine-tuned from `model` (a directory or the preset
    for random initialisation) once per seed, test accuracy at each seed's best dev epoch."""
    from bertkit.tasks.finetune import RESULTS_FILE, FinetuneConfig, run_finetuning

    output, recipe = cfg.output / f"finetune-{name}", cfg.recipe
    if cfg.resume and (output / RESULTS_FILE).is_file() and (output / "best").is_dir():
        echo(f"      kept {output}")
        return json.loads((output / RESULTS_FILE).read_text(encoding="utf-8"))
    train, dev, test = label_files(cfg)
    finetune_config = FinetuneConfig(
        model=model, output=output, tokenizer=str(cfg.output / "vocab"), epochs=recipe.finetune_epochs,
        batch_size=recipe.finetune_batch_size, learning_rate=recipe.finetune_learning_rate, seeds=cfg.seeds,
        device=cfg.device, resume=cfg.resume)  # finished seeds kept, an interrupted one continued
    options = {"text_column": "text", "label_column": "label", "max_seq_length": 128}
    try:
        return run_finetuning("classification", train, [dev, test], finetune_config, options)
    except Interrupted as exc:  # the whole quickstart stops; its own --resume continues it
        raise Interrupted(f"quickstart stopped: {exc}", exc.signum, "--resume") from None


def fill_mask_examples(final: Path, sentences: Sequence[str] = FILL_MASK_SENTENCES, top_k: int = 5
                       ) -> list[dict[str, Any]]:
    """The pre-trained model's top-k guesses for the [MASK] of each sentence."""
    from bertkit.serve.predictor import load_predictor

    predictor = load_predictor(final)
    guesses = predictor.fill_mask(list(sentences), top_k=top_k)
    return [{"text": text, "top": [(c["token"], round(c["score"], 4)) for c in per_text[0]]}
            for text, per_text in zip(sentences, guesses)]


# --- the whole run --------------------------------------------------------------------------------

def run_quickstart(cfg: QuickstartConfig, echo: Echo = print) -> dict[str, Any]:
    """Every stage in order; writes quickstart.json, the figures and report.md; returns the summary."""
    cfg.validate()
    machine = machine_info()  # before any stage can change the process (threads, device state)
    prepare_output(cfg)
    label_files(cfg)  # a bad --train-examples fails now, not after pre-training
    timings = StageClock(cfg.output / TIMINGS_FILE)
    with timings.stage("vocabulary_and_data_s"):
        tokenizer = train_vocabulary(cfg, echo)
        build_data(cfg, tokenizer, echo)
    with timings.stage("pretraining_s"):
        final = pretrain_model(cfg, echo)
    runs = "from the pre-trained model" + (" and from random initialisation" if cfg.random_baseline else "")
    echo(f"[4/5] fine-tuning on the bundled task, {_plural(len(cfg.seeds), 'seed')} "
         f"{', '.join(map(str, cfg.seeds))}: {runs}")
    with timings.stage("finetuning_s"):
        finetuned = {"pretrained": finetune_model(cfg, str(final), "pretrained", echo)}
        if cfg.random_baseline:
            finetuned["random"] = finetune_model(cfg, MODEL, "random", echo)
    echo("[5/5] fill-mask examples and report")
    summary = summarize(cfg, finetuned, fill_mask_examples(final), timings.totals, machine)
    (cfg.output / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    report = write_report(cfg.output, summary)
    echo(comparison_lines(summary))
    echo(f"report: {report}")
    return summary


class StageClock:
    """Wall time per stage, added up over every run of the same output directory (kept in timings.json,
    written after each stage, so an interrupted stage's time counts too)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self.totals: dict[str, float] = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            self.totals = {}

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.totals[name] = self.totals.get(name, 0.0) + time.perf_counter() - started
            write_text_atomic(self.path, json.dumps(self.totals, indent=2) + "\n")


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


def summarize(cfg: QuickstartConfig, finetuned: dict[str, dict[str, Any]], fill_mask: list[dict[str, Any]],
              timings: dict[str, float], machine: dict[str, Any] | None = None) -> dict[str, Any]:
    """Everything the report shows, as JSON-ready data (quickstart.json)."""
    from bertkit.train.reporting import read_metrics

    records = read_metrics(cfg.output / "pretrain" / "metrics.jsonl")
    train = [r for r in records if r.get("kind") == "train"]
    evals = [r for r in records if r.get("kind") == "eval"]
    manifest = json.loads((cfg.output / "data" / "manifest.json").read_text(encoding="utf-8"))
    return {
        "config": {**{k: v for k, v in asdict(cfg).items() if k not in ("output", "recipe")},
                   "output": str(cfg.output)},
        "recipe": asdict(cfg.recipe),
        "machine": machine or machine_info(),
        "timings": {k: round(v, 1) for k, v in timings.items()},
        "pretraining": {"steps": len(train), "elapsed_s": train[-1]["elapsed_s"] if train else 0.0,
                        "instances": manifest["num_instances"],
                        "final_eval": {k: v for k, v in (evals[-1] if evals else {}).items() if k != "kind"}},
        "finetuning": {name: seed_table(results) for name, results in finetuned.items()},
        "fill_mask": fill_mask,
    }


def seed_table(results: dict[str, Any]) -> dict[str, Any]:
    """Per seed dev/test accuracy (at the seed's best dev epoch) and their mean ± sample std."""
    seeds = {seed: {"dev": m["accuracy"], "test": m["test_accuracy"], "step": m.get("step")}
             for seed, m in results["seeds"].items()}
    table: dict[str, Any] = {"seeds": seeds}
    for split in ("dev", "test"):
        values = [s[split] for s in seeds.values()]
        table[split] = {"mean": statistics.fmean(values),
                        "std": statistics.stdev(values) if len(values) > 1 else 0.0}
    return table


def comparison_lines(summary: dict[str, Any]) -> str:
    """Plain-text lines of the comparison for the terminal."""
    lines = []
    for name, table in summary["finetuning"].items():
        seeds = len(table["seeds"])
        lines.append(f"{name:>10}: dev accuracy {_pm(table['dev'], seeds)}, test accuracy "
                     f"{_pm(table['test'], seeds)} ({_plural(seeds, 'seed')})")
    verdict = pretraining_verdict(summary)
    return "\n".join(lines + ([verdict] if verdict else []))


def _pm(stats: dict[str, float], seeds: int) -> str:
    """Mean ± sample std over seeds; one seed has no spread to show."""
    spread = f" ± {100 * stats['std']:.1f}" if seeds > 1 else ""
    return f"{100 * stats['mean']:.1f}{spread}%"


def pretraining_verdict(summary: dict[str, Any]) -> str | None:
    """A plain sentence when pre-training was too short to be expected to help (None otherwise)."""
    steps = summary["pretraining"]["steps"]
    if steps >= MIN_HELPFUL_STEPS:
        return None
    return (f"Pre-training ran {_plural(steps, 'step')}: below the ~{MIN_HELPFUL_STEPS:,} where a gain appears "
            f"(docs/quickstart.md), so the pre-trained model is not expected to beat random initialisation; "
            f"give it more with --max-steps 2500 (a step budget, however busy the machine) or a larger --minutes.")


def machine_info() -> dict[str, Any]:
    """What the numbers were measured on."""
    import bertkit

    from bertkit.train.distributed import resolve_device
    from bertkit.train.loop import resolve_precision

    return {"cpus": os.cpu_count(), "precision": resolve_precision("auto", resolve_device("auto")), "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
            "python": platform.python_version(), "platform": platform.platform(),
            "bertkit": getattr(bertkit, "__version__", "unknown"),
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


# --- figures and report ---------------------------------------------------------------------------

def plot_pretraining(run: Path, png: Path, by_step: bool = False) -> Path:
    """Held-out MLM and NSP accuracy (right) and MLM loss (left) against minutes of training (or steps:
    the comparable axis when the machine was shared and minutes depend on the load)."""
    from bertkit.train.reporting import read_metrics

    records = read_metrics(run / "metrics.jsonl")
    x_of_step = {r["step"]: r["step"] if by_step else r["elapsed_s"] / 60 for r in records if r.get("kind") == "train"}
    evals = [r for r in records if r.get("kind") == "eval" and r["step"] in x_of_step]
    train = [r for r in records if r.get("kind") == "train"]
    plt = _pyplot()
    figure, (loss_axis, accuracy_axis) = plt.subplots(1, 2, figsize=(11, 4))
    loss_axis.plot([x_of_step[r["step"]] for r in train], [r["mlm_loss"] for r in train], color="C0", alpha=0.3,
                   label="train MLM loss")
    loss_axis.plot([x_of_step[r["step"]] for r in evals], [r["mlm_loss"] for r in evals], "o-", color="C0",
                   label="held-out MLM loss")
    for key, color in (("mlm_accuracy", "C1"), ("nsp_accuracy", "C2")):
        points = [(x_of_step[r["step"]], 100 * r[key]) for r in evals if key in r]
        if points:
            accuracy_axis.plot(*zip(*points), "o-", color=color, label=f"held-out {key.split('_')[0].upper()} accuracy")
    for axis, title in ((loss_axis, "MLM loss"), (accuracy_axis, "held-out accuracy (%)")):
        axis.set_xlabel("optimizer step" if by_step else "minutes of pre-training")
        axis.set_title(title)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    return _save(figure, png)


def plot_finetuning(output: Path, names: Sequence[str], png: Path) -> Path:
    """Dev accuracy after every fine-tuning epoch, each seed a line, one colour per initialisation."""
    from bertkit.train.reporting import read_metrics

    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(6.5, 4))
    for color, name in zip(("C3", "C7"), names):
        for index, seed_dir in enumerate(sorted((output / f"finetune-{name}").glob("seed-*"))):
            evals = [r for r in read_metrics(seed_dir / "metrics.jsonl") if r.get("kind") == "eval"]
            steps_per_epoch = evals[0]["step"] if evals else 1
            axis.plot([r["step"] / steps_per_epoch for r in evals], [100 * r["accuracy"] for r in evals], "o-",
                      color=color, alpha=0.8, label=f"{name} initialisation" if index == 0 else None)
    axis.set_xlabel("epoch")
    axis.set_ylabel("dev accuracy (%)")
    axis.set_title("fine-tuning on the bundled task (one line per seed)")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    return _save(figure, png)


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(figure: Any, png: Path) -> Path:
    figure.tight_layout()
    figure.savefig(png, dpi=110)
    _pyplot().close(figure)
    return png


def write_report(output: Path, summary: dict[str, Any]) -> Path:
    """report.md (with pretraining.png and finetuning.png beside it) from the summary."""
    plot_pretraining(output / "pretrain", output / PRETRAIN_FIGURE)
    plot_finetuning(output, list(summary["finetuning"]), output / FINETUNE_FIGURE)
    sections = [_report_header(summary), _report_pretraining(summary), _report_fill_mask(summary),
                _report_finetuning(summary), _report_reuse(output)]
    path = output / REPORT_FILE
    path.write_text("\n\n".join(sections) + "\n", encoding="utf-8")
    return path


def _report_header(summary: dict[str, Any]) -> str:
    machine, timings = summary["machine"], summary["timings"]
    return (f"# bertkit quickstart report\n\n"
            f"{MODEL} pre-trained on the bundled King James Bible, then fine-tuned on the bundled 6-way task "
            f"\"which part of the Bible is this verse from\" - "
            + ("once from the pre-trained weights and once from random initialisation, with the same recipe "
               "and seeds.\n\n" if "random" in summary["finetuning"] else "from the pre-trained weights.\n\n")
            + f"Machine: {machine['cpus']} CPUs, {machine['torch_threads']} torch threads, precision "
            f"{machine['precision']}, torch {machine['torch']}, Python {machine['python']}"
            f"{', GPU ' + machine['cuda'] if machine['cuda'] else ''}.  \n"
            f"Time: vocabulary + data {timings['vocabulary_and_data_s']:.0f} s, pre-training "
            f"{timings['pretraining_s']:.0f} s, fine-tuning {timings['finetuning_s']:.0f} s.\n\n"
            f"Recipe: `{json.dumps(summary['recipe'])}`")


def _report_pretraining(summary: dict[str, Any]) -> str:
    pre = summary["pretraining"]
    final = pre["final_eval"]
    accuracies = f"MLM accuracy **{100 * final.get('mlm_accuracy', 0):.1f}%**"
    if "nsp_accuracy" in final:
        accuracies += f", NSP accuracy **{100 * final['nsp_accuracy']:.1f}%**"
    rate = pre["steps"] / max(pre["elapsed_s"], 1e-9)
    return (f"## Pre-training\n\n{pre['steps']:,} steps in {pre['elapsed_s'] / 60:.1f} min ({rate:.2f} steps/s) on "
            f"{pre['instances']:,} instances. Held-out at the end: MLM loss {final.get('mlm_loss', float('nan')):.3f}, "
            f"{accuracies}. (docs/quickstart.md: about 2,600 steps fit in 10 minutes of two free cores, "
            f"and a busy machine fits fewer; --max-steps sets a step budget instead.)\n\n"
            f"![pre-training curves]({PRETRAIN_FIGURE})")


def _report_fill_mask(summary: dict[str, Any]) -> str:
    rows = ["| sentence | top 5 guesses for [MASK] (probability) |", "|---|---|"]
    for item in summary["fill_mask"]:
        guesses = ", ".join(f"{token} ({score:.3f})" for token, score in item["top"])
        rows.append(f"| {item['text']} | {guesses} |")
    return "## Fill-mask with the pre-trained model\n\n" + "\n".join(rows)


def _report_finetuning(summary: dict[str, Any]) -> str:
    tables = summary["finetuning"]
    names = list(tables)
    seeds = list(tables[names[0]]["seeds"])
    header = "| seed | " + " | ".join(f"{n} dev | {n} test" for n in names) + " |"
    rows = [header, "|---" * (1 + 2 * len(names)) + "|"]
    for seed in seeds:
        cells = [f"{100 * tables[n]['seeds'][seed][split]:.1f}" for n in names for split in ("dev", "test")]
        rows.append(f"| {seed} | " + " | ".join(cells) + " |")
    label = "**mean ± std**" if len(seeds) > 1 else "**mean**"
    rows.append(f"| {label} | " + " | ".join(f"**{_pm(tables[n][split], len(seeds))}**" for n in names
                                             for split in ("dev", "test")) + " |")
    recipe = summary["recipe"]
    train = recipe["train_examples"] or 4000
    title = "Fine-tuning: pre-trained vs random initialisation" if "random" in tables else "Fine-tuning"
    text = (f"## {title}\n\n{train:,} labelled training verses, "
            f"{recipe['finetune_epochs']:g} epochs, lr {recipe['finetune_learning_rate']:g}, batch "
            f"{recipe['finetune_batch_size']}; accuracy (%) at each seed's best dev epoch, test at that epoch "
            f"(dev and test chapters never appear in the pre-training text).\n\n" + "\n".join(rows))
    if "random" in tables and "pretrained" in tables:
        gain = {s: 100 * (tables["pretrained"][s]["mean"] - tables["random"][s]["mean"]) for s in ("dev", "test")}
        text += (f"\n\nGain from pre-training: {gain['dev']:+.1f} points on dev, {gain['test']:+.1f} points on "
                 f"test (difference of the means).")
    else:
        text += "\n\nNo random-initialisation baseline was trained (--no-baseline), so no gain is computed."
    verdict = pretraining_verdict(summary)
    if verdict:
        text += f"\n\n**{verdict}**"
    return text + f"\n\n![fine-tuning curves]({FINETUNE_FIGURE})"


def _report_reuse(output: Path) -> str:
    return (f"## Reuse the outputs\n\n```\n"
            f"bertkit pretrain --data {output}/data --init-from {output}/pretrain/final --output more/ --max-time 1h\n"
            f"bertkit finetune classification --model {output}/pretrain/final --train my.tsv --dev my_dev.tsv "
            f"--output mine/\n"
            f"bertkit predict --model {output}/finetune-pretrained/best --input verses.jsonl --output preds/\n"
            f"bertkit serve --model {output}/pretrain/final\n```")
