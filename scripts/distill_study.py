"""The distillation study behind docs/distillation.md (issue 52): teachers fine-tuned from bertkit-pretrained models,
half-depth and smaller students distilled from them with `bertkit distill`, each against the same student fine-tuned
on the labels alone, 3 seeds, Welch's p, on the test files.

    python scripts/distill_study.py run --root /tmp/distill-study --data STUDY_DATA --gcide GCIDE_DIR \
        --lexname-model PRETRAINED --gcide-model PRETRAINED [--jobs 2]
    python scripts/distill_study.py table /tmp/distill-study
    python scripts/distill_study.py speed /tmp/distill-study --data STUDY_DATA --gcide GCIDE_DIR  # alone

STUDY_DATA is scripts/study_data.py's output (WordNet lexname and QA), GCIDE_DIR scripts/gcide_task_data.py's; the
pre-trained models are `bertkit pretrain` outputs on the same corpora (scripts/length_study.py's short recipe at 10
CPU-minutes). Every run uses one thread, `--jobs` at a time (the student's speed against its teacher is measured in
each run's own process, taking turns, so a busy machine slows both alike). The lexname family chose the defaults
(the grid rows); GCIDE and WordNet QA were never used to choose one.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from pretraining_study import Job, run_jobs

from bertkit.workflows.significance import compare_seeds

SEEDS = "1,2,3"
UNLABELED_GLOSSES = (8000, 32000)


def glosses(corpus: Path, held_out: list[Path], out: Path, count: int) -> Path:
    """Unlabelled in-domain inputs for lexname: WordNet glosses of the corpus ('lemma: gloss' lines), none of them a
    lexname train/dev/test text, shuffled, the first `count`."""
    if out.is_file():
        return out
    taken = {json.loads(line)["text"] for path in held_out for line in path.read_text().splitlines() if line}
    found = []
    for line in corpus.read_text(encoding="utf-8").splitlines():
        _, sep, gloss = line.partition(": ")
        if sep and gloss and gloss not in taken:
            found.append(gloss)
    found = sorted(set(found))
    random.Random(52).shuffle(found)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(g.replace("|||", "|") + "\n" for g in found[:count]), encoding="utf-8")
    return out


def jobs(args: argparse.Namespace) -> list[Job]:
    root, data, gcide = args.root, args.data / "wordnet", args.gcide
    lex = (data / "lexname-train.jsonl", data / "lexname-dev.jsonl", data / "lexname-test.jsonl")
    qa = (data / "qa-train.json", data / "qa-dev.json", data / "qa-test.json")
    gc = (gcide / "train.jsonl", gcide / "dev.jsonl", gcide / "test.jsonl")
    unlabeled, more = (glosses(data / "corpus.txt", list(lex), root / name, count) for name, count in
                       zip(("lexname-unlabeled.txt", "lexname-unlabeled-32k.txt"), UNLABELED_GLOSSES))
    common = ["--threads", "1", "--device", "cpu", "--overwrite"]

    def files(triple: tuple[Path, Path, Path]) -> list[str]:
        return ["--train", str(triple[0]), "--dev", str(triple[1]), "--dev", str(triple[2])]

    def teacher(name: str, kind: str, model: str, triple, *flags: str) -> Job:
        out = root / name / "teacher"
        return Job(f"{name}:teacher", ["bertkit", "finetune", kind, "--model", model, *files(triple), "--output",
                                       str(out), "--seeds", SEEDS, *flags, *common], out / "eval_results.json")

    def student(name: str, row: str, kind: str, triple, *flags: str) -> Job:
        out = root / name / row
        return Job(f"{name}:{row}", ["bertkit", "distill", kind, "--teacher", str(root / name / "teacher" / "best"),
                                     *files(triple), "--output", str(out), "--seeds", SEEDS, *flags, *common],
                   out / "eval_results.json", after=[f"{name}:teacher"])

    lex_flags = ("--learning-rate", "1e-3", "--epochs", "5")
    gc_flags = ("--learning-rate", "3e-4", "--epochs", "10")
    qa_flags = ("--epochs", "3")
    length = ("--max-seq-length", "128")  # the teachers'; a student reads its teacher's
    with_unlabeled = ("--unlabeled", str(unlabeled))
    return [
        teacher("lexname", "classification", str(args.lexname_model), lex, *lex_flags, *length),
        teacher("gcide", "classification", str(args.gcide_model), gc, *gc_flags, *length),
        teacher("qa", "squad", str(args.lexname_model), qa, *qa_flags, *length),
        # lexname: the grid that chose the defaults (every row: half depth, every other teacher layer)
        student("lexname", "soft-hard-unlabeled", "classification", lex, *lex_flags, *with_unlabeled,
                "--compare-without-teacher"),
        student("lexname", "soft-hard", "classification", lex, *lex_flags),
        student("lexname", "soft-only-unlabeled", "classification", lex, *lex_flags, *with_unlabeled,
                "--hard-weight", "0"),
        student("lexname", "soft-hard-unlabeled-hidden", "classification", lex, *lex_flags, *with_unlabeled,
                "--hidden-weight", "1"),
        student("lexname", "soft-hard-augment", "classification", lex, *lex_flags, "--augment", "4"),
        student("lexname", "tiny-soft-hard-unlabeled", "classification", lex, *lex_flags, *with_unlabeled,
                "--student", "bert-tiny", "--compare-without-teacher"),
        # held out: never used to choose a setting
        student("gcide", "soft-hard-augment", "classification", gc, *gc_flags, "--augment", "2",
                "--compare-without-teacher"),
        student("qa", "soft-hard", "squad", qa, *qa_flags, "--compare-without-teacher"),
        # more of the user's own text (the first 8,000 lines are the row above's)
        student("lexname", "soft-hard-unlabeled32k", "classification", lex, *lex_flags, "--unlabeled", str(more),
                "--compare-without-teacher"),
    ]


def test_metric(results: dict, metric: str) -> list[float]:
    """Per-seed test scores (the second --dev file, scored at the evaluation the first selected), in points."""
    keys = [k for k in next(iter(results["seeds"].values())) if k.endswith(f"_{metric}")]
    scale = 1 if metric == "f1" else 100  # SQuAD's F1 is in points already
    return [scale * seed[keys[0]] for seed in results["seeds"].values()]


def table(root: Path) -> None:
    """One line per student row: test score mean ± std, the teacher's (best seed), share kept, speed-up, and the
    difference from the same student without a teacher with Welch's p."""
    for family in ("lexname", "gcide", "qa"):
        metric = "f1" if family == "qa" else "accuracy"
        teacher_file = root / family / "teacher" / "eval_results.json"
        if not teacher_file.is_file():
            continue
        teacher = json.loads(teacher_file.read_text())
        teacher_test = test_metric({"seeds": {"best": teacher["seeds"][str(teacher["best_seed"])]}}, metric)[0]
        for row in sorted(p.parent.name for p in (root / family).glob("*/eval_results.json")):
            if row == "teacher":
                continue
            results = json.loads((root / family / row / "eval_results.json").read_text())
            if "distillation" not in results:  # its seeds are done, its comparison or report not yet
                continue
            scores = test_metric(results, metric)
            report = results["distillation"]
            line = (f"{family:8s} {row:28s} {report['student_layers']}L {report['student_parameters'] / 1e6:5.2f}M "
                    f"test {metric} {statistics.fmean(scores):5.1f} ± {statistics.stdev(scores):3.1f} | teacher "
                    f"{teacher_test:5.1f} ({report['teacher_layers']}L) "
                    f"kept {100 * statistics.fmean(scores) / teacher_test:5.1f}% (dev {100 * report['kept']:5.1f}%) "
                    f"| speed {report['speedup']:.2f}x")
            baseline = root / family / row / "without-teacher" / "eval_results.json"
            if baseline.is_file():
                without = test_metric(json.loads(baseline.read_text()), metric)
                c = compare_seeds(scores, without)
                line += (f" | without teacher {statistics.fmean(without):5.1f} ± {statistics.stdev(without):3.1f}: "
                         f"{c.difference:+.1f}, p = {c.p_value:.3g}" if c.p_value is not None else f" {c.note}")
            print(line)


