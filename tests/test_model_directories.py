"""A model meets a vocabulary and a path (issue 29): every command checks them the same way, up front.

- `--model` that is not a model directory - a Hub id such as bert-base-uncased, a typo, a tokenizer
  directory, a run directory - is named as the model, with what it is instead and how to get a model
  directory (bertkit never downloads), before any data is read: finetune, predict, evaluate, extract,
  export, serve and info alike.
- A vocabulary that does not fit the model (`bertkit.tokenizer.check_model_vocabulary`): more tokens
  than config.json's vocab_size, or a --tokenizer other than the model directory's own, is one
  `BertkitError` naming both files wherever serve would refuse it; a padded embedding matrix (vocab_size
  larger than vocab.txt, e.g. a multiple of 8) works everywhere, fill-mask included.

The models are random bert-debug directories written without training, so each test takes about a second.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bertkit.cli import main
from bertkit.config import preset
from bertkit.model import BertForMaskedLM, BertForSequenceClassification
from bertkit.settings import PredictSettings, ServeSettings
from bertkit.tasks.classification import ClassificationSettings, ClassificationTask
from bertkit.tasks.finetuned import save_finetuned
from bertkit.tokenizer import WordPieceTokenizer
from bertkit.workflows.predict import predict_file

WORDS = "the a film was good bad paris is capital of france".split()
TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, ".", "##s"]


def _vocab(directory: Path, tokens: list[str] = TOKENS) -> Path:
    WordPieceTokenizer(tokens).save_pretrained(directory)
    return directory


def _classifier(directory: Path, vocab_size: int | None = None) -> Path:
    """A fine-tuned classification directory as `bertkit finetune` writes it (random weights)."""
    task = ClassificationTask(ClassificationSettings(labels=["0", "1"], max_seq_length=16))
    tokenizer = WordPieceTokenizer(TOKENS)
    config = preset("bert-debug", vocab_size=vocab_size or tokenizer.vocab_size, **task.config_overrides())
    save_finetuned(BertForSequenceClassification(config), task, tokenizer, directory)
    return directory


def _masked_lm(directory: Path, vocab_size: int) -> Path:
    BertForMaskedLM(preset("bert-debug", vocab_size=vocab_size)).save_pretrained(directory)
    return _vocab(directory)


def _rows(path: Path) -> Path:
    path.write_text('{"text": "the film was good", "label": "1"}\n{"text": "bad", "label": "0"}\n', encoding="utf-8")
    return path


def _error(capsys: pytest.CaptureFixture, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("bertkit: error: ") and err.count("\n") == 1, err  # one line, no traceback
    return err


# --- --model that is not a model directory -------------------------------------------------------------

def _commands(model: str, tmp_path: Path) -> dict[str, list[str]]:
    data = str(tmp_path / "absent.jsonl")  # never read: the model is checked first
    return {
        "finetune": ["finetune", "classification", "--model", model, "--train", data, "--dev", data,
                     "--output", str(tmp_path / "run")],
        "predict": ["predict", "--model", model, "--input", data, "--output", str(tmp_path / "p")],
        "evaluate": ["evaluate", "--model", model, "--input", data, "--output", str(tmp_path / "e")],
        "extract": ["extract", "--model", model, "--input", data, "--output", str(tmp_path / "f.jsonl")],
        "export": ["export", "onnx", "--model", model, "--output", str(tmp_path / "m.onnx")],
        "serve": ["serve", "--model", model, "--port", "0"],
        "info": ["info", model],
    }


COMMANDS = ["finetune", "predict", "evaluate", "extract", "export", "serve", "info"]


@pytest.mark.parametrize("command", COMMANDS)
def test_a_hub_id_is_named_as_the_model_with_how_to_get_it(command, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    err = _error(capsys, _commands("bert-base-uncased", tmp_path)[command])
    assert "bert-base-uncased: no such model directory" in err and "tokenizer" not in err.split(".")[0]
    assert "never downloads" in err and "huggingface-cli download bert-base-uncased --local-dir" in err
    assert "bertkit convert" in err


@pytest.mark.parametrize("command", COMMANDS)
def test_a_tokenizer_directory_as_model_is_refused_before_reading_data(command, tmp_path, capsys):
    vocab = _vocab(tmp_path / "vocab")
    err = _error(capsys, _commands(str(vocab), tmp_path)[command])
    assert f"{vocab}: no config.json, so not a model directory" in err and "tokenizer directory" in err
    assert "absent.jsonl" not in err


def test_a_run_directory_points_at_its_model(tmp_path, capsys):
    _classifier(tmp_path / "run" / "best")
    err = _error(capsys, _commands(str(tmp_path / "run"), tmp_path)["predict"])
    assert f"the model is in {tmp_path / 'run' / 'best'}" in err


@pytest.mark.parametrize("command", ["predict", "finetune"])
def test_a_missing_path_in_a_local_folder_lists_the_models_there_not_the_hub(command, tmp_path, monkeypatch, capsys):
    """`runs/typo` looks like a Hub id (owner/name), but `runs` is here: the models in it are listed instead."""
    monkeypatch.chdir(tmp_path)
    _classifier(tmp_path / "runs" / "good" / "best")
    (tmp_path / "runs" / "notes").mkdir()
    err = _error(capsys, _commands("runs/typo", tmp_path)[command])
    assert "runs/typo: no such model directory" in err and "runs holds good (" in err
    assert "huggingface-cli" not in err and "notes" not in err
    assert ("nor a preset" in err) == (command == "finetune")


def test_a_preset_typo_in_finetune_lists_the_presets(tmp_path, capsys):
    err = _error(capsys, _commands("bert-bas", tmp_path)["finetune"])
    assert "bert-bas: no such model directory (nor a preset for random initialisation: bert-debug" in err


# --- the vocabulary against the model ------------------------------------------------------------------

def test_finetune_refuses_a_tokenizer_other_than_the_models_own(tmp_path, capsys):
    """The issue's case: a smaller --tokenizer was accepted, and `serve` then refused the fine-tuned model."""
    model = _classifier(tmp_path / "model")
    other = _vocab(tmp_path / "other", [*TOKENS[:5], "zebra", "lion"])
    rows = str(_rows(tmp_path / "train.jsonl"))
    argv = ["finetune", "classification", "--model", str(model), "--tokenizer", str(other), "--train", rows,
            "--dev", rows, "--output", str(tmp_path / "run")]
    err = _error(capsys, argv)
    assert f"--tokenizer {other / 'vocab.txt'} is not the vocabulary of the model in {model}" in err
    assert "id 5 is 'zebra' there, 'the' in the model's vocab.txt" in err and "leave out --tokenizer" in err
    assert not (tmp_path / "run").exists()  # refused before anything was written


