"""An output bertkit cannot write is refused in one line, before any work (issue 50: `tokenizer train --output`
on a read-only filesystem, /proc or /sys gave a 32-47-line traceback after the training had run, its work lost;
`finetune --output` on a read-only filesystem a traceback from run_output.py). /proc and /sys refuse writes even
to root, so they stand in for a read-only filesystem here; a file where a directory is needed is the third case.
A write that fails later anyway (a disk that fills) is one line too."""

from __future__ import annotations

import errno

import pytest

import bertkit.cli
from bertkit.cli import main
from bertkit.config import preset
from bertkit.model import BertForSequenceClassification, BertModel
from bertkit.tokenizer import WordPieceTokenizer

WORDS = ["the", "cat", "sat", "on", "mat", "dog", "ran"]
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
UNWRITABLE = ["/proc/bertkit-test/out", "/sys/bertkit-test-out"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("unwritable")
    corpus = root / "corpus.txt"
    corpus.write_text("the cat sat on the mat\nthe dog ran\n\nthe mat sat\nthe cat ran\n", encoding="utf-8")
    tokenizer = WordPieceTokenizer(VOCAB)
    BertModel(preset("bert-debug", vocab_size=len(VOCAB))).save_pretrained(root / "bert", tokenizer=tokenizer)
    classifier = BertForSequenceClassification(preset("bert-debug", vocab_size=len(VOCAB), num_labels=2))
    classifier.save_pretrained(root / "classifier", tokenizer=tokenizer)
    table = root / "train.csv"
    table.write_text("text,label\nthe cat,a\nthe dog,b\n", encoding="utf-8")
    (root / "a_file").write_text("x")
    return root


def _commands(root, output):
    return {
        "tokenizer train": ["tokenizer", "train", "--input", str(root / "corpus.txt"), "--output", output,
                            "--vocab-size", "40"],
        "data pretraining": ["data", "pretraining", "--input", str(root / "corpus.txt"), "--tokenizer",
                             str(root / "bert"), "--output", output],
        "finetune": ["finetune", "classification", "--model", str(root / "bert"), "--train", str(root / "train.csv"),
                     "--output", output, "--max-steps", "1"],
        "extract": ["extract", "--model", str(root / "bert"), "--input", str(root / "corpus.txt"), "--output",
                    output + ".npy"],
        "export": ["export", "onnx", "--model", str(root / "bert"), "--output", output],
        "quickstart": ["quickstart", "--output", output, "--max-steps", "1"],
        "pretrain": ["pretrain", "--data", str(root), "--model", "bert-debug", "--output", output, "--max-steps", "1"],
    }


@pytest.mark.parametrize("command", ["tokenizer train", "data pretraining", "finetune", "extract", "export",
                                     "quickstart", "pretrain"])
@pytest.mark.parametrize("where", [*UNWRITABLE, "a_file/out"])
def test_an_unwritable_output_is_one_line_before_any_work(command, where, files, capsys, monkeypatch):
    import bertkit.tokenizer as tokenizer_module

    monkeypatch.setattr(tokenizer_module, "train_vocabulary", lambda *a: pytest.fail("trained before the check"))
    output = str(files / where) if where.startswith("a_file") else where
    assert main(_commands(files, output)[command]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "--output" in err and ("cannot write" in err or "is a file" in err), err


def test_a_write_that_fails_later_is_one_line(monkeypatch, capsys):
    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", "/data/run/checkpoints/step-00000100")
    monkeypatch.setattr(bertkit.cli, "cli", type("C", (), {"main": staticmethod(full_disk)}))
    assert main(["pretrain"]) == 1
    err = capsys.readouterr().err
    assert err.strip() == ("bertkit: error: /data/run/checkpoints/step-00000100: No space left on device; free "
                           "space on that disk, then run the command again (with --resume auto where it has one)")
