"""`bertkit distill`: a student of a fine-tuned teacher, end to end through the CLI (tiny models, seconds): what it
learns from the teacher's outputs on unlabelled text, the directory it writes (an ordinary fine-tuned one, with its
lineage), the report (the teacher's score, speed, the comparison without a teacher), exact resume, the rulebook,
and the errors a user can cause."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import random
import signal
from pathlib import Path

import pytest

from bertkit.cli import main
from bertkit.errors import BertkitError, Interrupted
from bertkit.settings import DistillSettings, FinetuneSettings, SquadSettings
from bertkit.tasks.distillation import DistillationLoss
from bertkit.tasks.squad import SquadTask
from bertkit.tokenizer import WordPieceTokenizer
from bertkit.workflows import distill as distilling

FILL = "the a film was is plot acting fine".split()
POLAR = ["good", "great", "bad", "awful"]
COMMON = ["--batch-size", "8", "--learning-rate", "3e-3", "--precision", "fp32", "--device", "cpu", "--threads", "1"]


def _row(rng: random.Random) -> dict:
    word = rng.choice(POLAR)
    words = [rng.choice(FILL) for _ in range(4)]
    words.insert(rng.randint(0, 4), word)
    return {"text": " ".join(words), "label": "pos" if word in ("good", "great") else "neg"}


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A vocabulary, the task's files, and a teacher fine-tuned on it (dev accuracy 1.0)."""
    root = tmp_path_factory.mktemp("distill")
    WordPieceTokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *FILL, *POLAR]).save_pretrained(root / "vocab")
    rng = random.Random(0)
    paths = {"vocab": root / "vocab", "train": _jsonl(root / "train.jsonl", [_row(rng) for _ in range(96)]),
             "dev": _jsonl(root / "dev.jsonl", [_row(rng) for _ in range(32)]),
             "few": _jsonl(root / "few.jsonl", [_row(rng) for _ in range(6)])}
    paths["unlabeled"] = root / "unlabeled.txt"
    paths["unlabeled"].write_text("".join(_row(rng)["text"] + "\n" for _ in range(200)), encoding="utf-8")
    assert main(["finetune", "classification", "--model", "bert-debug", "--tokenizer", str(root / "vocab"), "--train",
                 str(paths["train"]), "--dev", str(paths["dev"]), "--output", str(root / "teacher"), "--epochs", "6",
                 "--max-seq-length", "16", *COMMON]) == 0
    assert json.loads((root / "teacher" / "eval_results.json").read_text())["accuracy"] == 1.0
    paths["teacher"] = root / "teacher" / "best"
    return paths


def _distill(files: dict[str, Path], out: Path, *flags: str, train: str = "few") -> dict:
    assert main(["distill", "classification", "--teacher", str(files["teacher"]), "--train", str(files[train]),
                 "--dev", str(files["dev"]), "--output", str(out), "--epochs", "4", *COMMON, *flags]) == 0
    return json.loads((out / "eval_results.json").read_text())


def test_a_student_learns_the_teachers_answers_from_unlabelled_text(files, tmp_path) -> None:
    """Six labelled examples: a random-init student fine-tuned on them alone guesses; given the teacher's outputs on
    200 unlabelled texts it answers as the teacher does."""
    results = _distill(files, tmp_path / "out", "--student", "bert-debug", "--unlabeled", str(files["unlabeled"]),
                       "--compare-without-teacher", "--seeds", "1,2")
    report = results["distillation"]
    assert results["unlabeled_examples"] == 200 and results["summary"]["accuracy"]["mean"] >= 0.95
    assert report["without_teacher"]["mean"] <= 0.8 and report["without_teacher"]["difference"] >= 0.15
    assert report["teacher_score"] == 1.0 and report["kept"] >= 0.95 and report["student"] == "bert-debug"
    assert report["without_teacher"]["seeds"] and "Welch" in report["without_teacher"]["note"]


