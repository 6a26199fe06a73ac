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
import logging
import os
import platform
import random
import shutil
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, cast

import torch

from bertkit.assets import kjv_path
from bertkit.errors import BertkitError, Interrupted
from bertkit.io.atomic import check_writable, write_text_atomic
from bertkit.io.jsonfile import finite_number, read_json_object
from bertkit.quickstart.config import MODEL, QuickstartSettings
from bertkit.quickstart.load import fastest_rates, machine_load
from bertkit.quickstart.plan import FinetuneWork, Rates, TimePlan, plan_time
from bertkit.quickstart.report import (
    FINETUNE_FIGURE,
    PRETRAIN_FIGURE,
    REPORT_FILE,
    comparison_lines,
    majority_class,
    plural,
    seed_table,
    write_figures,
    write_report,
)
from bertkit.runtime.device import apply_threads
from bertkit.workflows.recipe_notes import long_input_task_note

log = logging.getLogger(__name__)

SUMMARY_FILE = "quickstart.json"
TIMINGS_FILE = "timings.json"
PLAN_FILE = "plan.json"
FILL_MASK_SENTENCES = (
    "In the beginning God created the [MASK] and the earth.",
    "And God said, Let there be [MASK]: and there was light.",
    "The Lord is my [MASK]; I shall not want.",
    "For God so loved the [MASK], that he gave his only begotten Son.",
    "And the children of [MASK] went up out of the land of Egypt.",
)
STAGE_OUTPUTS = ("vocab", "data", "pretrain", "labels", "finetune-pretrained", "finetune-random")


Echo = Callable[[str], None]


# --- stages ---------------------------------------------------------------------------------------

def prepare_output(settings: QuickstartSettings) -> None:
    """Create the output directory; refuse a non-empty one unless overwriting or resuming."""
    output = settings.output
    if output.exists() and not output.is_dir():
        raise BertkitError(f"--output {output} is a file; give a directory")
    check_writable(output, "--output")
    if output.is_dir() and any(output.iterdir()):
        if settings.overwrite:
            _remove_stage_outputs(output)
        elif not settings.resume:
            raise BertkitError(f"--output {output} is not empty; pass --resume to continue the run in it, "
                               "--overwrite to start over, or choose another directory")
    output.mkdir(parents=True, exist_ok=True)


def _remove_stage_outputs(output: Path) -> None:
    """Delete what a quickstart writes; refuse directories that do not look like one (user data)."""
    known = set(STAGE_OUTPUTS) | {REPORT_FILE, SUMMARY_FILE, TIMINGS_FILE, PLAN_FILE, PRETRAIN_FIGURE, FINETUNE_FIGURE}
    foreign = sorted(p.name for p in output.iterdir() if p.name not in known)
    if foreign:
        raise BertkitError(f"--overwrite: {output} holds files a quickstart does not write "
                           f"({', '.join(foreign[:5])}); remove them yourself or choose another --output")
    for path in output.iterdir():
        shutil.rmtree(path) if path.is_dir() else path.unlink()


def train_vocabulary(settings: QuickstartSettings, echo: Echo) -> Any:
    """vocab/: a WordPiece vocabulary trained on the bundled corpus (kept when resuming)."""
    from bertkit.tokenizer import WordPieceTokenizer

    directory = settings.output / "vocab"
    if settings.resume and (directory / "vocab.txt").is_file():
        echo(f"[1/5] vocabulary: kept {directory}")
        return WordPieceTokenizer.from_pretrained(directory)
    echo(f"[1/5] vocabulary: training {settings.recipe.vocab_size:,} WordPiece tokens on the bundled corpus")
    tokenizer = WordPieceTokenizer.train([kjv_path("corpus.txt.gz")], vocab_size=settings.recipe.vocab_size)
    tokenizer.save_pretrained(directory)
    return tokenizer


def build_data(settings: QuickstartSettings, tokenizer: Any, echo: Echo) -> Path:
    """data/: dynamically masked pre-training instances (kept when resuming)."""
    from bertkit.data import InstanceSettings, build_pretraining_data
    from bertkit.settings import PretrainingDataSettings

    directory, recipe = settings.output / "data", settings.recipe.resolved()
    if settings.resume and (directory / "manifest.json").is_file():
        echo(f"[2/5] pre-training data: kept {directory}")
        return directory
    echo(f"[2/5] pre-training data: instances of up to {recipe.max_seq_length} tokens, "
         f"{recipe.masked_lm_prob:.0%} masked dynamically")
    assert recipe.max_seq_length is not None and recipe.masked_lm_prob is not None  # resolved
    options = InstanceSettings(
        max_seq_length=recipe.max_seq_length, masked_lm_prob=recipe.masked_lm_prob,
        max_predictions_per_seq=recipe.prediction_cap, dupe_factor=1, masking="dynamic", seed=settings.seed)
    build_pretraining_data(PretrainingDataSettings(
        (str(kjv_path("corpus.txt.gz")),), "(in memory)", str(directory), workers=settings.workers,
        overwrite=settings.resume, instances=options), tokenizer)
    return directory


