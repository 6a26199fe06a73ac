"""`bertkit glue`: a GLUE-shaped directory (every task in download_glue_data.py's layout, a handful of rows
each, generated here) fine-tuned from a tiny model made here; the table, the learning rate chosen on dev,
resume without re-training, and the one-line messages for unusable directories."""

from __future__ import annotations

import json
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bertkit.cli import main
from bertkit.config import preset
from bertkit.model import BertForPreTraining
from bertkit.tokenizer import WordPieceTokenizer
from bertkit.workflows import glue

WORDS = ("the a film was is good great bad awful fine who capital of in he she sits eats sings city river "
         "what why did does not it").split()

MNLI_TRAIN = ["index", "promptID", "pairID", "genre", "sentence1_binary_parse", "sentence2_binary_parse",
              "sentence1_parse", "sentence2_parse", "sentence1", "sentence2", "label1", "gold_label"]
MNLI_DEV = [*MNLI_TRAIN[:-1], "label2", "label3", "label4", "label5", "gold_label"]


def _sentence(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 7))) + " ."


def _rows(task: str, rng: random.Random, count: int, dev: bool) -> list[str]:
    """`count` rows of a task's TSV in download_glue_data.py's column layout (header first where it has one)."""
    def pair() -> tuple[str, str]:
        return _sentence(rng), _sentence(rng)
    nli = ("contradiction", "entailment", "neutral")
    binary = ("entailment", "not_entailment")
    if task == "CoLA":  # no header: source, label, original label, sentence
        return [f"gj04\t{i % 2}\t\t{_sentence(rng)}" for i in range(count)]
    if task == "SST-2":
        return ["sentence\tlabel", *(f"{_sentence(rng)}\t{i % 2}" for i in range(count))]
    if task == "MRPC":
        return ["Quality\t#1 ID\t#2 ID\t#1 String\t#2 String",
                *(f"{i % 2}\t{i}\t{i + 100}\t" + "\t".join(pair()) for i in range(count))]
    if task == "STS-B":
        header = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore"
        return [header, *(f"{i}\tmain-news\tf\t2012\t{i}\tnone\tnone\t" + "\t".join(pair()) + f"\t{i % 5 + 0.5}"
                          for i in range(count))]
    if task == "QQP":
        return ["id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate",
                *(f"{i}\t{2 * i}\t{2 * i + 1}\t" + "\t".join(pair()) + f"\t{i % 2}" for i in range(count))]
    if task == "MNLI":
        columns = MNLI_DEV if dev else MNLI_TRAIN
        votes = len(columns) - 10  # after the two sentences: label1 (.. label5) and gold_label
        return ["\t".join(columns), *(f"{i}\t{i}\t{i}n\tfiction\t" + "\t".join(["(x)"] * 4) + "\t"
                                      + "\t".join(pair()) + "\t" + "\t".join([nli[i % 3]] * votes)
                                      for i in range(count))]
    labels = binary if task in ("QNLI", "RTE") else ("0", "1")
    first = "question\tsentence" if task == "QNLI" else "sentence1\tsentence2"
    return [f"index\t{first}\tlabel", *(f"{i}\t" + "\t".join(pair()) + f"\t{labels[i % 2]}" for i in range(count))]


ALL_FOLDERS = ("CoLA", "SST-2", "MRPC", "STS-B", "QQP", "MNLI", "QNLI", "RTE", "WNLI")


def write_glue(root: Path, folders: tuple[str, ...] = ALL_FOLDERS, rows: int = 8) -> Path:
    """A GLUE directory as download_glue_data.py lays it out, `rows` training and dev rows per task."""
    rng = random.Random(0)
    for folder in folders:
        directory = root / folder
        directory.mkdir(parents=True)
        devs = ("dev_matched.tsv", "dev_mismatched.tsv") if folder == "MNLI" else ("dev.tsv",)
        for name in ("train.tsv", *devs):
            (directory / name).write_text("\n".join(_rows(folder, rng, rows, name != "train.tsv")) + "\n",
                                          encoding="utf-8")
    return root