def test_the_student_is_an_ordinary_fine_tuned_directory_with_its_lineage(files, tmp_path) -> None:
    out = tmp_path / "out"
    results = _distill(files, out, "--augment", "2", "--hidden-weight", "1", "--attention-weight", "1",
                       "--temperature", "3", train="train")
    config = json.loads((out / "best" / "config.json").read_text())
    assert config["num_hidden_layers"] == 1 and config["architectures"] == ["BertForSequenceClassification"]
    lineage = json.loads((out / "best" / "distillation.json").read_text())
    assert lineage["teacher"] == str(files["teacher"].resolve()) and lineage["layers"] == [0]
    assert (lineage["soft"], lineage["hard"], lineage["hidden"], lineage["attention"], lineage["temperature"]) \
        == (1.0, 1.0, 1.0, 1.0, 3.0)
    assert lineage["layer_map"] == [[0, 0], [1, 2]] and lineage["augment"] == 2
    report = results["distillation"]
    assert report["student_layers"] == 1 and report["teacher_layers"] == 2 and report["speedup"] > 0
    assert report["student_parameters"] < report["teacher_parameters"] and results["augmented_examples"] > 100
    assert json.loads((out / "finetune_run.json").read_text())["distillation"]["temperature"] == 3.0
    assert (out / "teacher-outputs" / "manifest.json").is_file()
    assert main(["predict", "--model", str(out / "best"), "--input", str(files["dev"]), "--output",
                 str(tmp_path / "pred"), "--device", "cpu"]) == 0
    assert len((tmp_path / "pred" / "predictions.jsonl").read_text().splitlines()) == 32
    assert main(["export", "onnx", "--model", str(out / "best"), "--output", str(tmp_path / "onnx")]) == 0


def _settings(files: dict[str, Path], out: Path, **changes) -> tuple[FinetuneSettings, DistillSettings]:
    finetune = FinetuneSettings.of(model="-", output=out, num_epochs=2, batch_size=8, learning_rate=3e-3,
                                   precision="fp32", device="cpu", seeds=(1, 2), eval_every=4, resume=changes.pop(
                                       "resume", False), allow_change=changes.pop("allow_change", ()))
    return finetune, DistillSettings(**{"teacher": files["teacher"], "unlabeled": files["unlabeled"],
                                        "max_unlabeled": 40, **changes})


