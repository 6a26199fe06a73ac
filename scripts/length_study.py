"""The length study of docs/pretraining.md (issue 48): does the short-budget recipe pay on tasks with long inputs,
and does ending it at the data's full length fix what 64-token steps leave untrained?

    python scripts/length_study.py run --root /tmp/length-study --data /tmp/study-data --gcide /tmp/gcide \
        --rate-64 2.2 --rate-128 1.06
    python scripts/study_finetune.py table /tmp/length-study/results.jsonl

Families (each pre-trained on its own domain's unlabeled text with its own 8,000-piece vocabulary, data built
with `bertkit data pretraining --max-seq-length 128` and every other default - dynamic masking since issue 48):

  gcide-domain    long inputs, a family nothing of the recipe was chosen on: Webster's 1913 dictionary entries
                  (the text of every sense of a headword, >= 100 words) classified by their subject field
                  (scripts/gcide_task_data.py); fine-tuned at 128 tokens, 4,000 labels, bertkit's defaults.
  kjv-verdict     long inputs whose label lies past the 64th token: 90 words of consecutive King James verses with
                  "the verdict is positive/negative." inserted at word 45 or later (scripts/long_documents_data.py);
                  1,000 labels, 128 tokens. A model that cannot read positions 64-127 cannot score above chance.
  mhcc-part       long inputs, from public-domain text no earlier study used: sections of Matthew Henry's Concise
                  Commentary (median 167 words) classified by the part of the Bible they comment on, 8 parts, 1,000
                  labels (scripts/mhcc_task_data.py); run by hand with the same commands, fine-tuned 10 epochs.
  tdavid-book     long inputs, from public-domain text no study used before it and on which nothing was chosen:
                  paragraphs of Spurgeon's Treasury of David (median 153 words) classified by the book of the Psalter
                  (5), 1,000 labels (scripts/tdavid_task_data.py); run by hand like mhcc-part.
  wordnet-lexname short inputs (glosses, < 64 tokens), the family the short recipe was tuned on (+15.0 at 10
                  CPU-minutes before this change; +8.2 against random initialisation fine-tuned 10 epochs): it must
                  keep its gain.

Beyond the 10 CPU-minute rows (docs/pretraining.md has each command): `--budget 20 --only gcide --recipes short-64
--no-random` for the 20 CPU-minute row, `--gcide` pointing at `scripts/gcide_task_data.py --min-words 70`'s output
for the issue's own case (2,565 labels, every default), `scripts/transformers_pretrain.py` for transformers'
BertForPreTraining at the same CPU time, and `scripts/study_finetune.py run ... --epochs 10` on the same models so
that random initialisation learns too.

Rows per family: random initialisation; the short recipe with every step at 64 tokens (`--full-length-share 0`, its
default: the study's outcome); the last 10% of the steps at the data's 128 tokens (`end`, the paper's two phases);
25% of the steps at 128 tokens spread through the run (`spread`: at the schedule's peak too). A budget is in
CPU-minutes turned into steps at the rates of an idle machine (`scripts/pretraining_study.py rates`; batch 16 takes
twice the steps per second of batch 32), counting the full-length steps at the 128-token rate, so both recipes get
the same CPU time; every run uses one thread, two at a time. Fine-tuning is `scripts/study_finetune.py` with the
learning rate chosen by the same rule for every row of a family (the grid on lexname, as the earlier study; bertkit's
default on the long families, whose fine-tunings cost 4-8x more), seeds 1, 2, 3.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pretraining_study import SCRIPTS, Job, bertkit, run_jobs

from bertkit.workflows.recipes import short_recipe

SHORT_BATCH = short_recipe(256).batch_size
SEEDS = "1,2,3"
# family -> (task name in study_finetune.TASKS, lr rule, epochs, extra flags)
FAMILIES = {
    "gcide": ("gcide-domain", "default", "3", []),
    "kjv-verdict": ("kjv-verdict", "default", "5", []),
    "wordnet": ("wordnet-lexname", "grid", "5", []),
}
# recipe label -> (`bertkit pretrain` flags, share of the steps at 128 tokens)
RECIPES = {"short-64": (["--full-length-share", "0"], 0.0),
           "short-end10": (["--full-length-share", "0.1", "--full-length-placement", "end"], 0.1),
           # the full-length steps at the peak of the schedule as well as its tail: the end phase falls where the
           # one-cycle schedule's learning rate is low (at most a fifth of the peak)
           "short-spread25": (["--full-length-share", "0.25", "--full-length-placement", "spread"], 0.25)}


def steps_for(budget_cpu_min: float, rate_64: float, rate_128: float, full_share: float) -> int:
    """Optimizer steps of batch SHORT_BATCH that fit `budget_cpu_min` CPU-minutes when `full_share` of them are at
    128 tokens (rates are steps per CPU-second at batch 32)."""
    per_step = (1 - full_share) / (rate_64 * 32 / SHORT_BATCH) + full_share / (rate_128 * 32 / SHORT_BATCH)
    return round(budget_cpu_min * 60 / per_step)


def corpus_file(family: str, args: argparse.Namespace) -> Path:
    from bertkit.assets import kjv_path

    return {"gcide": args.gcide / "corpus.txt", "kjv-verdict": kjv_path("corpus.txt.gz"),
            "wordnet": args.data / "wordnet" / "corpus.txt"}[family]


def jobs(args: argparse.Namespace) -> list[Job]:
    root, out = args.root, []
    kjv_task = root / "kjv-verdict-task"
    out.append(Job("kjv-verdict:task", [sys.executable, str(SCRIPTS / "long_documents_data.py"), "--output",
                                        str(kjv_task), "--train", "1000", "--dev", "500", "--test", "1000",
                                        "--words", "90", "--after", "45"], kjv_task / "dev.jsonl"))
    for family, (task, lr_rule, epochs, extra) in FAMILIES.items():
        folder = root / family
        vocab, built = folder / "vocab", folder / "data"
        needs: list[str] = []
        text = str(corpus_file(family, args))
        out.append(Job(f"{family}:vocab", bertkit("tokenizer", "train", "--input", text, "--vocab-size", "8000",
                                                  "--output", str(vocab)), vocab / "vocab.txt", needs))
        out.append(Job(f"{family}:data", bertkit("data", "pretraining", "--input", text, "--tokenizer", str(vocab),
                                                 "--output", str(built), "--max-seq-length", "128", "--workers", "1"),
                       built / "manifest.json", [f"{family}:vocab"]))
        models = [("random", None, f"{family}:vocab")] if args.random else []
        for recipe, (flags, share) in RECIPES.items():
            run = folder / f"pretrain-{recipe}-{args.budget}cpu"
            steps = steps_for(args.budget, args.rate_64, args.rate_128, share)
            name = f"{family}:pretrain:{recipe}"
            out.append(Job(name, bertkit("pretrain", "--data", str(built), "--tokenizer", str(vocab), "--model",
                                         "bert-mini", "--output", str(run), "--recipe", "auto", *flags, "--max-steps",
                                         str(steps), "--eval-every", "500", "--eval-examples", "1000", "--resume",
                                         "auto"), run / "final" / "model.safetensors", [f"{family}:data"]))
            models.append((recipe, run, name))
        for recipe, run, needs_model in models:
            source = (["--random", "bert-mini", "--tokenizer", str(vocab)] if run is None
                      else ["--model", str(run / "final")])
            output = folder / f"finetune-{recipe}"
            files = _task_files(family, args)
            after = [needs_model] + (["kjv-verdict:task"] if family == "kjv-verdict" else [])
            out.append(Job(f"{family}:finetune:{recipe}", [
                sys.executable, str(SCRIPTS / "study_finetune.py"), "run", "--task", task, *files, *source,
                "--seeds", SEEDS, "--lr-rule", lr_rule, "--epochs", epochs, "--threads", "1", "--corpus", family,
                "--budget", "-" if run is None else f"{args.budget} CPU-min", "--recipe", recipe, "--output",
                str(output), "--results", str(root / "results.jsonl"), *extra], output / "row.done", after))
    return out


def _task_files(family: str, args: argparse.Namespace) -> list[str]:
    if family == "wordnet":
        return ["--data", str(args.data)]
    folder = args.gcide if family == "gcide" else args.root / "kjv-verdict-task"
    return ["--train", str(folder / "train.jsonl"), "--dev", str(folder / "dev.jsonl"), "--test",
            str(folder / "test.jsonl")]


def run_all(args: argparse.Namespace) -> None:
    """Every job (pretraining_study.run_jobs), pre-trainings before fine-tunings, else in the order listed."""
    all_jobs = jobs(args)
    order = [job.name for job in all_jobs]
    run_jobs(all_jobs, args.root, args.jobs, lambda job: (":finetune:" in job.name, order.index(job.name)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run")
    run.add_argument("--root", type=Path, required=True)
    run.add_argument("--data", type=Path, required=True, help="Output of scripts/study_data.py (WordNet).")
    run.add_argument("--gcide", type=Path, required=True, help="Output of scripts/gcide_task_data.py.")
    run.add_argument("--rate-64", type=float, required=True, help="Steps per CPU-second at 64 tokens, batch 32.")
    run.add_argument("--rate-128", type=float, required=True, help="Steps per CPU-second at 128 tokens, batch 32.")
    run.add_argument("--budget", type=float, default=10, help="CPU-minutes of pre-training.")
    run.add_argument("--jobs", type=int, default=2)
    run.add_argument("--only", nargs="*", help="Families to run (default: all).")
    run.add_argument("--recipes", nargs="*", help=f"Recipes to run (default: all of {', '.join(RECIPES)}).")
    run.add_argument("--no-random", dest="random", action="store_false", help="No random-initialisation rows.")
    args = parser.parse_args()
    for table, keep in ((FAMILIES, args.only), (RECIPES, args.recipes)):
        for name in set(table) - set(keep or table):
            del table[name]
    run_all(args)


if __name__ == "__main__":
    main()