def pretrain_model(settings: QuickstartSettings, echo: Echo, seconds: float | None = None,
                   steps: float | None = None) -> Path:
    """pretrain/: bert-mini pre-trained for `seconds` (the plan's share) or settings.max_steps with `bertkit
    pretrain --recipe short`, the recipe's fields the quickstart's Recipe sets kept; returns pretrain/final (kept
    when resuming; an interrupted run continues from its newest checkpoint). `steps`: the budget in steps the
    plan expects; the objective (NSP or masked LM only, `recipes.short_recipe`) is decided on it here and passed
    on, so the line that says the recipe and the run agree (the planner's own rate measurement could differ)."""
    from bertkit.settings import PretrainSettings
    from bertkit.train import TrainConfig
    from bertkit.workflows.pretrain import pretrain

    run, recipe, shown = settings.output / "pretrain", settings.recipe, settings.recipe.resolved(steps)
    final = run / "final"
    if settings.resume and (final / "model.safetensors").is_file():
        echo(f"[3/5] pre-training: kept {final}")
        return final
    budget = f"{settings.max_steps} steps" if settings.max_steps else f"{seconds:.0f} s"
    echo(f"[3/5] pre-training {MODEL} for {budget} (the short recipe): batch {shown.batch_size}, peak lr "
         f"{shown.learning_rate:g}, {'MLM + NSP' if shown.nsp else 'MLM only'}, dropout {shown.dropout:g}")
    what = PretrainSettings(data=str(settings.output / "data"), model=MODEL, output=str(run),
                            tokenizer=str(settings.output / "vocab"), recipe="short",
                            nsp=recipe.nsp if settings.resume else shown.nsp,  # resumed: the run's recorded one
                            dropout=recipe.dropout, max_seq_length=recipe.max_seq_length,
                            masked_lm_prob=recipe.masked_lm_prob, eval_examples=settings.eval_examples,
                            resume="auto" if settings.resume else None)
    train = TrainConfig(  # None: the recipe decides (bertkit.workflows.pretrain_plan, as `bertkit pretrain`)
        max_steps=settings.max_steps, max_time_s=None if settings.max_steps else seconds,
        global_batch_size=recipe.batch_size, learning_rate=recipe.learning_rate, warmup_ratio=recipe.warmup_ratio,
        seed=settings.seed, eval_every=settings.eval_every, save_every=max(settings.eval_every, 200), keep_last=1,
        device=settings.device)
    result = pretrain(what, train)
    if result.stop_reason == "signal" and result.signal is not None:
        raise Interrupted(f"quickstart stopped by {signal.Signals(result.signal).name} while pre-training, at "
                          f"step {result.step}; saved {result.checkpoint}", result.signal, "--resume")
    return final


def label_files(settings: QuickstartSettings) -> tuple[Path, Path, Path]:
    """(train, dev, test) TSV paths; with recipe.train_examples, a seeded subset of train in labels/."""
    train, dev, test = (kjv_path(name) for name in ("train.tsv", "dev.tsv", "test.tsv"))
    count = settings.recipe.train_examples
    if count is None:
        return train, dev, test
    header, *rows = train.read_text(encoding="utf-8").splitlines(keepends=True)
    if count > len(rows):
        raise BertkitError(f"--train-examples {count}: the bundled train.tsv has only {len(rows)} examples")
    subset = settings.output / "labels" / f"train-{count}.tsv"
    subset.parent.mkdir(parents=True, exist_ok=True)
    chosen = sorted(random.Random(0).sample(range(len(rows)), count))  # the same subset in every run
    subset.write_text(header + "".join(rows[i] for i in chosen), encoding="utf-8")
    return subset, dev, test