def _losses(run: Path, seed: int) -> list[tuple[int, float]]:
    records = [json.loads(line) for line in (run / f"seed-{seed}" / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"]) for r in records if r["kind"] == "train"]


def test_an_interrupted_distillation_resumes_bit_exact(files, tmp_path, monkeypatch) -> None:
    distilling.run_distillation("classification", files["few"], [files["dev"]], *_settings(files, tmp_path / "a"))
    calls = {"n": 0}
    real = DistillationLoss.__call__

    def stopping(self, model, batch):
        calls["n"] += 1
        if calls["n"] == 18:  # seed 2, step 6 (12 steps a seed: 46 examples in batches of 8, 2 epochs)
            os.kill(os.getpid(), signal.SIGTERM)
        return real(self, model, batch)
    monkeypatch.setattr(DistillationLoss, "__call__", stopping)
    with pytest.raises(Interrupted):
        distilling.run_distillation("classification", files["few"], [files["dev"]], *_settings(files, tmp_path / "b"))
    monkeypatch.setattr(DistillationLoss, "__call__", real)
    distilling.run_distillation("classification", files["few"], [files["dev"]],
                                *_settings(files, tmp_path / "b", resume=True))
    for seed in (1, 2):
        assert _losses(tmp_path / "b", seed) == _losses(tmp_path / "a", seed)
    with pytest.raises(BertkitError, match="distillation.temperature was 2.0 and is 4.0 now"):
        distilling.run_distillation("classification", files["few"], [files["dev"]],
                                    *_settings(files, tmp_path / "b", resume=True, temperature=4.0))
    distilling.run_distillation("classification", files["few"], [files["dev"]],
                                *_settings(files, tmp_path / "b", resume=True, temperature=4.0,
                                           allow_change=("distillation",)))


def test_a_resume_with_another_teacher_at_the_same_path_is_refused(files, tmp_path) -> None:
    """The record kept the teacher's path only: a teacher replaced there mixed two teachers' targets in one run."""
    import shutil

    from safetensors.torch import load_file, save_file

    teacher = tmp_path / "teacher"
    shutil.copytree(files["teacher"], teacher)
    here = {**files, "teacher": teacher}
    distilling.run_distillation("classification", files["few"], [files["dev"]], *_settings(here, tmp_path / "c"))
    state = load_file(teacher / "model.safetensors")
    name = next(key for key in state if key.endswith("classifier.weight"))
    state[name] = state[name] * 2
    save_file(state, teacher / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(BertkitError, match=r"distillation\.teacher_weights was '[0-9a-f]{16}' and is '[0-9a-f]{16}'"):
        distilling.run_distillation("classification", files["few"], [files["dev"]],
                                    *_settings(here, tmp_path / "c", resume=True))


def test_a_model_inside_the_output_it_would_overwrite_is_refused_before_anything_is_deleted(files, tmp_path,
                                                                                            capsys) -> None:
    """--student OUT/best --output OUT --overwrite deleted the student, then failed to read it (finetune alike)."""
    out = tmp_path / "out"
    _distill(files, out, "--max-steps", "2")
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    capsys.readouterr()
    for command in (["distill", "classification", "--teacher", str(files["teacher"]), "--student", str(out / "best")],
                    ["finetune", "classification", "--model", str(out / "best")]):
        assert main([*command, "--train", str(files["few"]), "--dev", str(files["dev"]), "--output", str(out),
                     "--overwrite", "--max-steps", "2", *COMMON]) == 2
        assert f"best lies inside --output {out}" in capsys.readouterr().err
        assert sorted(p.relative_to(out) for p in out.rglob("*")) == before


def test_a_refused_file_is_said_in_distills_terms_not_finetunes_flags(files, tmp_path, capsys) -> None:
    """--task and --text-column, which distill has not, were the fixes offered."""
    wrong = _jsonl(tmp_path / "wrong.jsonl", [{"sentence": "good film", "y": "pos"}])
    unseen = _jsonl(tmp_path / "unseen.jsonl", [{"text": "good film", "label": "fine"}])
    for flag, path, said in (("--train", wrong, "no column 'text'"), ("--train", unseen, "unknown label 'fine'"),
                             ("--unlabeled", wrong, "no column 'text'")):
        train = files["few"] if flag == "--unlabeled" else path
        extra = [flag, str(path)] if flag == "--unlabeled" else []
        capsys.readouterr()
        assert main(["distill", "classification", "--teacher", str(files["teacher"]), "--train", str(train),
                     "--output", str(tmp_path / "out"), "--max-steps", "2", *extra, *COMMON]) == 2
        err = capsys.readouterr().err
        assert said in err and "--task" not in err and "--text-column" not in err, err
        assert "(distill reads files as its teacher was trained on them: the teacher's columns: text column 'text', "\
               "label column 'label'; its labels: neg, pos)" in err


def test_what_a_user_can_get_wrong_is_one_line_naming_it(files, tmp_path) -> None:
    with pytest.raises(BertkitError, match="is a classification model; run `bertkit distill classification`"):
        distilling.run_distillation("tagging", files["few"], [files["dev"]], *_settings(files, tmp_path / "x"))
    for spec, message in (("layers:0,2", "between 0 and 1"), ("bert-nonexistent", "bert-nonexistent")):
        with pytest.raises(BertkitError, match=message):
            distilling.run_distillation("classification", files["few"], [files["dev"]],
                                        *_settings(files, tmp_path / "x", student=spec))
    with pytest.raises(BertkitError, match="has more layers"):
        distilling.run_distillation("classification", files["few"], [files["dev"]],
                                    *_settings(files, tmp_path / "x", student="bert-mini", hidden_weight=1.0))
    finetune, distill = _settings(files, tmp_path / "x")
    with pytest.raises(BertkitError, match="--head-warmup-steps and --encoder-lr-ratio"):
        distilling.run_distillation("classification", files["few"], [files["dev"]], dataclasses.replace(
            finetune, train=dataclasses.replace(finetune.train, head_warmup_steps=5)), distill)
    with pytest.raises(BertkitError, match="has 2 attention heads and the teacher 4"):
        distilling.run_distillation("classification", files["few"], [files["dev"]],
                                    *_settings(files, tmp_path / "x", student="bert-tiny", attention_weight=1.0))
    other = tmp_path / "other-vocab"
    assert main(["finetune", "classification", "--model", "bert-debug", "--tokenizer", str(files["vocab"]),
                 "--train", str(files["few"]), "--output", str(tmp_path / "plain"), "--epochs", "1", *COMMON]) == 0
    WordPieceTokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "other"]).save_pretrained(other)
    (tmp_path / "plain" / "best" / "vocab.txt").write_text((other / "vocab.txt").read_text())
    with pytest.raises(BertkitError, match="vocabulary is not the teacher's"):
        distilling.run_distillation("classification", files["few"], [files["dev"]],
                                    *_settings(files, tmp_path / "x", student=str(tmp_path / "plain" / "best")))
    pairs = tmp_path / "pairs.txt"
    pairs.write_text("good film\nbad ||| film\n")
    with pytest.raises(BertkitError, match=r"pairs.txt:2: the teacher reads single texts"):
        distilling.run_distillation("classification", files["few"], [files["dev"]],
                                    *_settings(files, tmp_path / "x", unlabeled=pairs))
    with pytest.raises(BertkitError, match="--unlabeled: a squad input is not a line of text"):
        distilling._read_unlabeled(SquadTask(SquadSettings()), DistillSettings(teacher=tmp_path, unlabeled=pairs))
    with pytest.raises(BertkitError, match="--compare-without-teacher compares dev scores: give --dev"):
        distilling.run_distillation("classification", files["few"], [],
                                    *_settings(files, tmp_path / "x", compare_without_teacher=True))
    with pytest.raises(BertkitError, match="every loss weight"):
        DistillSettings(teacher=tmp_path, soft_weight=0, hard_weight=0)
    assert main(["distill", "classification", "--teacher", str(files["teacher"]), "--train", str(files["few"]),
                 "--output", str(tmp_path / "y"), "--temperature", "0"]) != 0


def test_tagging_and_squad_students_through_the_command(files, tmp_path) -> None:
    """Token-level soft targets (a tag distribution per token; start/end distributions over positions), unlabelled
    tagging text, and a wider student whose hidden states reach the teacher's width through a projection."""
    rng = random.Random(3)
    words = [*FILL, *POLAR]
    sentences = ["\n".join(f"{w} {'B-P' if w in POLAR else 'O'}" for w in rng.sample(words, 5)) for _ in range(24)]
    conll = tmp_path / "tags.txt"
    conll.write_text("\n\n".join(sentences) + "\n", encoding="utf-8")
    paragraphs = []
    for i in range(24):
        context = " ".join(rng.choice(FILL) for _ in range(6)) + f" {POLAR[i % 4]} ."
        paragraphs.append({"context": context, "qas": [{"id": f"q{i}", "question": f"is it {POLAR[i % 4]} ?",
                                                        "answers": [{"text": POLAR[i % 4],
                                                                     "answer_start": context.index(POLAR[i % 4])}]}]})
    squad = tmp_path / "squad.json"
    squad.write_text(json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": paragraphs}]}))
    for kind, data, flags in (("tagging", conll, ["--unlabeled", str(files["unlabeled"]), "--augment", "1"]),
                              ("squad", squad, ["--student", "bert-tiny", "--hidden-weight", "1"])):
        teacher = tmp_path / f"{kind}-teacher"
        assert main(["finetune", kind, "--model", "bert-debug", "--tokenizer", str(files["vocab"]), "--train",
                     str(data), "--output", str(teacher), "--epochs", "1", "--max-seq-length", "32", *COMMON]) == 0
        out = tmp_path / f"{kind}-student"
        assert main(["distill", kind, "--teacher", str(teacher / "best"), "--train", str(data), "--dev", str(data),
                     "--output", str(out), "--epochs", "1", *COMMON, *flags]) == 0
        results = json.loads((out / "eval_results.json").read_text())
        assert results["distillation"]["metric"] == "f1" and 0 <= results["f1"] <= 100
        assert (out / "best" / "distillation.json").is_file()
    assert results["distillation"]["student_parameters"] > results["distillation"]["teacher_parameters"]
    assert json.loads((tmp_path / "squad-student" / "best" / "config.json").read_text())["hidden_size"] == 128


def test_unlabelled_files_are_read_as_their_format_says(files, tmp_path, caplog) -> None:
    """A JSONL file by the teacher's text column (not its raw lines), blank lines skipped, a CoNLL file's words (not
    'word tag' sentences), sentences a line for a tagger, and an output that holds the teacher refused."""
    from bertkit.tasks.finetuned import load_task

    task = load_task(files["teacher"])
    table = _jsonl(tmp_path / "more.jsonl", [{"text": "good film"}, {"other": "x"}, {"text": "bad plot"}])
    read = distilling._read_unlabeled(task, DistillSettings(teacher=tmp_path, unlabeled=table))
    assert [e.text for e in read] == ["good film", "bad plot"]  # the row without the column is skipped, said
    lines = tmp_path / "lines.txt"
    lines.write_text("good film\n\n   \nbad plot\n")
    assert [e.text for e in distilling._read_unlabeled(task, DistillSettings(teacher=tmp_path, unlabeled=lines))] \
        == ["good film", "bad plot"]
    blank = tmp_path / "blank.txt"
    blank.write_text("\n  \n")
    with pytest.raises(BertkitError, match="no inputs in it"):
        distilling._read_unlabeled(task, DistillSettings(teacher=tmp_path, unlabeled=blank))
    from bertkit.settings import TaggingSettings
    from bertkit.tasks.tagging import TaggingTask

    tagger = TaggingTask(TaggingSettings(labels=["B-P", "O"]))
    for text, words in (("the O\nfilm B-P\n\nbad O\n", [["the", "film"], ["bad"]]),
                        ("the\nfilm\n\nbad\n", [["the", "film"], ["bad"]]),
                        ("the film was good\nbad plot\n", [["the", "film", "was", "good"], ["bad", "plot"]])):
        path = tmp_path / "tags.txt"
        path.write_text(text)
        read = distilling._read_unlabeled(tagger, DistillSettings(teacher=tmp_path, unlabeled=path))
        assert [s.words for s in read] == words and all(s.labels is None for s in read)
    path.write_text("john went to B-52\nmary saw the I-95\n")  # sentences that end in tag-like words
    with caplog.at_level(logging.INFO):
        read = distilling._read_unlabeled(tagger, DistillSettings(teacher=tmp_path, unlabeled=path))
    assert [s.words for s in read] == [["john", "mary"]]  # the documented CoNLL reading, now said
    assert "the other columns of 2 line(s) not read: if they are sentences" in caplog.text  # was unsaid
    with pytest.raises(BertkitError, match="holds the teacher"):
        distilling.check_teacher(files["teacher"], files["teacher"].parent)
    with pytest.raises(BertkitError, match="is a preset"):
        distilling.check_teacher(Path("bert-debug"), tmp_path / "out")
    with pytest.raises(BertkitError, match="--teacher"):
        distilling.check_teacher(tmp_path / "missing", tmp_path / "out")
    with pytest.raises(BertkitError, match="temperature"):
        DistillSettings(teacher=tmp_path, temperature=float("inf"))
    with pytest.raises(BertkitError, match="soft_weight|soft-weight"):
        DistillSettings(teacher=tmp_path, soft_weight=float("inf"))