def test_a_vocabulary_larger_than_vocab_size_is_refused_everywhere_naming_both_files(tmp_path, capsys):
    model = _classifier(tmp_path / "model")
    big = _vocab(tmp_path / "big", [*TOKENS, *(f"extra{i}" for i in range(10))])
    (model / "vocab.txt").write_bytes((big / "vocab.txt").read_bytes())  # the directory's own, too large
    rows = str(_rows(tmp_path / "rows.jsonl"))
    text = tmp_path / "lines.txt"
    text.write_text("the film\n", encoding="utf-8")
    for argv in (["predict", "--model", str(model), "--input", rows, "--output", str(tmp_path / "p")],
                 ["evaluate", "--model", str(model), "--input", rows, "--output", str(tmp_path / "e")],
                 ["extract", "--model", str(model), "--input", str(text), "--output", str(tmp_path / "f.jsonl")],
                 ["export", "onnx", "--model", str(model), "--output", str(tmp_path / "m.onnx")],
                 ["serve", "--model", str(model), "--port", "0"]):
        err = _error(capsys, argv)
        assert f"{model / 'vocab.txt'} has 28 tokens but {model / 'config.json'} says vocab_size 18" in err, argv
    assert main(["info", str(model)]) == 0
    assert "says vocab_size 18" in capsys.readouterr().out


def test_a_padded_embedding_matrix_works_everywhere(tmp_path):
    """vocab_size 24 for 18 tokens (transformers pads to a multiple of 8): serve refused it; nothing does now,
    and fill-mask answers with real tokens only."""
    from bertkit.serve.predictor import load_predictor

    mlm = _masked_lm(tmp_path / "mlm", vocab_size=24)
    predictor = load_predictor(mlm)
    [[candidates]] = predictor.fill_mask(["paris is the [MASK] of france ."], top_k=18)
    assert sorted(c["token_id"] for c in candidates) == list(range(18))
    classifier = _classifier(tmp_path / "padded", vocab_size=24)
    load_predictor(classifier)
    rows = _rows(tmp_path / "rows.jsonl")
    assert predict_file(PredictSettings(str(classifier), str(rows), str(tmp_path / "p"), device="cpu"))["examples"] == 2
    text = tmp_path / "lines.txt"
    text.write_text("the film\n", encoding="utf-8")
    assert main(["extract", "--model", str(mlm), "--input", str(text), "--output", str(tmp_path / "f.jsonl"),
                 "--layers", "-1"]) == 0
    finetuned = tmp_path / "run"
    assert main(["finetune", "classification", "--model", str(mlm), "--train", str(rows), "--dev", str(rows),
                 "--output", str(finetuned), "--epochs", "1", "--precision", "fp32", "--device", "cpu"]) == 0
    load_predictor(finetuned / "best")  # what finetune writes, serve takes
    assert json.loads((finetuned / "best" / "config.json").read_text())["vocab_size"] == 24


def test_serve_and_extract_refuse_another_vocabulary_of_the_same_size(tmp_path, capsys):
    from bertkit.errors import BertkitError
    from bertkit.serve.predictor import load_predictor

    mlm = _masked_lm(tmp_path / "mlm", vocab_size=18)
    shuffled = _vocab(tmp_path / "shuffled", [*TOKENS[:5], *reversed(TOKENS[5:])])
    with pytest.raises(BertkitError, match="is not the vocabulary of the model in"):
        load_predictor(ServeSettings(mlm, tokenizer=shuffled))
    text = tmp_path / "lines.txt"
    text.write_text("the film\n", encoding="utf-8")
    err = _error(capsys, ["extract", "--model", str(mlm), "--tokenizer", str(shuffled), "--input", str(text),
                          "--output", str(tmp_path / "f.jsonl")])
    assert "id 5 is '##s' there, 'the' in the model's vocab.txt" in err
    load_predictor(ServeSettings(mlm, tokenizer=_vocab(tmp_path / "same")))  # the same tokens from elsewhere: fine