def finetune_model(settings: QuickstartSettings, model: str, name: str, echo: Echo, epochs: float | None = None,
                   seeds: tuple[int, ...] | None = None) -> dict[str, Any]:
    """finetune-NAME/: the bundled classification task fine-tuned from `model` (a directory or the preset
    for random initialisation) once per seed, test accuracy at each seed's best dev epoch; `epochs` and
    `seeds` as planned (default: the recipe's and the config's)."""
    from bertkit.settings import FinetuneSettings, finetune_training
    from bertkit.workflows.finetune import run_finetuning
    from bertkit.workflows.predict import RESULTS_FILE

    output, recipe = settings.output / f"finetune-{name}", settings.recipe
    if settings.resume and (output / RESULTS_FILE).is_file() and (output / "best").is_dir():
        echo(f"      kept {output}")
        return read_json_object(output / RESULTS_FILE)
    train, dev, test = label_files(settings)
    how = FinetuneSettings(
        model=model, output=output, tokenizer=str(settings.output / "vocab"), seeds=seeds or settings.seeds,
        resume=settings.resume,  # finished seeds kept, an interrupted one continued
        compare_random_init="off",  # the quickstart fine-tunes random initialisation itself, and reports both
        train=finetune_training(num_epochs=epochs or recipe.finetune_epochs, batch_size=recipe.finetune_batch_size,
                                learning_rate=recipe.finetune_learning_rate, device=settings.device))
    task_settings = {"text_column": "text", "label_column": "label", "max_seq_length": 128}
    try:
        return run_finetuning("classification", train, [dev, test], how, task_settings)
    except Interrupted as exc:  # the whole quickstart stops; its own --resume continues it
        raise Interrupted(f"quickstart stopped: {exc}", exc.signum, "--resume") from None


def fill_mask_examples(final: Path, sentences: Sequence[str] = FILL_MASK_SENTENCES, top_k: int = 5
                       ) -> list[dict[str, Any]]:
    """The pre-trained model's top-k guesses for the [MASK] of each sentence."""
    from bertkit.serve.predictor import FillMaskPredictor, load_predictor

    predictor = cast(FillMaskPredictor, load_predictor(final))  # a pre-trained directory: the masked-LM head
    guesses = predictor.fill_mask(list(sentences), top_k=top_k)
    return [{"text": text, "top": [(c["token"], round(c["score"], 4)) for c in per_text[0]]}
            for text, per_text in zip(sentences, guesses)]


# --- the whole run --------------------------------------------------------------------------------

def run_quickstart(settings: QuickstartSettings, echo: Echo = print) -> dict[str, Any]:
    """Every stage in order; writes quickstart.json, the figures and report.md; returns the summary."""
    started = time.perf_counter()
    apply_threads(settings.threads)
    machine = machine_info(settings.device)  # before any stage can change the process (device state)
    prepare_output(settings)
    label_files(settings)  # a bad --train-examples fails now, not after pre-training
    timings = StageClock(settings.output / TIMINGS_FILE)
    timings.add("setup_s", time.perf_counter() - started)
    with timings.stage("vocabulary_and_data_s"):
        tokenizer = train_vocabulary(settings, echo)
        build_data(settings, tokenizer, echo)
    plan = None if settings.max_steps else time_plan(settings, tokenizer, timings, echo)
    say_long_inputs(settings, tokenizer, plan, echo)
    epochs, seeds = (plan.finetune_epochs, plan.seeds) if plan else (settings.recipe.finetune_epochs, settings.seeds)
    with timings.stage("pretraining_s"):
        final = pretrain_model(settings, echo, plan.pretrain_s if plan else None, planned_steps(settings, plan))
    runs = "from the pre-trained model" + (" and from random initialisation" if settings.random_baseline else "")
    echo(f"[4/5] fine-tuning on the bundled task, {epochs:g} epochs, {plural(len(seeds), 'seed')} "
         f"{', '.join(map(str, seeds))}: {runs}")
    with timings.stage("finetuning_s"):
        finetuned = {"pretrained": finetune_model(settings, str(final), "pretrained", echo, epochs, seeds)}
        if settings.random_baseline:
            finetuned["random"] = finetune_model(settings, MODEL, "random", echo, epochs, seeds)
    echo("[5/5] fill-mask examples and report")
    with timings.stage("report_s"):  # the slow part of the report (figures) inside, so the total below is whole
        examples = fill_mask_examples(final)
        write_figures(settings.output, list(finetuned), majority_class(_column(kjv_path("dev.tsv"), 1)))
    summary = summarize(settings, finetuned, examples, timings.totals, machine, plan, epochs)
    write_text_atomic(settings.output / SUMMARY_FILE, json.dumps(summary, indent=2) + "\n")
    report = write_report(settings.output, summary, figures=False)
    echo(comparison_lines(summary))
    # One total, the report's: every stage of every run of this output directory (a resumed run adds its own).
    budget = f" of the {settings.minutes:g}-minute budget" if plan else ""
    this_run = f"; this run {(time.perf_counter() - started) / 60:.1f} min" if settings.resume else ""
    echo(f"report: {report} (the whole command took {sum(timings.totals.values()) / 60:.1f} min{budget}{this_run})")
    return summary


