"""Hostile checkpoints, configs and weight files (issue 12): every one ends in one `BertkitError` that
names the file or flag and the fix (on the command line: `bertkit: error: ...`, exit 2, no traceback),
never a traceback, a silent restart from step 0, or a read outside the model directory."""

from __future__ import annotations

import errno
import json
import os
import random
from pathlib import Path

import pytest
import torch
from safetensors import SafetensorError
from safetensors.torch import save_file
from torch import nn

from bertkit.cli import main
from bertkit.config import BertConfig, preset
from bertkit.data import InstanceSettings, build_pretraining_data
from bertkit.errors import BertkitError
from bertkit.model import BertForPreTraining, BertModel, pretrained
from bertkit.model.pretrained import read_state_dict
from bertkit.settings import PretrainingDataSettings
from bertkit.tokenizer import WordPieceTokenizer
from bertkit.train import TrainConfig, fit
from bertkit.train import checkpoint as ckpt

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "##s", "sat", "on", "mat"]
TOY = dict(micro_batch_size=2, learning_rate=1e-2, precision="fp32", warmup_steps=0, save_every=1, keep_last=5,
           log_every=1)


def toy_run(output: Path, steps: int, **kwargs) -> object:
    torch.manual_seed(0)
    data = [{"x": torch.randn(3), "y": torch.randn(1)} for _ in range(8)]
    return fit(nn.Linear(3, 1), lambda m, b: (nn.functional.mse_loss(m(b["x"]), b["y"]), {}), data,
               TrainConfig(max_steps=steps, **TOY), output, **kwargs)


def rewrite(checkpoint: Path, name: str, content: object) -> None:
    """Replace one file and re-hash the manifest, so the checkpoint still verifies."""
    ckpt.write_json(checkpoint / name, content)
    (checkpoint / ckpt.MANIFEST).unlink()
    ckpt.write_manifest(checkpoint)


def cli_error(capsys, argv: list[str]) -> str:
    """Run the CLI, expect exit 2 with the one-line error last on stderr (after any log lines), return it."""
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.endswith("\n"), err
    last = err.splitlines()[-1]
    assert last.startswith("bertkit: error: "), err
    return last


def model_dir(tmp_path: Path, vocab: list[str] = VOCAB, **config) -> Path:
    directory = tmp_path / "model"
    BertModel(preset("bert-debug", vocab_size=len(VOCAB), **config)).save_pretrained(directory)
    (directory / "vocab.txt").write_text("\n".join(vocab) + "\n")
    return directory


# --- 4. --resume auto over nothing but corrupt checkpoints -------------------------------------------

@pytest.fixture(scope="module")
def pretraining_data(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("pretraining")
    rng = random.Random(0)
    words = "the river ran past old stone mills where the miller kept his grain and his book".split()
    corpus = root / "corpus.txt"
    corpus.write_text("\n\n".join("\n".join(" ".join(rng.choice(words) for _ in range(8)) + "."
                                            for _ in range(4)) for _ in range(12)) + "\n")
    tokenizer = WordPieceTokenizer.train([corpus], vocab_size=60, min_frequency=1)
    tokenizer.save_pretrained(root / "tok")
    build_pretraining_data(PretrainingDataSettings(
        (str(corpus),), "(in memory)", str(root / "data"), workers=1, quiet=True,
        instances=InstanceSettings(max_seq_length=24)), tokenizer)
    return {"tok": root / "tok", "data": root / "data"}


def test_resume_auto_with_every_checkpoint_corrupt_stops_instead_of_starting_over(pretraining_data, tmp_path,
                                                                                   capsys):
    def pretrain(*flags: str) -> list[str]:
        return ["pretrain", "--data", str(pretraining_data["data"]), "--tokenizer", str(pretraining_data["tok"]),
                "--model", "bert-debug", "--output", str(tmp_path), "--batch-size", "4", "--eval-examples", "0",
                "--save-every", "1", "--device", "cpu", "--precision", "fp32", *flags]

    assert main(pretrain("--max-steps", "2")) == 0
    checkpoints = ckpt.list_checkpoints(tmp_path / "checkpoints")
    assert [c.name for c in checkpoints] == ["step-00000001", "step-00000002"]
    for checkpoint in checkpoints:
        (checkpoint / "optimizer.json").write_text("{}")  # bit rot: the hashes no longer match
    before = {c: (c / "model.safetensors").read_bytes() for c in checkpoints}

    err = cli_error(capsys, pretrain("--max-steps", "3", "--resume", "auto"))
    assert "step-00000001" in err and "step-00000002" in err and "optimizer.json" in err
    assert "--overwrite" in err
    assert {c: (c / "model.safetensors").read_bytes() for c in checkpoints} == before  # nothing overwritten

    assert "--overwrite" in cli_error(capsys, pretrain("--max-steps", "3", "--resume", "auto", "--overwrite"))
    assert main(pretrain("--max-steps", "1", "--overwrite")) == 0  # starting over is a deliberate choice
    assert [c.name for c in ckpt.list_checkpoints(tmp_path / "checkpoints")] == ["step-00000001"]
    assert ckpt.verify_checkpoint(tmp_path / "checkpoints" / "step-00000001") is None


# --- 6. tracebacks instead of one line -----------------------------------------------------------------

# How a full disk looks: an OSError from Python's own writes, a SafetensorError from safetensors' writer.
DISK_FULL = {"json": ("write_json", OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))),
             "safetensors": ("save_file", SafetensorError("Error while serializing: I/O error: No space left on "
                                                          "device (os error 28)"))}