@pytest.fixture(autouse=True)
def no_curves(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each run's curves.png costs about a second of matplotlib here; the table is what is tested."""
    from bertkit.train import reporting
    monkeypatch.setattr(reporting, "plot_metrics", lambda *args, **kwargs: None)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny randomly initialised BERT (bert-debug) with its vocabulary, as a checkpoint directory."""
    directory = tmp_path_factory.mktemp("model")
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, "(", ")", "x", ".", ","]
    tokenizer = WordPieceTokenizer(tokens)
    BertForPreTraining(preset("bert-debug", vocab_size=len(tokens))).save_pretrained(directory, tokenizer=tokenizer)
    return directory


def _glue(model_dir: Path, data: Path, out: Path, *extra: str) -> int:
    return main(["glue", "--model", str(model_dir), "--data", str(data), "--output", str(out), "--epochs", "1",
                 "--seeds", "1", "--batch-size", "4", "--max-seq-length", "32", "--precision", "fp32",
                 "--device", "cpu", *extra])


PAPER_COLUMNS = ["MNLI-m", "MNLI-mm", "QQP F1", "QQP acc", "QNLI", "SST-2", "CoLA", "STS-B Pearson",
                 "STS-B Spearman", "MRPC F1", "MRPC acc", "RTE", "WNLI"]
AVERAGED = ["MNLI-m", "MNLI-mm", "QQP F1", "QNLI", "SST-2", "CoLA", "STS-B Spearman", "MRPC F1", "RTE"]


def test_every_task_is_run_and_tabled_with_its_metrics(model_dir, tmp_path, capsys):
    data, out = write_glue(tmp_path / "glue"), tmp_path / "out"
    assert _glue(model_dir, data, out, "--learning-rates", "1e-3") == 0
    printed = capsys.readouterr().out
    results = json.loads((out / "glue_results.json").read_text())
    assert set(results["tasks"]) == {"cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli"}
    assert [c["title"] for c in results["columns"]] == PAPER_COLUMNS
    metrics = {key: set(task["metrics"]) for key, task in results["tasks"].items()}
    assert metrics["cola"] == {"matthews_correlation"} and metrics["stsb"] == {"pearson", "spearman"}
    assert metrics["mrpc"] == metrics["qqp"] == {"f1", "accuracy"}
    assert metrics["mnli"] == {"accuracy", "dev_mismatched_accuracy"} and metrics["rte"] == {"accuracy"}
    assert results["tasks"]["mnli"]["examples"] == {"train": 8, "dev_matched": 8, "dev_mismatched": 8,
                                                    "skipped_train": 0, "skipped_dev_matched": 0,
                                                    "skipped_dev_mismatched": 0}
    # the paper's average: nine scores, WNLI left out
    averaged = [c for c in results["columns"] if c["in_average"]]
    assert [c["title"] for c in averaged] == AVERAGED == results["average"]["scores"]
    assert results["average"]["value"] == pytest.approx(sum(c["mean"] for c in averaged) / 9)
    cola = json.loads((out / "cola" / "lr-0.001" / "eval_results.json").read_text())  # run_finetuning's own
    assert results["columns"][6]["mean"] == pytest.approx(100 * cola["matthews_correlation"])
    table = (out / "glue_results.md").read_text()
    assert ("| Model | MNLI-m/mm | QQP F1/acc | QNLI | SST-2 | CoLA | STS-B Pearson/Spearman | MRPC F1/acc | RTE "
            "| WNLI | Average |") in table
    assert f"| {model_dir} | " in table and "WNLI excluded" in table
    run_lines = [line for line in printed.splitlines() if line.startswith("[")]
    assert len(run_lines) == 9 and all(re.fullmatch(r"\[\d/9\] \S+ lr 0.001: \w+ -?\d\.\d{4} \(1 seed\), \d+ s",
                                                    line) for line in run_lines), run_lines


def test_the_chosen_rate_is_the_best_mean_over_seeds_first_on_ties():
    spec = glue.GLUE_FOLDERS["cola"]
    found = glue.FoundTask(spec, Path("CoLA"), Path("CoLA/train.tsv"), [Path("CoLA/dev.tsv")], {})

    def run(*values: float) -> dict:
        per_seed = {seed: {"matthews_correlation": v} for seed, v in enumerate(values, 1)}
        return {"metrics": glue._seed_stats(per_seed, ("matthews_correlation",)), "directory": "d"}
    # 3e-5 has the best seed (0.9) but 2e-5 the best mean
    runs = {5e-5: run(0.1, 0.2), 3e-5: run(0.9, 0.0), 2e-5: run(0.5, 0.5), 1e-5: run(0.4, 0.6)}
    chosen = glue._choose(found, runs, (1, 2))
    assert chosen["learning_rate"] == 2e-5  # ties with 1e-5 (mean 0.5): the first in grid order
    assert chosen["metrics"]["matthews_correlation"]["std"] == 0.0


def _mtimes(out: Path) -> dict[str, int]:
    return {str(p.relative_to(out)): p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()
            and p.name in ("eval_results.json", "seed_results.json", "model.safetensors")}


def test_the_dev_best_rate_is_chosen_and_resume_trains_only_what_is_missing(model_dir, tmp_path, capsys):
    data, out = write_glue(tmp_path / "glue", ("RTE", "MRPC")), tmp_path / "out"
    flags = ("--learning-rates", "1e-3,1e-4")
    assert _glue(model_dir, data, out, *flags) == 0
    results = json.loads((out / "glue_results.json").read_text())
    for key, task in results["tasks"].items():
        main_metric, per_rate = task["main_metric"], {}
        for rate in (1e-3, 1e-4):  # each run's own eval_results.json, as run_finetuning wrote it
            run = json.loads((out / key / f"lr-{rate:g}" / "eval_results.json").read_text())
            assert run["learning_rate"] == rate
            per_rate[rate] = run["seeds"]["1"][main_metric]
        assert task["learning_rate"] == max(per_rate, key=lambda r: per_rate[r])  # the dev-best, first on ties
        assert task["metrics"][main_metric]["values"] == [per_rate[task["learning_rate"]]]
    capsys.readouterr()
    assert _glue(model_dir, data, out, *flags) == 2  # a finished sweep is not started over by accident
    assert "holds an earlier GLUE sweep; pass --resume auto" in capsys.readouterr().err
    before = _mtimes(out)
    assert _glue(model_dir, data, out, *flags, "--resume", "auto") == 0
    printed = capsys.readouterr().out
    assert printed.count("finished earlier, kept") == 4 and _mtimes(out) == before  # nothing trained again
    # an interrupted sweep: one run had not finished (its directory gone), the others are kept
    shutil.rmtree(out / "rte" / "lr-0.0001")
    assert _glue(model_dir, data, out, *flags, "--resume", "auto") == 0
    printed = capsys.readouterr().out
    assert printed.count("finished earlier, kept") == 3
    assert re.search(r"RTE lr 0.0001: accuracy \S+ \(1 seed\), \d+ s", printed)
    after = _mtimes(out)
    assert {k: v for k, v in after.items() if not k.startswith("rte/lr-0.0001")} == {
        k: v for k, v in before.items() if not k.startswith("rte/lr-0.0001")}
    # a seed more: each run trains only the new seed; its finished seed is read back, not trained again
    assert _glue(model_dir, data, out, *flags, "--resume", "auto", "--seeds", "1,2", "--tasks", "rte") == 0
    assert all(v == after[k] for k, v in _mtimes(out).items() if "seed-1" in k)
    assert all((out / "rte" / rate / "seed-2" / "seed_results.json").is_file() for rate in ("lr-0.001", "lr-0.0001"))
    results = json.loads((out / "glue_results.json").read_text())
    assert set(results["tasks"]) == {"rte"} and results["recipe"]["seeds"] == [1, 2]
    assert len(results["tasks"]["rte"]["metrics"]["accuracy"]["values"]) == 2
    # run times edited by hand (a TypeError traceback before): left out, each run still kept from its own files
    sweep = json.loads((out / "glue_sweep.json").read_text())
    bad = iter(("soon", [1], {"wall_s": "1"}, {"wall_s": float("inf")}, None))
    sweep["runs"] = {name: next(bad) for name in sweep["runs"]}
    (out / "glue_sweep.json").write_text(json.dumps(sweep))
    capsys.readouterr()
    assert _glue(model_dir, data, out, *flags, "--resume", "auto", "--seeds", "1,2", "--tasks", "rte") == 0
    printed = capsys.readouterr().out
    assert printed.count("finished earlier, kept") == 2 and "s then)" not in printed


def test_unusable_folders_are_named_in_one_line_and_the_others_run(model_dir, tmp_path, capsys):
    data = write_glue(tmp_path / "glue", ("SST-2", "RTE", "CoLA"))
    (data / "RTE" / "dev.tsv").unlink()
    (data / "CoLA" / "train.tsv").write_text("just one column\nand another\n", encoding="utf-8")
    out = tmp_path / "out"
    assert _glue(model_dir, data, out, "--learning-rates", "1e-3") == 0
    printed = capsys.readouterr().out.splitlines()
    assert f"{data / 'RTE'}: no dev.tsv (download_glue_data.py writes RTE/train.tsv, dev.tsv); RTE skipped" in printed
    cola = [line for line in printed if line.startswith(f"{data / 'CoLA' / 'train.tsv'}: no examples")]
    assert len(cola) == 1 and cola[0].endswith("; CoLA skipped")
    assert any("1 task(s) to run (SST-2), 2 skipped" in line for line in printed)
    results = json.loads((out / "glue_results.json").read_text())
    assert set(results["tasks"]) == {"sst2"} and len(results["skipped_tasks"]) == 2
    assert results["average"]["scores"] == ["SST-2"] and "MNLI-m" in results["average"]["missing"]
    assert "here over 1 of those 9 scores" in (out / "glue_results.md").read_text()


@pytest.mark.parametrize("make, message", [
    (lambda d: d.mkdir(), "holds no GLUE task folder (MNLI, QQP, QNLI, SST-2, CoLA, STS-B, MRPC, RTE, WNLI)"),
    (lambda d: None, "no such directory"),
    (lambda d: (d / "RTE").mkdir(parents=True), "no usable GLUE task (1 skipped), first: "),
])
def test_an_empty_or_unusable_glue_directory_is_a_one_line_error(model_dir, tmp_path, capsys, make, message):
    data = tmp_path / "glue"
    make(data)
    assert _glue(model_dir, data, tmp_path / "out") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("bertkit: error: --data ") and message in err


def test_asked_tasks_missing_or_unknown(model_dir, tmp_path, capsys):
    data = write_glue(tmp_path / "glue", ("WNLI",))
    assert _glue(model_dir, data, tmp_path / "out", "--tasks", "wnli,rte", "--learning-rates", "1e-3") == 0
    assert f"{data / 'RTE'}: no such folder; RTE skipped" in capsys.readouterr().out
    assert _glue(model_dir, data, tmp_path / "out2", "--tasks", "squad") == 2
    assert "--task 'squad' is not a GLUE task" in capsys.readouterr().err
    assert _glue(model_dir, data, tmp_path / "out3", "--learning-rates", "3e-5,fast") == 2
    assert "--learning-rates '3e-5,fast': expected comma-separated numbers" in capsys.readouterr().err


def test_every_glue_flag_has_help_that_never_contradicts_its_default():
    import click

    from bertkit.cli.glue import glue
    context = click.Context(glue)
    for param in glue.params:
        if isinstance(param, click.Option):
            text = param.get_help_record(context)[1]
            never_none = param.required or param.get_default(context) is not None
            assert param.help and not (never_none and re.search(r"\bunset\b", text)), (param.opts, text)


def test_glue_help_imports_no_torch():
    code = "import sys; from bertkit.cli import main; main(['glue', '--help']); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "--learning-rates" in out and "[default: 1,2,3]" in out and out.strip().endswith("False")


def test_the_smoke_directory_script_writes_every_task_in_its_layout(tmp_path):
    """scripts/tiny_glue.py (docs/finetuning.md's smoke run): all nine folders read as fine-tuning reads them."""
    import importlib.util
    script = Path(__file__).resolve().parents[2] / "scripts" / "tiny_glue.py"
    spec = importlib.util.spec_from_file_location("tiny_glue", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    data = module.write_tiny_glue(tmp_path / "glue", train_rows=20, dev_rows=10)
    found, problems = glue.find_tasks(data, None)
    assert problems == [] and {t.spec.key for t in found} == set(glue.GLUE_FOLDERS)
    assert all(t.counts["train"] == 20 and not t.counts["skipped_train"] for t in found)