class StageClock:
    """Wall time per stage, added up over every run of the same output directory (kept in timings.json,
    written after each stage, so an interrupted stage's time counts too)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        kept = read_json_object(path, missing={}, damaged={})
        self.totals: dict[str, float] = {name: seconds for name, seconds in kept.items()
                                          if finite_number(seconds, 0)}
        if len(self.totals) < len(kept):  # an edit: the report counts the stages it can
            log.warning("%s: %s not seconds bertkit wrote; left out of the run's times", path,
                        ", ".join(sorted(set(kept) - set(self.totals))))

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - started)

    def add(self, name: str, seconds: float) -> None:
        """Count `seconds` more to stage `name`, and keep the totals."""
        self.totals[name] = self.totals.get(name, 0.0) + seconds
        write_text_atomic(self.path, json.dumps(self.totals, indent=2) + "\n")


def time_plan(settings: QuickstartSettings, tokenizer: Any, timings: StageClock, echo: Echo) -> TimePlan:
    """The split of --minutes (plan.py), from rates measured now (the probe's time counted as its own stage,
    `speed_probe_s`); a resumed run keeps its first plan."""
    path = settings.output / PLAN_FILE
    if settings.resume and path.is_file():
        try:
            plan = TimePlan.from_json(read_json_object(path))
            echo(f"      time plan (kept from the first run): {plan.describe()}")
            return plan
        except BertkitError as exc:
            echo(f"      {path}: {str(exc).removeprefix(f'{path}: ')}; planned again")
    train, dev, test = label_files(settings)
    lengths = [len(ids) + 2 for ids in tokenizer.encode_ids(_texts(train))]  # + [CLS], [SEP]
    before, cpu = timings.totals.get("speed_probe_s", 0.0), time.process_time()
    with timings.stage("speed_probe_s"):
        rates = measure_rates(settings, tokenizer.vocab_size, int(min(128, sorted(lengths)[3 * len(lengths) // 4])))
    probe_s = timings.totals["speed_probe_s"] - before
    load = machine_load(time.process_time() - cpu, probe_s, torch.get_num_threads())
    work = FinetuneWork(runs_per_seed=2 if settings.random_baseline else 1, train_examples=len(lengths),
                        batch_size=settings.recipe.finetune_batch_size,
                        eval_examples=len(_texts(dev)) + len(_texts(test)))
    assert settings.minutes is not None, "a time plan is made only without --max-steps (validate: then minutes)"
    plan = plan_time(settings.minutes * 60, sum(timings.totals.values()), rates, work, settings.recipe.finetune_epochs,
                     settings.seeds, settings.epochs_fixed, settings.seeds_fixed, uncertainty=load.uncertainty,
                     load=load.describe(), probe_s=probe_s)
    write_text_atomic(path, json.dumps(plan.to_json(), indent=2) + "\n")
    echo(f"      time plan: {plan.describe()}")
    if plan.warning:
        echo(f"      warning: {plan.warning}")
    return plan


def planned_steps(settings: QuickstartSettings, plan: TimePlan | None) -> float | None:
    """The pre-training budget in optimizer steps: --max-steps, or the time plan's share at its measured rate."""
    if plan is None:
        return settings.max_steps
    return plan.pretrain_s * plan.rates.pretrain_steps_per_s * plan.speedup


def say_long_inputs(settings: QuickstartSettings, tokenizer: Any, plan: TimePlan | None, echo: Echo) -> None:
    """Say up front, before pre-training, when most of the task's training inputs are longer than the instances
    pre-training trains on and its budget was measured too short to pay on such inputs
    (`recipe_notes.long_input_task_note`; the bundled verses are short: a median of 32 tokens)."""
    lengths = [len(ids) + 2 for ids in tokenizer.encode_ids(_texts(label_files(settings)[0]))]  # + [CLS], [SEP]
    steps = planned_steps(settings, plan)
    note = long_input_task_note(settings.recipe.resolved().max_seq_length, lengths, steps)
    if note:
        echo(f"      warning: {note}")


def _texts(tsv: Path) -> list[str]:
    """The text column of a bundled TSV (header: text, label)."""
    return _column(tsv, 0)


def _column(tsv: Path, index: int) -> list[str]:
    """Column `index` of a bundled TSV (header: text, label)."""
    return [line.split("\t")[index] for line in tsv.read_text(encoding="utf-8").splitlines()[1:] if line]


