"""Every flag of `bertkit data pretraining`, `tokenizer train|encode`, `extract`, `export onnx`, `serve`,
`predict`, `evaluate` and `quickstart` reaches the settings dataclass the library takes (the library entry
point is replaced by a recorder), with the command's own defaults and special cases kept."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import click
import pytest

from bertkit.cli import cli, main
from bertkit.errors import BertkitError
from bertkit.quickstart.config import QuickstartSettings, Recipe
from bertkit.settings import (
    ExportSettings,
    ExtractSettings,
    InstanceSettings,
    Limits,
    LongDocumentSettings,
    PredictSettings,
    PretrainingDataSettings,
    ServerSettings,
    ServeSettings,
    TokenizerEncodeSettings,
    TokenizerTrainSettings,
)
from bertkit.settings.data import VocabularySettings

NAMES = {"data pretraining": ({PretrainingDataSettings, InstanceSettings}, {"instances"}),
         "tokenizer train": ({TokenizerTrainSettings, VocabularySettings}, {"vocabulary"}),
         "tokenizer encode": ({TokenizerEncodeSettings}, set()),
         "extract": ({ExtractSettings}, set()),
         "export onnx": ({ExportSettings}, set()),
         "serve": ({ServeSettings, ServerSettings, Limits, LongDocumentSettings}, {"limits"}),
         "predict": ({PredictSettings}, {"evaluate", "label_column", "tags_column"}),
         "evaluate": ({PredictSettings}, {"evaluate"}),
         "quickstart": ({QuickstartSettings}, {"seeds_fixed", "epochs_fixed", "recipe", "eval_every", "eval_examples",
                                             "seed", "workers"})}
"""command -> (the dataclasses its flags come from, the fields that are not flags)."""


def _command(name: str) -> click.Command:
    command: click.Command = cli
    for part in name.split():
        command = command.get_command(click.Context(cli), part)  # type: ignore[attr-defined]
    return command


@pytest.mark.parametrize("name", sorted(NAMES))
def test_every_flag_is_a_field_and_every_field_a_flag(name):
    classes, not_flags = NAMES[name]
    fields = {f.name for cls in classes for f in dataclasses.fields(cls)} - not_flags
    if name == "quickstart":
        fields |= {"finetune_epochs", "train_examples"}  # the two Recipe fields it sets
    params = {p.name for p in _command(name).params if isinstance(p, click.Option)} - {"help"}
    assert params == fields


def _record(monkeypatch, module, name, result=None) -> dict:
    seen: dict = {}

    def record(*args, **kwargs):
        seen.update(args=args, kwargs=kwargs)
        return result
    monkeypatch.setattr(module, name, record)
    return seen


def test_data_pretraining_flags_reach_the_settings_of_the_build(monkeypatch, tmp_path):
    from bertkit.data import pretraining

    seen = _record(monkeypatch, pretraining, "build_pretraining_data", {"num_instances": 3})
    monkeypatch.setattr(pretraining, "format_summary", lambda manifest: "")
    base = ["data", "pretraining", "--input", "a.txt", "--input", "b*.txt", "--tokenizer", "tok", "--output", "out"]
    assert main([*base, "--masking", "dynamic", "--max-seq-length", "64", "--rng", "python", "--whole-word-masking",
                 "--workers", "3", "--strict", "--overwrite", "--quiet", "--shard-size-mb", "1",
                 "--text-column", "body"]) == 0
    (settings,) = seen["args"]
    assert settings == PretrainingDataSettings(
        ("a.txt", "b*.txt"), "tok", "out", workers=3, strict=True, text_column="body", shard_size_mb=1.0,
        overwrite=True, quiet=True,
        instances=InstanceSettings(max_seq_length=64, masking="dynamic", rng="python", whole_word_masking=True))
    assert settings.instances.resolved().dupe_factor == 1  # dynamic: one pass
    assert main(base) == 0 and seen["args"][0].instances == InstanceSettings()
    assert seen["args"][0].instances.masking == "dynamic"  # the default: what the short recipe was measured on
    assert seen["args"][0].instances.resolved().dupe_factor == 1
    assert main([*base, "--masking", "static"]) == 0
    assert seen["args"][0].instances.resolved().dupe_factor == 10  # static: Google's 10 passes
    assert (seen["args"][0].workers, seen["args"][0].quiet, seen["args"][0].text_column) == (None, False, "text")
    assert main([*base, "--masking", "dynamic", "--dupe-factor", "4"]) == 0
    assert seen["args"][0].instances.resolved().dupe_factor == 4
    # an unquoted glob, as the shell expands it: the files after --input are inputs too
    assert main(["data", "pretraining", "--input", "c1.txt", "c2.txt", "c3.txt", "--tokenizer", "tok", "--output",
                 "out"]) == 0
    assert seen["args"][0].inputs == ("c1.txt", "c2.txt", "c3.txt")


def test_tokenizer_train_flags_and_positional_inputs_reach_the_trainer(monkeypatch, tmp_path):
    import bertkit.tokenizer

    trained = SimpleNamespace(vocab_size=9, vocab_hash="0" * 64)
    seen = _record(monkeypatch, bertkit.tokenizer, "train_tokenizer", trained)
    assert main(["tokenizer", "train", "--input", "a.txt", "b.txt", "--input", "c.txt", "--output", str(tmp_path),
                 "--vocab-size", "100", "--cased", "--min-frequency", "3", "--limit-alphabet", "40", "--no-progress",
                 "--strict", "--text-column", "body"]) == 0
    assert seen["args"] == (TokenizerTrainSettings(tmp_path, VocabularySettings(
        inputs=(Path("a.txt"), Path("c.txt"), Path("b.txt")), text_column="body", vocab_size=100, cased=True,
        min_frequency=3, limit_alphabet=40, progress=False, strict=True)),)
    assert main(["tokenizer", "train", "--input", "a.txt", "--output", str(tmp_path)]) == 0
    assert seen["args"] == (TokenizerTrainSettings(tmp_path, VocabularySettings(inputs=(Path("a.txt"),))),)
    assert main(["tokenizer", "train", "--output", str(tmp_path)]) == 2  # no input files
    assert main(["tokenizer", "train", "--input", "a.txt"]) == 2  # no --output


def test_tokenizer_encode_flags_reach_the_tokenizer(tmp_path, capsys):
    (tmp_path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat"]) + "\n")
    assert main(["tokenizer", "encode", "The cat", "--tokenizer", str(tmp_path), "--cased", "--pair", "cat",
                 "--max-length", "5"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[1:]]
    assert [row[3] for row in rows] == ["[CLS]", "[UNK]", "[SEP]", "cat", "[SEP]"]  # cut to --max-length: "cat"
    assert main(["tokenizer", "encode", "The cat", "--tokenizer", str(tmp_path), "--lower-case"]) == 0
    assert "[UNK]" not in capsys.readouterr().out


def test_extract_flags_reach_the_settings(monkeypatch, tmp_path):
    from bertkit.workflows import extract

    seen = _record(monkeypatch, extract, "extract_features", 2)
    assert main(["extract", "--model", str(tmp_path), "--input", "in.txt", "--output", "v.npy", "--layers", "-1,-2",
                 "--pooling", "mean", "--no-normalize", "--max-seq-length", "16", "--batch-size", "4"]) == 0
    assert seen["args"] == (ExtractSettings(tmp_path, Path("in.txt"), Path("v.npy"), layers="-1,-2", pooling="mean",
                                            normalize=False, max_seq_length=16, batch_size=4, precision="auto"),)
    assert main(["extract", "--model", str(tmp_path), "--input", "in.txt", "--output", "v.jsonl"]) == 0
    assert seen["args"] == (ExtractSettings(tmp_path, Path("in.txt"), Path("v.jsonl"), precision="auto"),)
    assert main(["extract", "--model", str(tmp_path), "--input", "i", "--output", "o", "--max-seq-length", "2"]) == 2


def test_export_onnx_flags_reach_the_settings(monkeypatch, tmp_path):
    from bertkit.export import onnx as export

    seen = _record(monkeypatch, export, "export_onnx", SimpleNamespace(lines=lambda: ["ok"]))
    sample = tmp_path / "sample.txt"
    sample.write_text("a\n")
    assert main(["export", "onnx", "--model", str(tmp_path), "--output", "m.onnx", "--quantize", "int8",
                 "--sample", str(sample), "--opset", "18"]) == 0
    assert seen["args"] == (ExportSettings(tmp_path, Path("m.onnx"), "int8", sample, 18),)
    assert main(["export", "onnx", "--model", str(tmp_path), "--output", "m.onnx", "--opset", "13"]) == 2


def test_serve_flags_reach_the_predictor_the_app_and_the_server(monkeypatch, tmp_path):
    (tmp_path / "sample.txt").write_text("the cat sat\n")
    from bertkit.serve import app, predictor

    loaded = _record(monkeypatch, predictor, "load_predictor", SimpleNamespace(endpoints=["embed"]))
    created = _record(monkeypatch, app, "create_app", "the app")
    served = _record(monkeypatch, app, "run_server")
    monkeypatch.setenv("BERTKIT_API_KEY", "secret")
    assert main(["serve", "--model", str(tmp_path), "--tokenizer", str(tmp_path), "--host", "0.0.0.0", "--port", "9",
                 "--max-batch-size", "8", "--max-wait-ms", "2", "--max-queue", "5", "--timeout", "3",
                 "--max-body-bytes", "100", "--max-inputs", "2", "--max-input-chars", "10", "--max-connections", "7",
                 "--header-timeout", "1", "--body-timeout", "2", "--keep-alive-timeout", "4",
                 "--max-header-bytes", "2048", "--drain-timeout", "6", "--threads", "2", "--precision", "int8",
                 "--log-level", "warning", "--calibration", str(tmp_path / "sample.txt")]) == 0
    run = ServeSettings(tmp_path, tmp_path, "0.0.0.0", 9, 6.0, "warning", precision="int8",
                        calibration=tmp_path / "sample.txt", threads=2)
    assert loaded["args"] == (run, 8, LongDocumentSettings())  # its threads are set by load_predictor
    limits = Limits(100, 2, 10, 7, 1.0, 2.0, 4.0, 2048)
    assert created["args"][1] == ServerSettings(limits, 8, 2.0, 5, 3.0, "secret")
    assert served["args"] == ("the app", run)
    monkeypatch.delenv("BERTKIT_API_KEY")
    assert main(["serve", "--model", str(tmp_path)]) == 0
    assert created["args"][1] == ServerSettings() and served["args"][1].host == "127.0.0.1"
    assert loaded["args"] == (ServeSettings(tmp_path, precision="auto"), 32, LongDocumentSettings())
    assert main(["serve", "--model", str(tmp_path), "--long-documents", "windows", "--doc-stride", "32",
                 "--window-aggregation", "max", "--max-windows", "4"]) == 0
    assert loaded["args"][2] == LongDocumentSettings(long_documents="windows", doc_stride=32, window_aggregation="max",
                                                     max_windows=4)
    assert main(["serve", "--model", str(tmp_path), "--port", "70000"]) == 2


@pytest.mark.parametrize("command, precision", [("predict", "auto"), ("evaluate", "fp32")])
def test_predict_and_evaluate_flags_reach_the_settings(monkeypatch, command, precision):
    from bertkit.workflows import predict

    seen = _record(monkeypatch, predict, "predict_file", {"examples": 1, "skipped": 0})
    labels = ["--label-column", "gold"] if command == "evaluate" else []
    assert main([command, "--model", "m", "--input", "in.csv", "--output", "out", "--text-column", "t",
                 "--text-pair-column", "u", "--id-column", "i", "--batch-size", "8", "--device", "cpu", *labels]) == 0
    expected = PredictSettings("m", "in.csv", "out", "t", "u", "i", labels[-1] if labels else None, 8,
                               precision=precision, device="cpu", evaluate=command == "evaluate")
    assert seen["args"] == (expected,)
    assert expected.columns() == {"text_column": "t", "text_pair_column": "u", "id_column": "i",
                                  **({"label_column": "gold"} if labels else {})}
    assert main([command, "--model", "m", "--input", "in.csv", "--output", "out", "--precision", "int8"]) == 0
    assert seen["args"] == (PredictSettings("m", "in.csv", "out", precision="int8", evaluate=command == "evaluate"),)


def test_quickstart_flags_reach_the_config_and_the_recipe(monkeypatch, tmp_path):
    from bertkit.quickstart import stages

    seen = _record(monkeypatch, stages, "run_quickstart")
    assert main(["quickstart", "--output", str(tmp_path), "--max-steps", "20", "--seeds", "4,5", "--finetune-epochs",
                 "2", "--train-examples", "0", "--no-baseline", "--resume", "--device", "cpu"]) == 0
    expected = QuickstartSettings(tmp_path, minutes=None, max_steps=20, seeds=(4, 5), seeds_fixed=True,
                                  epochs_fixed=True,
                                  recipe=dataclasses.replace(Recipe(), finetune_epochs=2.0, train_examples=None),
                                  random_baseline=False, resume=True, device="cpu")
    assert seen["args"] == (expected,)
    assert main(["quickstart", "--minutes", "3"]) == 0
    assert seen["args"] == (QuickstartSettings(Path("quickstart"), minutes=3.0),)  # the defaults: not fixed
    with pytest.raises(BertkitError, match="--seeds 1,1: a seed is repeated"):
        QuickstartSettings(Path("q"), seeds=(1, 1))  # checked when made, before run_quickstart


@pytest.mark.parametrize("argv, flag", [
    (["predict", "--model", "{d}", "--input", "{f}", "--output", "{o}", "--batch-size", "0"], "--batch-size"),
    (["evaluate", "--model", "{d}", "--input", "{f}", "--output", "{o}", "--batch-size", "-3"], "--batch-size"),
    (["data", "pretraining", "--input", "{f}", "--tokenizer", "{d}", "--output", "{o}", "--seed", "-1"], "--seed"),
    (["data", "pretraining", "--input", "{f}", "--tokenizer", "{d}", "--output", "{o}", "--shard-size-mb", "nan"],
     "--shard-size-mb"),
    (["data", "pretraining", "--input", "{f}", "--tokenizer", "{d}", "--output", "{o}", "--shard-size-mb", "-5"],
     "--shard-size-mb"),
    (["tokenizer", "train", "--input", "{f}", "--output", "{o}", "--limit-alphabet", "-1"], "--limit-alphabet"),
    (["finetune", "classification", "--model", "m", "--train", "{f}", "--dev", "{f}", "--output", "{o}",
      "--eval-batch-size", "0"], "--eval-batch-size"),
    (["finetune", "classification", "--model", "m", "--train", "{f}", "--dev", "{f}", "--output", "{o}",
      "--epochs", "0"], "--epochs must be positive"),
    (["pretrain", "--data", "{d}", "--output", "{o}", "--max-time", "0"], "--max-time must be positive"),
    (["pretrain", "--data", "{d}", "--output", "{o}", "--max-steps", "5", "--batch-size", "0"],
     "'--batch-size': 0 is not in the range x>=1"),
    (["pretrain", "--data", "{d}", "--output", "{o}", "--max-steps", "5", "--micro-batch-size", "0"],
     "'--micro-batch-size': 0 is not in the range x>=1"),
    (["finetune", "classification", "--model", "m", "--train", "{f}", "--dev", "{f}", "--output", "{o}",
      "--global-batch-size", "0"], "'--global-batch-size': 0 is not in the range x>=1"),
    (["serve", "--model", "{d}", "--api-key", ""], "--api-key (or BERTKIT_API_KEY) is empty"),
    (["quickstart", "--output", "{o}", "--finetune-epochs", "0"], "--finetune-epochs must be positive"),
])
def test_hostile_values_are_one_line_errors_naming_the_flag_typed(argv, flag, tmp_path, capsys):
    """Each of these was a traceback, a silent acceptance or an error naming an internal field before."""
    (tmp_path / "dir").mkdir()
    (tmp_path / "file.txt").write_text("some text\n", encoding="utf-8")
    values = {"{d}": str(tmp_path / "dir"), "{f}": str(tmp_path / "file.txt"), "{o}": str(tmp_path / "out")}
    assert main([values.get(arg, arg) for arg in argv]) == 2
    err = capsys.readouterr().err
    assert flag in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()  # refused before any work


def test_the_finetune_subcommands_are_the_registered_task_kinds():
    """One list of kinds: the task registry, the torch-free settings the command line builds from, the
    `bertkit finetune` subcommands and the top-level help agree."""
    from bertkit.cli import SUMMARIES
    from bertkit.cli.finetune import finetune
    from bertkit.settings import FINETUNE_KINDS, TASK_SETTINGS
    from bertkit.tasks.kinds import TASK_CLASSES

    assert [settings.kind for settings in TASK_SETTINGS] == list(TASK_CLASSES)
    assert all(TASK_CLASSES[settings.kind].settings_class is settings for settings in TASK_SETTINGS)
    assert sorted(finetune.list_commands(click.Context(finetune))) == sorted(FINETUNE_KINDS)
    assert all(kind in SUMMARIES["finetune"] for kind in FINETUNE_KINDS)


def test_every_command_in_the_table_has_a_summary_and_answers_help():
    """The command table is the one place a command is registered: each name has its summary (the top-level
    help needs no import) and its module answers --help."""
    from bertkit.cli import COMMANDS, SUMMARIES

    assert list(COMMANDS) == list(SUMMARIES)
    for name in COMMANDS:
        assert main([name, "--help"]) == 0, name
