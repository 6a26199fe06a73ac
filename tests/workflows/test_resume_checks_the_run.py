"""`finetune --resume auto` continues the run it was given, not another one (issue 40): other training or
dev files, other columns or labels, another --max-seq-length are refused, each named, unless --allow-change
accepts it; a run directory written before these were recorded still resumes."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from bertkit.cli import main
from bertkit.config import preset
from bertkit.tokenizer import WordPieceTokenizer

from .conftest import TOKENS, WORDS, tiny_model


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("resume-checks")
    tiny_model(root / "model")
    for name, offset in (("train", 0), ("other", 1)):
        rows = [f"{WORDS[(i + offset) % 6]} {WORDS[(i + 1) % 6]}\t{WORDS[i % 3]}\t{'good' if i % 2 else 'bad'}"
                for i in range(8)]
        (root / f"{name}.tsv").write_text("text\tsecond\tlabel\n" + "\n".join(rows) + "\n", encoding="utf-8")
    return {"model": root / "model", "train": root / "train.tsv", "other": root / "other.tsv"}


def _finetune(files: dict[str, Path], out: Path, *extra: str, train: str = "train") -> int:
    return main(["finetune", "classification", "--model", str(files["model"]), "--train", str(files[train]),
                 "--dev", str(files["train"]), "--output", str(out), "--max-steps", "1", "--device", "cpu",
                 "--precision", "fp32", "--max-seq-length", "16", "--seeds", "1,2", *extra])


@pytest.mark.parametrize(("change", "extra", "named", "leaf"), [
    ("data", ("--train", "other"), "data", "data.train.sha256 (the training file "),
    ("columns", ("--text-column", "second"), "task", "task.text_column was 'text' and is 'second' now"),
    ("length", ("--max-seq-length", "24"), "max_seq_length", "max_seq_length was 16 and is 24 now"),
])
def test_a_resumed_run_with_other_inputs_is_refused_then_allowed(files, tmp_path, capsys, caplog, change, extra,
                                                                 named, leaf):
    out = tmp_path / "run"
    assert _finetune(files, out) == 0
    train = extra[1] if extra[0] == "--train" else "train"
    given = () if extra[0] == "--train" else extra
    assert _finetune(files, out, *given, "--resume", "auto", train=train) == 2
    err = capsys.readouterr().err
    assert leaf in err and f"--allow-change {named}" in err  # what changed, by name (a file by its path)
    assert _finetune(files, out, *given, "--resume", "auto", "--allow-change", named, train=train) == 0
    assert "no longer the run it continues" in caplog.text and leaf in caplog.text  # said, not silent
    assert json.loads((out / "finetune_run.json").read_text())[named] != {}


def test_a_run_recorded_before_these_checks_still_resumes(files, tmp_path):
    out = tmp_path / "run"
    assert _finetune(files, out) == 0
    record = json.loads((out / "finetune_run.json").read_text())
    for key in ("data", "task", "max_seq_length"):  # what older runs did not record
        record.pop(key)
    (out / "finetune_run.json").write_text(json.dumps(record), encoding="utf-8")
    assert _finetune(files, out, "--resume", "auto") == 0


def test_finetuning_without_a_dev_set_trains_and_writes_best(files, tmp_path, capsys):
    """Issue 40: a user with only training data (the final run after model selection) can train; what needs a dev
    set is refused in one line."""
    out = tmp_path / "no-dev"
    assert main(["finetune", "classification", "--model", str(files["model"]), "--train", str(files["train"]),
                 "--output", str(out), "--max-steps", "2", "--device", "cpu", "--precision", "fp32",
                 "--max-seq-length", "16"]) == 0
    assert (out / "best" / "model.safetensors").is_file() and (out / "best" / "bertkit_task.json").is_file()
    assert json.loads((out / "eval_results.json").read_text())["step"] == 2
    assert main(["predict", "--model", str(out / "best"), "--input", str(files["other"]), "--output",
                 str(tmp_path / "pred"), "--precision", "fp32"]) == 0
    capsys.readouterr()
    for flags, message in ((["--seeds", "1,2"], "keeping the best of several seeds needs a dev set"),
                           (["--eval-every", "1"], "--eval-every evaluates on --dev"),
                           (["--early-stopping-patience", "2"], "--early-stopping-patience watches the dev score")):
        assert main(["finetune", "classification", "--model", str(files["model"]), "--train", str(files["train"]),
                     "--output", str(tmp_path / "refused"), "--max-steps", "1", "--device", "cpu", *flags]) == 2
        assert message in capsys.readouterr().err
        assert not (tmp_path / "refused").exists()


def test_embedding_training_without_a_dev_set_writes_a_sentence_transformers_directory(files, tmp_path, capsys):
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("\n".join(json.dumps({"anchor": WORDS[i % 6], "positive": WORDS[(i + 2) % 6]})
                               for i in range(8)) + "\n", encoding="utf-8")
    out = tmp_path / "embed"
    assert main(["finetune", "embedding", "--model", str(files["model"]), "--train", str(pairs), "--output",
                 str(out), "--max-steps", "2", "--batch-size", "4", "--device", "cpu", "--precision", "fp32",
                 "--max-seq-length", "8"]) == 0
    assert (out / "best" / "modules.json").is_file() and (out / "best" / "model.safetensors").is_file()
    texts = tmp_path / "texts.txt"
    texts.write_text("the cat\n", encoding="utf-8")
    capsys.readouterr()
    assert main(["predict", "--model", str(out / "best"), "--input", str(texts), "--output", str(tmp_path / "p")]) == 2
    err = capsys.readouterr().err  # predict has no labels for it: one line that names what does embed
    assert "a sentence-embedding model" in err and "bertkit extract" in err and len(err.strip().splitlines()) == 1
    assert main(["extract", "--model", str(out / "best"), "--input", str(texts), "--output",
                 str(tmp_path / "v.npy")]) == 0  # and what it names works


def test_embedding_training_keeps_what_its_starting_directory_says(files, tmp_path):
    """Issue 40: an all-MiniLM-L6-v2 fine-tuned without flags keeps its Normalize module, its pooling and its length;
    a flag still overrides each."""
    from bertkit.model import BertModel
    from bertkit.tasks.embedding import SentenceEncoder
    from bertkit.workflows.embedding import save_sentence_transformers

    start = tmp_path / "st"
    save_sentence_transformers(SentenceEncoder(BertModel(preset("bert-debug", vocab_size=len(TOKENS))), "cls", True),
                               WordPieceTokenizer(TOKENS), 12, start)
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("\n".join(json.dumps({"anchor": WORDS[i % 6], "positive": WORDS[(i + 2) % 6]})
                               for i in range(8)) + "\n", encoding="utf-8")

    def train(out: Path, *flags: str) -> Path:
        assert main(["finetune", "embedding", "--model", str(start), "--train", str(pairs), "--output", str(out),
                     "--max-steps", "1", "--batch-size", "4", "--device", "cpu", "--precision", "fp32", *flags]) == 0
        return out / "best"

    kept = train(tmp_path / "kept")
    assert (kept / "2_Normalize").is_dir()
    assert json.loads((kept / "sentence_bert_config.json").read_text())["max_seq_length"] == 12
    assert json.loads((kept / "1_Pooling" / "config.json").read_text())["pooling_mode"] == "cls"
    changed = train(tmp_path / "changed", "--no-normalize", "--max-seq-length", "10", "--pooling", "mean")
    assert not (changed / "2_Normalize").exists()
    assert json.loads((changed / "sentence_bert_config.json").read_text())["max_seq_length"] == 10
    assert json.loads((changed / "1_Pooling" / "config.json").read_text())["pooling_mode"] == "mean"


def test_the_summary_shows_metrics_not_timings(capsys):
    from bertkit.cli.finetune import print_summary

    print_summary({"seeds": {"1": {"mrr@10": 0.5, "train_seconds": 109.4576, "step": 24}}, "summary": {}},
                   Path("out"))
    line = capsys.readouterr().out.splitlines()[0]
    assert line == "seed 1: mrr@10 0.5000 (step 24, 109 s)"


def test_examples_with_an_empty_text_are_kept_and_said(files, tmp_path, caplog):
    """A blank text field in a user's file trains as [CLS] [SEP], as transformers would: kept, never silently."""
    train = tmp_path / "blank.tsv"
    train.write_text("text\tsecond\tlabel\ncat sat\tx\tgood\n\tx\tbad\n  \tx\tgood\ndog ran\t\tbad\n", encoding="utf-8")
    with caplog.at_level("WARNING"):
        assert main(["finetune", "classification", "--model", str(files["model"]), "--train", str(train),
                     "--output", str(tmp_path / "out"), "--max-steps", "1", "--device", "cpu", "--precision", "fp32",
                     "--max-seq-length", "16", "--text-pair-column", "second"]) == 0
    assert f"{train}: 3 of 4 examples have an empty text" in caplog.text
    assert f"{train}:3, {train}:4, {train}:5" in caplog.text  # where, by line