@pytest.mark.parametrize("writer", sorted(DISK_FULL))
def test_disk_full_while_saving_keeps_the_previous_checkpoint_and_says_what_to_do(tmp_path, monkeypatch, writer):
    toy_run(tmp_path, steps=1)
    previous = tmp_path / "checkpoints" / "step-00000001"
    name, error = DISK_FULL[writer]

    def disk_full(*args, **kwargs):
        raise error

    monkeypatch.setattr(ckpt, name, disk_full)
    with pytest.raises(BertkitError) as raised:
        toy_run(tmp_path, steps=2, resume="auto")
    message = str(raised.value)
    assert "step-00000002" in message and "No space left on device" in message
    assert "free space" in message and "--resume auto" in message
    assert ckpt.verify_checkpoint(previous) is None
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [previous.name]  # no temp left


def test_disk_full_while_saving_a_model_directory_names_it(tmp_path, monkeypatch):
    def disk_full(*args, **kwargs):
        raise DISK_FULL["safetensors"][1]

    monkeypatch.setattr(pretrained, "save_file", disk_full)
    with pytest.raises(BertkitError, match=r"No space left on device.*free space") as raised:
        BertModel(preset("bert-debug", vocab_size=len(VOCAB))).save_pretrained(tmp_path / "model")
    assert str(tmp_path / "model") in str(raised.value)
    assert list((tmp_path / "model").iterdir()) == []


@pytest.mark.parametrize("manifest", [[], {"files": ["model.safetensors"]},
                                      {"files": {"../../outside.json": "0" * 64}}],
                         ids=["list", "files-list", "outside"])
def test_manifest_of_the_wrong_shape_is_a_broken_checkpoint(tmp_path, manifest, caplog):
    toy_run(tmp_path, steps=2)
    broken = tmp_path / "checkpoints" / "step-00000002"
    (broken / ckpt.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(BertkitError, match=r"step-00000002.*manifest\.json"):
        ckpt.resolve_resume(broken, tmp_path / "checkpoints")
    assert ckpt.resolve_resume("auto", tmp_path / "checkpoints").name == "step-00000001"  # skipped, with a warning
    assert "manifest.json" in caplog.text


@pytest.mark.parametrize(("name", "content"), [
    ("trainer_state.json", {"state": {"step": 1}}),
    ("trainer_state.json", []),
    ("trainer_state.json", {"state": {"step": 1}, "scheduler": {}, "scaler": None, "data": {"epoch": "x"}}),
    ("rng.json", {"ranks": [{}]}),
    ("rng.json", {"ranks": [{"python": 1, "numpy": 2, "torch": 3}]}),
], ids=["trainer-keys", "trainer-list", "data-position", "rng-keys", "rng-values"])
def test_checkpoint_with_foreign_state_files_is_refused_by_name(tmp_path, name, content):
    toy_run(tmp_path, steps=1)
    rewrite(tmp_path / "checkpoints" / "step-00000001", name, content)
    with pytest.raises(BertkitError) as error:
        toy_run(tmp_path, steps=2, resume="auto")
    message = str(error.value)
    assert "step-00000001" in message and name in message and "--overwrite" in message


@pytest.mark.parametrize("id2label", [["negative", "positive"], {"neg": "negative", "pos": "positive"},
                                      {"0": "negative", "2": "positive"}], ids=["list", "names", "gap"])
def test_config_with_malformed_id2label_is_refused(tmp_path, id2label):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**preset("bert-debug").to_dict(), "id2label": id2label}))
    with pytest.raises(BertkitError, match=r"config\.json.*id2label"):
        BertConfig.from_json_file(path)