class _Transformers:
    """A transformers model called as bertkit's are (input ids, segment ids, mask: by position)."""

    def __init__(self, model):
        self.model = model

    def __call__(self, input_ids, token_type_ids=None, attention_mask=None):
        return self.model(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask)


def _rates(models: dict, features: list, names: tuple, rounds: int = 5) -> dict[str, float]:
    """Examples per second of each model on `features` through the same batching (`model_outputs`), taking turns
    over `rounds` rounds of at least half a second each after a warm-up pass, the median of each."""
    import math
    import time

    from bertkit.inference.batching import model_outputs

    def one_pass(model) -> float:
        started = time.perf_counter()
        model_outputs(model, features, names, (), 64, 0)
        return time.perf_counter() - started

    passes = max(1, math.ceil(0.5 / max(one_pass(m) for m in models.values())))
    times: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(rounds):
        for name, model in models.items():
            times[name].append(sum(one_pass(model) for _ in range(passes)))
    return {name: passes * len(features) / statistics.median(seconds) for name, seconds in times.items()}


def speed(root: Path, data: Path, gcide: Path, threads: int) -> None:
    """Each student's inference rate against its teacher's, measured again with the machine otherwise idle (the
    rates in the runs' reports were measured beside the other lane), on the first 256 dev inputs: bertkit's
    (`bertkit predict`'s kernels) and transformers' own forward of the same two directories, all four in one
    process, taking turns."""
    import torch
    from transformers import AutoModelForQuestionAnswering, AutoModelForSequenceClassification

    from bertkit.model import accelerate_for_inference
    from bertkit.tasks.finetuned import load_finetuned
    from bertkit.workflows.distill import SPEED_FEATURES

    torch.set_num_threads(threads)
    for family in ("lexname", "gcide", "qa"):
        teacher_dir = root / family / "teacher" / "best"
        if not teacher_dir.is_dir():
            continue
        task, teacher, tokenizer = load_finetuned(teacher_dir)
        dev = {"lexname": data / "wordnet" / "lexname-dev.jsonl", "gcide": gcide / "dev.jsonl",
               "qa": data / "wordnet" / "qa-dev.json"}[family]
        examples, _ = task.read(dev)
        features = task.features(examples, tokenizer)[:SPEED_FEATURES]
        auto = AutoModelForQuestionAnswering if family == "qa" else AutoModelForSequenceClassification
        for row in sorted(p.parent.parent.name for p in (root / family).glob("*/best/distillation.json")):
            _, student, _ = load_finetuned(root / family / row / "best")
            models = {"teacher": accelerate_for_inference(teacher), "student": accelerate_for_inference(student),
                      "hf_teacher": _Transformers(auto.from_pretrained(teacher_dir).eval()),
                      "hf_student": _Transformers(auto.from_pretrained(root / family / row / "best").eval())}
            rates = _rates(models, features, tuple(task.output_names))
            ratio = rates["student"] / rates["teacher"]
            print(f"{family:8s} {row:28s} {threads} thread(s): student/teacher {ratio:.2f}x "
                  f"(bertkit {rates['student']:.0f}/s vs {rates['teacher']:.0f}/s); bertkit student / transformers "
                  f"teacher {rates['student'] / rates['hf_teacher']:.2f}x; in transformers student/teacher "
                  f"{rates['hf_student'] / rates['hf_teacher']:.2f}x; bertkit/transformers on the student "
                  f"{rates['student'] / rates['hf_student']:.2f}x", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    go = commands.add_parser("run")
    go.add_argument("--root", type=Path, required=True)
    go.add_argument("--data", type=Path, required=True)
    go.add_argument("--gcide", type=Path, required=True)
    go.add_argument("--lexname-model", type=Path, required=True)
    go.add_argument("--gcide-model", type=Path, required=True)
    go.add_argument("--jobs", type=int, default=2)
    show = commands.add_parser("table")
    show.add_argument("root", type=Path)
    timing = commands.add_parser("speed")
    timing.add_argument("root", type=Path)
    timing.add_argument("--data", type=Path, required=True)
    timing.add_argument("--gcide", type=Path, required=True)
    timing.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    if args.command == "table":
        table(args.root)
        return
    if args.command == "speed":
        speed(args.root, args.data, args.gcide, args.threads)
        return
    order = [job.name for job in jobs(args)]
    run_jobs(jobs(args), args.root, args.jobs, lambda job: order.index(job.name))


if __name__ == "__main__":
    main()
