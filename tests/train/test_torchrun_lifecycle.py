"""A torchrun job that survives what clusters do to it (issue 38), with real processes: two trainings in one
job (`bertkit glue` with two tasks), SIGTERM to the torchrun launcher while DataLoader workers run (the
checkpoint of the step it stopped at, then an exact resume), every rank signalled twice 10 ms apart, a signal
during the final evaluation on one rank only, and a rank that reads a different file than rank 0. Slow:
torchrun starts real processes (gloo on CPU)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bertkit.data.pretraining import build_pretraining_data
from bertkit.settings import InstanceSettings, PretrainingDataSettings
from bertkit.tokenizer import WordPieceTokenizer
from bertkit.train import checkpoint as ckpt

pytestmark = pytest.mark.slow
WORKER = Path(__file__).with_name("lifecycle_worker.py")
TESTS = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _environment() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(WORKER.parent)}


def _torchrun(*arguments: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", f"--master-port={_free_port()}",
            *arguments]


def _scenario(name: str, out: Path) -> str:
    done = subprocess.run(_torchrun(str(WORKER), name, str(out)), capture_output=True, text=True, timeout=180,
                          env=_environment())
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_every_rank_signalled_twice_10ms_apart_still_saves(tmp_path):
    stdout = _scenario("double-signal", tmp_path)
    assert "rank 0: signal at step 3" in stdout and "rank 1: signal at step 3" in stdout
    assert [p.name for p in ckpt.list_checkpoints(tmp_path / "checkpoints")] == ["step-00000003"]


def test_a_signal_during_the_final_evaluation_stops_every_rank(tmp_path):
    stdout = _scenario("late-signal", tmp_path)
    assert "rank 0: signal at step 3" in stdout and "rank 1: signal at step 3" in stdout


def test_a_rank_that_reads_another_file_does_not_leave_the_others_waiting(tmp_path):
    stdout = _scenario("file-view", tmp_path / "run")  # before: rank 1 skipped the seed, rank 0 waited forever
    assert "rank 0: budget" in stdout and "rank 1: budget" in stdout


def test_glue_with_two_tasks_runs_under_torchrun(tmp_path):
    sys.path.insert(0, str(TESTS / "workflows"))
    from test_glue_command import WORDS, write_glue  # the GLUE layout and vocabulary those tests use

    from bertkit.config import preset
    from bertkit.model import BertForPreTraining

    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, "(", ")", "x", ".", ","]
    BertForPreTraining(preset("bert-debug", vocab_size=len(tokens))).save_pretrained(
        tmp_path / "model", tokenizer=WordPieceTokenizer(tokens))
    data = write_glue(tmp_path / "glue", ("SST-2", "MRPC"))
    command = _torchrun("-m", "bertkit.cli", "glue", "--model", str(tmp_path / "model"), "--data", str(data),
                        "--output", str(tmp_path / "out"), "--epochs", "1", "--seeds", "1",
                        "--global-batch-size", "4", "--learning-rates", "5e-5", "--max-seq-length", "32",
                        "--precision", "fp32", "--device", "cpu")
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=_environment())
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((tmp_path / "out" / "glue_results.json").read_text())
    assert set(results["tasks"]) == {"sst2", "mrpc"}


@pytest.fixture(scope="module")
def pretraining_files(tmp_path_factory, write_toy_corpus) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("preemption")
    corpus = write_toy_corpus(root / "corpus.txt", documents=40, sentences=(3, 8), words=(6, 20))
    tokenizer = WordPieceTokenizer.train([corpus], vocab_size=120, min_frequency=1)
    tokenizer.save_pretrained(root / "tok")
    build_pretraining_data(PretrainingDataSettings(
        (str(corpus),), "(in memory)", str(root / "data"), workers=1, quiet=True,
        instances=InstanceSettings(max_seq_length=64, dupe_factor=2, masking="dynamic")), tokenizer)
    return {"tok": root / "tok", "data": root / "data"}


def _pretrain(files: dict[str, Path], out: Path, *extra: str) -> list[str]:
    return _torchrun("-m", "bertkit.cli", "pretrain", "--data", str(files["data"]), "--tokenizer", str(files["tok"]),
                     "--model", "bert-tiny", "--max-steps", "120", "--global-batch-size", "8", "--dropout", "0.1",
                     "--precision", "fp32", "--device", "cpu", "--num-workers", "2", "--eval-examples", "8",
                     "--eval-every", "1000", "--save-every", "1000", "--output", str(out), *extra)


def _losses(out: Path) -> list[float]:
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    by_step = {r["step"]: r["loss"] for r in records if r["kind"] == "train"}  # a resumed run's steps once each
    return [by_step[step] for step in sorted(by_step)]


def test_sigterm_to_the_launcher_saves_the_step_and_resume_continues_exactly(pretraining_files, tmp_path):
    straight = subprocess.run(_pretrain(pretraining_files, tmp_path / "straight"), capture_output=True, text=True,
                              timeout=300, env=_environment())
    assert straight.returncode == 0, straight.stderr[-3000:]

    out = tmp_path / "stopped"
    launcher = subprocess.Popen(_pretrain(pretraining_files, out), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=_environment())
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (
            (out / "metrics.jsonl").is_file() and len((out / "metrics.jsonl").read_text().splitlines()) >= 10):
        time.sleep(0.05)
    launcher.send_signal(signal.SIGTERM)  # what a cluster does: to the launcher, which stops its workers' groups
    _, stderr = launcher.communicate(timeout=120)
    assert launcher.returncode != 0  # stopped, not finished
    assert "is killed by signal" not in stderr, stderr[-3000:]
    saved = ckpt.list_checkpoints(out / "checkpoints")
    assert saved, stderr[-3000:]
    stopped_at = len(_losses(out))
    assert saved[-1].name == ckpt.checkpoint_name(stopped_at) and stopped_at < 120

    # a fresh start over those checkpoints is refused on every rank before the plan: none waits in a collective
    refused = subprocess.run(_pretrain(pretraining_files, out), capture_output=True, text=True, timeout=120,
                             env=_environment())
    assert refused.returncode != 0 and "already holds checkpoints" in refused.stderr, refused.stderr[-3000:]
    assert "precision auto" not in refused.stderr and "recipe" not in refused.stderr
    assert ckpt.list_checkpoints(out / "checkpoints") == saved

    resumed = subprocess.run(_pretrain(pretraining_files, out, "--resume", "auto"), capture_output=True, text=True,
                             timeout=300, env=_environment())
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert _losses(out) == _losses(tmp_path / "straight")  # bit-exact on CPU
