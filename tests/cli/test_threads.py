"""`--threads N` on the training and inference commands (issue 30): the flag exists with serve's help, sets
torch's threads before the library runs (tokenizer train: the tokenizers pool), is kept in the settings the
run records, and leaves torch's default alone when unset. The library entry points are replaced by recorders,
and torch.set_num_threads by a recorder too, so the test process keeps its threads."""

from __future__ import annotations

import dataclasses
import os
from types import SimpleNamespace

import click
import pytest
import torch

from bertkit.cli import cli, main
from bertkit.settings import TrainConfig

COMMANDS = ("pretrain", "finetune classification", "finetune tagging", "finetune squad", "finetune multiple-choice",
            "glue", "predict", "evaluate", "extract", "tokenizer train", "serve", "quickstart", "doctor")


def _command(name: str) -> click.Command:
    command: click.Command = cli
    for part in name.split():
        command = command.get_command(click.Context(cli), part)  # type: ignore[attr-defined]
    return command


@pytest.mark.parametrize("name", COMMANDS)
def test_the_commands_take_threads(name):
    [option] = [p for p in _command(name).params if p.name == "threads"]
    assert option.opts == ["--threads"] and option.default is None
    assert isinstance(option.type, click.IntRange) and option.type.min == 1
    if name not in ("serve", "tokenizer train", "doctor"):
        assert option.help == next(p for p in _command("serve").params if p.name == "threads").help


@pytest.fixture
def threads_set(monkeypatch):
    calls: list[int] = []
    monkeypatch.setattr(torch, "set_num_threads", calls.append)
    return calls


def test_pretrain_sets_and_records_threads(monkeypatch, tmp_path, threads_set):
    """The library applies --threads (issue 47: a caller of `pretrain()` had it recorded and ignored); the command
    passes the flag into the TrainConfig it records."""
    from bertkit.errors import BertkitError
    from bertkit.settings import PretrainSettings
    from bertkit.workflows import pretrain as pretraining

    with pytest.raises(BertkitError):  # no data there: stops after the threads are set, before any file is read
        pretraining.pretrain(PretrainSettings(data=str(tmp_path / "none"), model="bert-debug",
                                              output=str(tmp_path / "run")), TrainConfig(max_steps=1, threads=1))
    assert threads_set == [1]
    seen = {}
    monkeypatch.setattr(pretraining, "pretrain", lambda settings, train: seen.update(train=train) or SimpleNamespace(
        stop_reason="done", signal=None, checkpoint=None))
    (tmp_path / "data").mkdir()
    argv = ["pretrain", "--data", str(tmp_path / "data"), "--output", str(tmp_path / "run"), "--max-steps", "1"]
    assert main([*argv, "--threads", "1"]) == 0
    assert seen["train"].threads == 1 and dataclasses.asdict(seen["train"])["threads"] == 1  # recorded
    assert main(argv) == 0 and seen["train"].threads is None and threads_set == [1]  # unset: torch's default
    assert main([*argv, "--threads", "0"]) == 2


def test_finetuning_as_a_library_call_sets_its_threads(tmp_path, threads_set):
    from bertkit.errors import BertkitError
    from bertkit.settings import FinetuneSettings
    from bertkit.workflows.finetune import run_finetuning

    settings = FinetuneSettings.of(model=str(tmp_path / "none"), output=tmp_path / "out", threads=2)
    with pytest.raises(BertkitError):  # no model there: stops after the threads are set
        run_finetuning("classification", tmp_path / "x.tsv", [], settings, {})
    assert threads_set == [2]