def measure_rates(settings: QuickstartSettings, vocab_size: int, finetune_length: int) -> Rates:
    """Pre-training steps/s at the recipe's shape, fine-tuning steps/s and evaluation examples/s at the
    task's typical length, on this machine now: each the fastest of a few short probes (quickstart/load.py)."""
    return fastest_rates(lambda: probe_rates(settings, vocab_size, finetune_length))


def probe_rates(settings: QuickstartSettings, vocab_size: int, finetune_length: int, seconds: float = 0.75) -> Rates:
    """One probe of measure_rates' three rates, timing each for about `seconds` (evaluation a third)."""
    import torch.nn.functional as F

    from bertkit.config import preset
    from bertkit.model import BertForSequenceClassification, accelerate_for_inference
    from bertkit.runtime.device import resolve_device
    from bertkit.train.throughput import inference_batches_per_second, training_steps_per_second
    from bertkit.workflows.pretrain_plan import measure_steps_per_second

    recipe, device = settings.recipe.resolved(), resolve_device(settings.device)
    assert recipe.max_seq_length and recipe.batch_size and recipe.masked_lm_prob is not None  # resolved
    pretrain = measure_steps_per_second(preset(MODEL, vocab_size=vocab_size), recipe.max_seq_length,
                                        recipe.batch_size, "auto", settings.device, seconds,
                                        masked_lm_prob=recipe.masked_lm_prob)
    config = preset(MODEL, vocab_size=vocab_size, num_labels=6)
    ids = torch.randint(5, vocab_size, (recipe.finetune_batch_size, finetune_length),
                        generator=torch.Generator().manual_seed(0))
    batch = {"input_ids": ids, "token_type_ids": torch.zeros_like(ids), "attention_mask": torch.ones_like(ids)}
    labels = torch.zeros(len(ids), dtype=torch.int64)

    def loss(model: Any, inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        return F.cross_entropy(model(**inputs).logits.float(), labels.to(inputs["input_ids"].device)), {}

    finetune = training_steps_per_second(lambda: BertForSequenceClassification(config), loss, batch, "auto", device,
                                         seconds)
    evaluate = inference_batches_per_second(  # as fine-tuning evaluates: an accelerated copy
        lambda: accelerate_for_inference(BertForSequenceClassification(config).to(device)), batch, device, seconds / 3)
    return Rates(pretrain, finetune, evaluate * len(ids))


def summarize(settings: QuickstartSettings, finetuned: dict[str, dict[str, Any]], fill_mask: list[dict[str, Any]],
              timings: dict[str, float], machine: dict[str, Any] | None = None, plan: TimePlan | None = None,
              finetune_epochs: float | None = None) -> dict[str, Any]:
    """Everything the report shows, as JSON-ready data (quickstart.json)."""
    from bertkit.train.reporting import read_metrics

    records = read_metrics(settings.output / "pretrain" / "metrics.jsonl")
    train = [r for r in records if r.get("kind") == "train"]
    evals = [r for r in records if r.get("kind") == "eval"]
    manifest = read_json_object(settings.output / "data" / "manifest.json")
    return {
        "model": MODEL,
        "config": {**{k: v for k, v in asdict(settings).items() if k not in ("output", "recipe")},
                   "output": str(settings.output)},
        "recipe": {**asdict(settings.recipe.resolved(planned_steps(settings, plan))),
                   "finetune_epochs": finetune_epochs or settings.recipe.finetune_epochs},
        "plan": plan.to_json() if plan else None,
        "machine": machine or machine_info(),
        "timings": {k: round(v, 1) for k, v in timings.items()},
        "pretraining": {"steps": len(train), "elapsed_s": train[-1]["elapsed_s"] if train else 0.0,
                        "instances": manifest["num_instances"],
                        "final_eval": {k: v for k, v in (evals[-1] if evals else {}).items() if k != "kind"}},
        "finetuning": {name: seed_table(results) for name, results in finetuned.items()},
        "dev_majority": majority_class(_column(kjv_path("dev.tsv"), 1)),  # the dashed line of the figure
        "fill_mask": fill_mask,
    }


def machine_info(device: str = "auto") -> dict[str, Any]:
    """What the numbers were measured on, and the precision `auto` runs bert-mini in here."""
    import bertkit
    from bertkit.config import preset
    from bertkit.runtime import probe
    from bertkit.runtime.device import resolve_device

    precision = probe.auto_precision(resolve_device(device), preset(MODEL).hidden_size, purpose="training")
    return {"cpus": os.cpu_count(), "precision": precision, "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__, "python": platform.python_version(), "platform": platform.platform(),
            "bertkit": getattr(bertkit, "__version__", "unknown"),
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