def test_sharded_index_that_is_a_list_is_refused(tmp_path):
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps([{"weight_map": {}}]))
    with pytest.raises(BertkitError, match=r"model\.safetensors\.index\.json"):
        read_state_dict(tmp_path)


@pytest.mark.parametrize("shard", ["../secret.safetensors", "/abs/secret.safetensors"], ids=["parent", "absolute"])
def test_sharded_index_pointing_outside_the_model_directory_is_refused(tmp_path, shard):
    model = tmp_path / "model"
    model.mkdir()
    save_file({"w": torch.zeros(1)}, str(tmp_path / "secret.safetensors"))
    shard = shard if shard.startswith("..") else str(tmp_path / "secret.safetensors")
    (model / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": shard}}))
    with pytest.raises(BertkitError, match=r"index\.json.*outside"):
        read_state_dict(model)


def test_absurd_config_size_is_refused_before_allocating(tmp_path):
    directory = tmp_path / "huge"
    directory.mkdir()
    config = {**preset("bert-debug").to_dict(), "hidden_size": 10**9, "num_attention_heads": 8}
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(BertkitError, match=r"config\.json.*parameters.*memory") as error:
        BertModel.from_pretrained(directory)
    assert "hidden_size" in str(error.value)


def test_info_on_a_garbage_safetensors_file_is_one_line(tmp_path, capsys):
    directory = model_dir(tmp_path)
    (directory / "model.safetensors").write_bytes(b"\xff" * 8 + b"not a safetensors header")
    assert "model.safetensors" in cli_error(capsys, ["info", str(directory)])


def test_extract_with_a_vocabulary_larger_than_the_config_is_one_line(tmp_path, capsys):
    directory = model_dir(tmp_path, vocab=[*VOCAB, "dog", "ran"])
    text = tmp_path / "input.txt"
    text.write_text("the dog ran\n")
    err = cli_error(capsys, ["extract", "--model", str(directory), "--input", str(text),
                             "--output", str(tmp_path / "out.jsonl"), "--layers", "-1"])
    assert "vocab.txt" in err and "vocab_size" in err and "13" in err and "11" in err


# --- 7. file modes and dtypes ----------------------------------------------------------------------------

def test_model_safetensors_gets_the_mode_of_the_other_files(tmp_path):
    BertModel(preset("bert-debug", vocab_size=len(VOCAB))).save_pretrained(tmp_path / "model")
    modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "model").iterdir()}
    assert modes["model.safetensors"] == modes["config.json"], modes
    toy_run(tmp_path / "run", steps=1)
    checkpoint = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "run/checkpoints/step-00000001").iterdir()}
    assert len(set(checkpoint.values())) == 1, checkpoint


@pytest.mark.parametrize("dtype", [torch.int64, torch.int8, torch.bool])
def test_integer_weights_are_refused_where_floats_are_expected(tmp_path, dtype):
    model = BertForPreTraining(preset("bert-debug", vocab_size=len(VOCAB)))
    model.save_pretrained(tmp_path)
    state = read_state_dict(tmp_path)
    state["bert.embeddings.LayerNorm.weight"] = torch.ones_like(state["bert.embeddings.LayerNorm.weight"],
                                                                dtype=dtype)
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(BertkitError, match=r"embeddings\.LayerNorm\.weight.*floating"):
        BertForPreTraining.from_pretrained(tmp_path)