def _run(files: dict[str, Path], out: Path, *flags: str, train: str = "train") -> int:
    return main(["finetune", "classification", "--model", str(files["model"]), "--train", str(files[train]),
                 "--dev", str(files["train"]), "--output", str(out), "--device", "cpu", "--precision", "fp32",
                 "--max-seq-length", "16", *flags])


def test_the_learning_rate_and_the_budget_apply_to_the_seeds_not_finished(files, tmp_path, caplog):
    """Issue 51: --help said the learning rate and budget may change on resume; they were refused. The one rulebook
    (bertkit.settings.rules) makes them free: applied to the seeds that still train, and said."""
    out = tmp_path / "run"
    assert _run(files, out, "--seeds", "1", "--max-steps", "1", "--learning-rate", "1e-3") == 0
    caplog.set_level(logging.INFO)
    assert _run(files, out, "--seeds", "1,2", "--max-steps", "2", "--learning-rate", "2e-3", "--resume", "auto") == 0
    assert "learning_rate was 0.001 and is 0.002 now" in caplog.text and "max_steps was 1 and is 2 now" in caplog.text
    record = json.loads((out / "finetune_run.json").read_text())
    assert (record["learning_rate"], record["max_steps"]) == (2e-3, 2)
    results = json.loads((out / "eval_results.json").read_text())
    assert results["seeds"]["1"]["step"] == 1 and results["seeds"]["2"]["step"] <= 2  # seed 1 was kept as it was