def test_finetune_predict_and_extract_pass_threads_to_the_library(monkeypatch, tmp_path, threads_set):
    """The commands put --threads into the settings and leave setting them to the library (below)."""
    from bertkit.workflows import extract, finetune, predict

    seen: dict[str, list[int]] = {}
    monkeypatch.setattr(finetune, "run_finetuning", lambda kind, train, dev, cfg, options: seen.update(
        finetune=[*threads_set, cfg.train.threads]) or {"seeds": {}, "summary": {}})
    monkeypatch.setattr(predict, "predict_file", lambda settings: seen.update(
        predict=[*threads_set, settings.threads]) or {"examples": 0, "skipped": 0})
    monkeypatch.setattr(extract, "extract_features", lambda settings: seen.update(
        extract=[*threads_set, settings.threads]) or 0)
    (tmp_path / "model").mkdir()
    model, data = str(tmp_path / "model"), str(tmp_path / "x.tsv")
    main(["finetune", "classification", "--model", model, "--train", data, "--dev", data, "--output",
          str(tmp_path / "out"), "--threads", "2"])
    assert seen["finetune"] == [2]
    assert main(["predict", "--model", model, "--input", data, "--output", str(tmp_path / "p"), "--threads", "3"]) == 0
    assert seen["predict"] == [3]
    assert main(["extract", "--model", model, "--input", data, "--output", str(tmp_path / "v.npy"),
                 "--threads", "1"]) == 0
    assert seen["extract"] == [1]


def test_predict_extract_and_serve_as_library_calls_set_their_threads(tmp_path, threads_set):
    """A caller of predict_file, extract_features or load_predictor gets the threads its settings give, before
    anything is read (here: no model, so each stops right after)."""
    from bertkit.errors import BertkitError
    from bertkit.serve.predictor import load_predictor
    from bertkit.settings import ExtractSettings, PredictSettings, ServeSettings
    from bertkit.workflows.extract import extract_features
    from bertkit.workflows.predict import predict_file

    missing = tmp_path / "none"
    predict = PredictSettings(str(missing), str(tmp_path / "in.csv"), str(tmp_path / "out"), threads=3)
    calls = [lambda: predict_file(predict),
             lambda: extract_features(ExtractSettings(missing, tmp_path / "in.txt", tmp_path / "v.npy", threads=1)),
             lambda: load_predictor(ServeSettings(missing, threads=2))]
    for call in calls:
        with pytest.raises(BertkitError):
            call()
    assert threads_set == [3, 1, 2]


def test_tokenizer_train_sizes_the_tokenizers_pool(monkeypatch, tmp_path):
    from bertkit.tokenizer import training

    monkeypatch.delenv("RAYON_NUM_THREADS", raising=False)
    seen = []

    def first_pass(*args, **kwargs):  # the first read of the corpus, before the trainer's pool starts
        seen.append(os.environ.get("RAYON_NUM_THREADS"))
        raise SystemExit(0)
    monkeypatch.setattr(training, "_alphabet", first_pass)
    corpus = tmp_path / "c.txt"
    corpus.write_text("a b c\n")
    with pytest.raises(SystemExit):
        main(["tokenizer", "train", "--input", str(corpus), "--output", str(tmp_path / "v"), "--threads", "1"])
    assert seen == ["1"]


def test_threads_must_be_positive_for_python_callers_too():
    with pytest.raises(Exception, match="threads"):
        TrainConfig(max_steps=1, threads=0)


def test_quickstart_and_doctor_set_their_threads(monkeypatch, tmp_path, threads_set):
    """Issue 51: neither had --threads. The quickstart applies them before it measures the machine; doctor
    before it probes (the probe's cache is kept per thread count)."""
    from bertkit.errors import BertkitError
    from bertkit.quickstart import stages
    from bertkit.runtime import report

    def stop(device):
        raise BertkitError("stopped after the threads were set")
    monkeypatch.setattr(stages, "machine_info", stop)
    assert main(["quickstart", "--output", str(tmp_path / "qs"), "--threads", "1"]) == 2
    assert threads_set == [1]
    monkeypatch.setattr(report, "summary", lambda width, refresh: ["the machine"])
    assert main(["doctor", "--threads", "2"]) == 0 and threads_set == [1, 2]
