"""Multi-node, proved on loopback: two torchrun launchers on 127.0.0.1 (two "nodes", gloo) run `bertkit
pretrain` and `bertkit finetune` and give the same per-step losses (fp32, dropout 0) as one process with the
same global batch; under fine-tuning every task kind trains with DDP, evaluates the whole dev set (gathered)
and rank 0 alone writes. Slow: every launch starts real processes (pytest -m slow tests/train/test_multinode.py).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from bertkit.data.pretraining import build_pretraining_data
from bertkit.settings import InstanceSettings, PretrainingDataSettings
from bertkit.tokenizer import WordPieceTokenizer

pytestmark = pytest.mark.slow

SRC = Path(__file__).resolve().parents[2] / "src"
WORDS = "good bad fine poor great awful nice grim calm wild".split()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _environment() -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "TMPDIR")}
    return {**keep, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(SRC)}


def run_alone(*arguments: str) -> None:
    done = subprocess.run([sys.executable, "-m", "bertkit.cli", *arguments], capture_output=True, text=True,
                          timeout=300, env=_environment())
    assert done.returncode == 0, done.stderr[-3000:]


def run_two_nodes(*arguments: str, per_node: int = 1) -> list[str]:
    """`torchrun --nnodes 2` twice on 127.0.0.1 (node ranks 0 and 1), as on two machines; their logs."""
    port = _free_port()
    launchers = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", str(per_node),
         "--node-rank", str(node), "--master-addr", "127.0.0.1", "--master-port", str(port),
         "-m", "bertkit.cli", *arguments],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_environment()) for node in (0, 1)]
    logs = []
    for launcher in launchers:
        try:
            out, _ = launcher.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            for other in launchers:
                other.kill()
            raise
        logs.append(out)
        assert launcher.returncode == 0, out[-4000:]
    return logs


def records(path: Path, kind: str) -> list[dict]:
    return [r for r in map(json.loads, path.read_text().splitlines()) if r["kind"] == kind]


def train_records(path: Path) -> list[dict]:
    return records(path, "train")


@pytest.fixture(scope="module")
def files(tmp_path_factory, write_toy_corpus) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("multinode")
    corpus = write_toy_corpus(root / "corpus.txt", documents=30, sentences=(3, 8), words=(6, 20))
    tokenizer = WordPieceTokenizer.train([corpus], vocab_size=120, min_frequency=1)
    tokenizer.save_pretrained(root / "tok")
    build_pretraining_data(PretrainingDataSettings(
        (str(corpus),), "(in memory)", str(root / "data"), workers=1, quiet=True,
        instances=InstanceSettings(max_seq_length=64, dupe_factor=1, masking="dynamic")), tokenizer)
    for name, count in (("train", 40), ("dev", 11)):  # 11: the dev set does not split evenly over ranks
        rows = [f"{' '.join(WORDS[(i * 7 + j) % 10] for j in range(3 + i % 5))}\t{'pos' if i % 3 else 'neg'}"
                for i in range(count)]
        (root / f"{name}.tsv").write_text("text\tlabel\n" + "\n".join(rows) + "\n", encoding="utf-8")
    return {"root": root, "tok": root / "tok", "data": root / "data", "train": root / "train.tsv",
            "dev": root / "dev.tsv"}


PRETRAIN = ("pretrain", "--model", "bert-debug", "--max-steps", "4", "--global-batch-size", "8",
            "--dropout", "0", "--precision", "fp32", "--device", "cpu", "--eval-examples", "8",
            "--eval-every", "2", "--save-every", "2", "--nsp")  # NSP too (the short recipe has none): both objectives


def test_pretraining_on_two_nodes_equals_one_process(files, tmp_path):
    common = (*PRETRAIN, "--data", str(files["data"]), "--tokenizer", str(files["tok"]))
    run_alone(*common, "--micro-batch-size", "4", "--output", str(tmp_path / "one"))  # accumulation 2
    run_two_nodes(*common, "--micro-batch-size", "2", "--output", str(tmp_path / "two"), per_node=2)  # world 4
    one, two = train_records(tmp_path / "one" / "metrics.jsonl"), train_records(tmp_path / "two" / "metrics.jsonl")
    assert len(one) == len(two) == 4
    for alone, nodes in zip(one, two):
        for key in ("loss", "mlm_loss", "mlm_accuracy", "nsp_loss", "nsp_accuracy"):
            assert nodes[key] == pytest.approx(alone[key], rel=1e-4, abs=1e-6), key
    # held-out evaluation: each process scores its share against the same baseline, and the sums are added up
    one_eval, two_eval = (records(tmp_path / run / "metrics.jsonl", "eval") for run in ("one", "two"))
    assert len(one_eval) == len(two_eval) == 2
    for alone, nodes in zip(one_eval, two_eval):
        for key in ("mlm_loss", "mlm_accuracy", "mlm_context_gain", "nsp_loss"):
            assert nodes[key] == pytest.approx(alone[key], rel=1e-4, abs=1e-6), key
    settings = json.loads((tmp_path / "two" / "pretrain_settings.json").read_text())
    assert settings["world_size"] == 4 and settings["batch"] == {"global": 8, "micro": 2, "accumulation": 1}
    assert (tmp_path / "two" / "final" / "model.safetensors").is_file()


@pytest.fixture(scope="module")
def pretrained(files, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("pretrained")
    run_alone(*PRETRAIN, "--data", str(files["data"]), "--tokenizer", str(files["tok"]), "--output", str(out))
    return out / "final"


def test_finetuning_on_two_nodes_equals_one_process(files, pretrained, tmp_path):
    common = ("finetune", "classification", "--model", str(pretrained), "--train", str(files["train"]),
              "--dev", str(files["dev"]), "--epochs", "2", "--global-batch-size", "8", "--dropout", "0",
              "--precision", "fp32", "--device", "cpu", "--learning-rate", "1e-3", "--seeds", "1,2")
    run_alone(*common, "--micro-batch-size", "8", "--output", str(tmp_path / "one"))
    logs = run_two_nodes(*common, "--micro-batch-size", "2", "--output", str(tmp_path / "two"), per_node=1)
    for seed in (1, 2):
        one = train_records(tmp_path / "one" / f"seed-{seed}" / "metrics.jsonl")
        two = train_records(tmp_path / "two" / f"seed-{seed}" / "metrics.jsonl")
        assert len(one) == len(two) == 10  # 40 examples / 8 x 2 epochs
        assert [r["loss"] for r in two] == pytest.approx([r["loss"] for r in one], rel=1e-4, abs=1e-6)
    results = [json.loads((tmp_path / run / "eval_results.json").read_text()) for run in ("one", "two")]
    assert results[1]["world_size"] == 2 and results[1]["best_seed"] == results[0]["best_seed"]
    for seed in ("1", "2"):  # the whole dev set, gathered: the same scores at the same best step
        assert results[1]["seeds"][seed] == pytest.approx(results[0]["seeds"][seed], rel=1e-4)
    assert len((tmp_path / "two" / "predictions.jsonl").read_text().splitlines()) == 11
    assert "done" in logs[0] or "best" in logs[0]


def _conll(path: Path, count: int) -> Path:
    sentences = []
    for i in range(count):
        words = [WORDS[(i * 3 + j) % 10] for j in range(2 + i % 4)]
        sentences.append("\n".join(f"{w} {'B-X' if w in ('good', 'nice') else 'O'}" for w in words))
    path.write_text("\n\n".join(sentences) + "\n", encoding="utf-8")
    return path


def _squad(path: Path, count: int) -> Path:
    paragraphs = []
    for i in range(count):
        context = " ".join(WORDS[(i + j) % 10] for j in range(8))
        answer = WORDS[(i + 3) % 10]
        paragraphs.append({"context": context, "qas": [{"id": f"q{i}", "question": f"where is {answer}",
                                                        "answers": [{"text": answer,
                                                                     "answer_start": context.index(answer)}]}]})
    path.write_text(json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": paragraphs}]}),
                    encoding="utf-8")
    return path


def _swag(path: Path, count: int) -> Path:
    header = "video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3,label"
    rows = [f"v{i},{i},{WORDS[i % 10]} went,{WORDS[i % 10]},went,gold,{WORDS[(i + 1) % 10]},{WORDS[(i + 2) % 10]},"
            f"{WORDS[(i + 3) % 10]},{WORDS[(i + 4) % 10]},{i % 4}" for i in range(count)]
    path.write_text(header + "\n" + "\n".join(rows) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("kind", ["tagging", "squad", "multiple-choice"])
def test_every_task_kind_fine_tunes_on_two_processes_as_on_one(kind, pretrained, tmp_path):
    make = {"tagging": (_conll, "conll"), "squad": (_squad, "json"), "multiple-choice": (_swag, "csv")}[kind]
    train, dev = make[0](tmp_path / f"train.{make[1]}", 16), make[0](tmp_path / f"dev.{make[1]}", 5)
    common = ("finetune", kind, "--model", str(pretrained), "--train", str(train), "--dev", str(dev),
              "--max-steps", "3", "--global-batch-size", "4", "--dropout", "0", "--precision", "fp32",
              "--device", "cpu", "--learning-rate", "1e-3", "--max-seq-length", "32")
    run_alone(*common, "--output", str(tmp_path / "one"))
    run_two_nodes(*common, "--output", str(tmp_path / "two"), per_node=1)
    one = train_records(tmp_path / "one" / "seed-1" / "metrics.jsonl")
    two = train_records(tmp_path / "two" / "seed-1" / "metrics.jsonl")
    assert [r["loss"] for r in two] == pytest.approx([r["loss"] for r in one], rel=1e-4, abs=1e-6)
    results = [json.loads((tmp_path / run / "eval_results.json").read_text()) for run in ("one", "two")]
    main = next(k for k in results[0]["seeds"]["1"] if k != "step")
    assert results[1]["seeds"]["1"][main] == pytest.approx(results[0]["seeds"]["1"][main], rel=1e-4)


def test_the_random_initialisation_comparison_on_two_nodes_equals_one_process(files, pretrained, tmp_path):
    """`--compare-random-init on` under torchrun: both halves train with DDP, rank 0 alone keeps the better
    initialisation (its marker, the model set aside), and the choice and scores are those of one process."""
    common = ("finetune", "classification", "--model", str(pretrained), "--train", str(files["train"]),
              "--dev", str(files["dev"]), "--epochs", "1", "--global-batch-size", "8", "--dropout", "0",
              "--precision", "fp32", "--device", "cpu", "--learning-rate", "1e-3", "--seeds", "1,2",
              "--compare-random-init", "on")
    run_alone(*common, "--micro-batch-size", "8", "--output", str(tmp_path / "one"))
    run_two_nodes(*common, "--micro-batch-size", "4", "--output", str(tmp_path / "two"), per_node=1)
    reports = [json.loads((tmp_path / run / "eval_results.json").read_text())["random_init"] for run in ("one", "two")]
    assert reports[1]["kept"] == reports[0]["kept"] and reports[1]["compare"]
    for side in ("pre-trained", "random initialisation"):
        assert reports[1][side]["seeds"] == pytest.approx(reports[0][side]["seeds"], rel=1e-4)
    marker = json.loads((tmp_path / "two" / "best" / "initialisation.json").read_text())
    assert marker["kept"] == reports[1]["kept"]
    assert Path(reports[1]["other_model"]).is_dir()  # the side not kept, whole, beside the kept one
    assert json.loads((tmp_path / "two" / "random-init" / "eval_results.json").read_text())["world_size"] == 2