def test_the_recorded_learning_rate_is_the_resolved_one(files, tmp_path):
    """Issue 47: under --learning-rate auto the record held None, so a resume compared None with None."""
    assert _run(files, tmp_path / "auto", "--seeds", "1", "--max-steps", "1") == 0
    assert json.loads((tmp_path / "auto" / "finetune_run.json").read_text())["learning_rate"] > 0


def test_a_new_label_set_is_refused_up_front_whatever_allow_change_says_and_the_record_stays(files, tmp_path, capsys):
    """Issue 51: --allow-change task with a new label was accepted, failed loading the checkpoint with a traceback
    text blaming another bertkit version, and rewrote finetune_run.json, so the next normal resume was refused."""
    out = tmp_path / "run"
    assert _run(files, out, "--seeds", "1", "--max-steps", "1") == 0
    before = (out / "finetune_run.json").read_bytes()
    three = tmp_path / "three.tsv"
    rows = files["train"].read_text(encoding="utf-8").splitlines()
    three.write_text("\n".join([*rows, f"{WORDS[0]} {WORDS[1]}\t{WORDS[2]}\tfine"]) + "\n", encoding="utf-8")
    files = {**files, "three": three}
    capsys.readouterr()
    assert _run(files, out, "--seeds", "1", "--max-steps", "1", "--resume", "auto", "--allow-change", "data",
                "--allow-change", "task", train="three") == 2
    err = capsys.readouterr().err
    assert "task.labels was" in err and '"fine"' in err and "it cannot change on resume" in err
    assert "the label set sizes the classifier's head" in err and "Traceback" not in err
    assert (out / "finetune_run.json").read_bytes() == before  # the run's record is the run's, as it was
    assert _run(files, out, "--seeds", "1", "--max-steps", "1", "--resume", "auto") == 0  # and it still resumes


def test_a_record_from_before_the_rulebook_still_resumes(files, tmp_path):
    """Older records kept bare data hashes and the batch fields; both are read as today's."""
    out = tmp_path / "run"
    assert _run(files, out, "--seeds", "1", "--max-steps", "1") == 0
    record = json.loads((out / "finetune_run.json").read_text())
    record["data"] = {"train": record["data"]["train"]["sha256"],
                      "dev": [entry["sha256"] for entry in record["data"]["dev"]]}
    record |= {"global_batch_size": None, "micro_batch_size": None, "gradient_accumulation_steps": None,
               "batch_size": 32}
    (out / "finetune_run.json").write_text(json.dumps(record), encoding="utf-8")
    assert _run(files, out, "--seeds", "1", "--max-steps", "1", "--resume", "auto", "--batch-size", "4") == 0


def test_fine_tuning_refuses_an_allow_change_of_pre_training_alone():
    """`--allow-change nsp` on a fine-tuning was accepted and meant nothing (issue 51's tour)."""
    from bertkit.errors import BertkitError
    from bertkit.settings import FinetuneSettings

    with pytest.raises(BertkitError, match="--allow-change nsp: fine-tuning has no such setting"):
        FinetuneSettings.of(model="m", output="o", allow_change=("nsp",))
    assert FinetuneSettings.of(model="m", output="o", allow_change=("data",)).train.allow_change == ("data",)


@pytest.mark.parametrize("kept", [{}, {"accuracy": float("nan"), "step": 2}, {"accuracy": "x", "step": 2},
                                  {"accuracy": 0.5}, {"accuracy": 0.5, "step": True}])
def test_a_finished_seeds_marker_that_bertkit_did_not_write_trains_the_seed_again(tmp_path, kept, caplog):
    """seed_results.json as `{}`, with NaN or a string metric gave KeyError/AttributeError/ValueError tracebacks on
    resume (issue 50's attack pass): such a marker is not a finished seed."""
    import json
    import logging

    from bertkit.workflows.run_output import finished_seed

    (tmp_path / "seed_results.json").write_text(json.dumps(kept))
    with caplog.at_level(logging.WARNING):
        assert finished_seed(tmp_path) is None
    (tmp_path / "seed_results.json").write_text(json.dumps({"accuracy": 0.5, "step": 2}))
    assert finished_seed(tmp_path) == {"accuracy": 0.5, "step": 2}
