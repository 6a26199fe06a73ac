"""bertkit.cli.options: a config dataclass's fields become click options (name, help, default, type,
choices), and `bertkit pretrain` / `bertkit finetune` are generated from their dataclasses."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import click
import pytest
from click.testing import CliRunner

from bertkit.cli import cli, main
from bertkit.cli.options import field_docs, options, take
from bertkit.errors import BertkitError

COLOURS = ("red", "green")


@dataclass
class Example:
    """A config as the library declares it."""

    data: str
    """Directory with the data."""
    max_seq_length: int = 128
    """Longest input in tokens."""
    warmup_steps: int | None = None
    """Warmup steps; unset: none."""
    colour: str = field(default="red", metadata={"choices": COLOURS})
    """Colour of the run."""
    shuffle: bool = True
    """Shuffle every epoch."""
    overwrite: bool = False
    """Replace the output."""
    seeds: tuple[int, ...] = (1,)
    """Seeds, comma-separated."""
    layers: tuple[int, ...] | None = None
    """Layers, comma-separated."""
    output: Path = Path("out")
    """Where to write."""
    internal: float = 0.5


def _command(**kwargs) -> click.Command:
    @click.command()
    @options(Example, **kwargs)
    def run(**flags) -> None:
        click.echo(repr(Example(**take(Example, flags))))
    return run


def test_fields_become_options_with_names_help_defaults_and_types():
    result = CliRunner().invoke(_command(exclude=("internal",)), ["--data", "d", "--warmup-steps", "7", "--no-shuffle",
                                                                  "--overwrite", "--seeds", "3,4", "--colour", "green"])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == repr(Example(data="d", warmup_steps=7, colour="green", shuffle=False,
                                                 overwrite=True, seeds=(3, 4)))
    help_text = " ".join(CliRunner().invoke(_command(exclude=("internal",)), ["--help"]).output.split())
    for text in ("--data TEXT Directory with the data. [required]",
                 "--max-seq-length INTEGER Longest input in tokens. [default: 128]",
                 "--colour [red|green]", "--shuffle / --no-shuffle", "--overwrite Replace",
                 "--output PATH Where to write. [default: out]", "--seeds INTS Seeds, comma-separated. [default: 1]"):
        assert text in help_text
    assert "--internal" not in help_text


def test_choices_come_from_the_constant_and_wrong_values_name_the_flag():
    result = CliRunner().invoke(_command(), ["--data", "d", "--colour", "blue"])
    assert result.exit_code == 2 and "Invalid value for '--colour'" in result.output


def test_overrides_rename_and_change_defaults_and_take_leaves_unset_ones_to_the_dataclass():
    command = _command(overrides={"max_seq_length": {"flag": "--length", "default": None, "default_text": "the data's"},
                                  "data": {"default": "here"}})
    help_text = " ".join(CliRunner().invoke(command, ["--help"]).output.split())
    assert "--length INTEGER Longest input in tokens. [default: the data's]" in help_text
    assert "--data TEXT Directory with the data. [default: here]" in help_text  # no longer required
    flags = {"max_seq_length": None, "data": "d", "unrelated": 1}
    assert take(Example, flags, drop_none=("max_seq_length",)) == {"data": "d"} and flags == {"unrelated": 1}


def test_list_errors_are_one_line_user_errors_naming_the_flag():
    with pytest.raises(BertkitError, match=r"--seeds '1,x': expected comma-separated integers"):
        CliRunner().invoke(_command(), ["--data", "d", "--seeds", "1,x"], catch_exceptions=False)
    with pytest.raises(BertkitError, match="--seeds is empty"):
        CliRunner().invoke(_command(), ["--data", "d", "--seeds", ""], catch_exceptions=False)
    assert "layers=None" in CliRunner().invoke(_command(), ["--data", "d", "--layers", ""]).output


def test_a_misspelt_field_or_a_type_without_a_flag_is_refused_when_the_command_is_built():
    with pytest.raises(TypeError, match="no field"):
        options(Example, exclude=("colours",))
    with pytest.raises(TypeError, match="no command-line type"):
        @dataclass
        class Odd:
            pair: tuple[float, float] = (0.9, 0.999)
        options(Odd)


def test_field_docs_read_attribute_docstrings_as_one_line():
    docs = field_docs(Example)
    assert docs["warmup_steps"] == "Warmup steps; unset: none." and "internal" not in docs


def _leaf_commands() -> list[tuple[str, click.Command]]:
    context = click.Context(cli)
    commands = [("pretrain", cli.get_command(context, "pretrain"))]
    group = cli.get_command(context, "finetune")
    commands += [(f"finetune {name}", group.get_command(context, name)) for name in group.list_commands(context)]
    return commands


@pytest.mark.parametrize("name, command", _leaf_commands(), ids=[n for n, _ in _leaf_commands()])
def test_every_generated_flag_has_help(name, command):
    """A field without a docstring would be a flag without help: this catches it."""
    missing = [param.opts[0] for param in command.params if isinstance(param, click.Option) and not param.help]
    assert not missing, f"bertkit {name}: flags without help (give their dataclass fields a docstring): {missing}"


def test_choices_are_the_settings_constants():
    from bertkit import settings

    expected = {"--precision": settings.PRECISIONS, "--lr-schedule": settings.LR_SCHEDULES,
                "--device": settings.DEVICES, "--optimizer": settings.OPTIMIZERS, "--recipe": settings.RECIPES,
                "--feature-combine": settings.FEATURE_COMBINES, "--tag-scheme": settings.TAG_SCHEMES}
    seen = set()
    for _, command in _leaf_commands():
        for param in command.params:
            if param.opts[0] in expected:
                assert tuple(param.type.choices) == tuple(expected[param.opts[0]])
                seen.add(param.opts[0])
    assert seen == set(expected)


def test_pretrain_flags_reach_the_settings_and_the_train_config(monkeypatch, tmp_path):
    from bertkit.tasks import pretraining

    seen = {}
    monkeypatch.setattr(pretraining, "pretrain", lambda settings, config: seen.update(s=settings, c=config)
                        or SimpleNamespace(stop_reason="budget", checkpoint=None))
    assert main(["pretrain", "--data", str(tmp_path), "--output", str(tmp_path / "run"), "--max-time", "1h30m",
                 "--adam-epsilon", "1e-7", "--learning-rate", "3e-4", "--no-nsp", "--compile"]) == 0
    settings, config = seen["s"], seen["c"]
    assert (config.max_time_s, config.eps, config.learning_rate) == (5400.0, 1e-7, 3e-4)
    assert (settings.nsp, settings.compile, settings.given) == (False, True, ("learning_rate", "nsp"))
    # defaults: the CLI's own (model, recipe, eval every 500 steps), else the dataclasses'
    assert (settings.model, settings.recipe, config.eval_every) == ("bert-base", "auto", 500)
    assert (config.micro_batch_size, config.warmup_ratio, config.save_every) == (32, 0.01, 1000)
    assert main(["pretrain", "--data", str(tmp_path), "--output", str(tmp_path / "run"), "--max-time", "2x"]) == 2


@pytest.mark.parametrize("kind, extra, expected", [
    ("classification", ["--task", "SST-2", "--regression"], {"glue_task": "sst2", "regression": True,
                                                             "max_seq_length": 128, "text_column": "text"}),
    ("tagging", ["--tag-scheme", "BIOES"], {"tag_scheme": "BIOES", "doc_stride": 64, "max_seq_length": 128}),
    ("squad", ["--version-2-with-negative"], {"version_2_with_negative": True, "doc_stride": 128,
                                              "max_seq_length": 384, "max_query_length": 64}),
    ("multiple-choice", ["--max-seq-length", "80"], {"max_seq_length": 80}),
])
def test_finetune_flags_reach_the_config_and_the_task_settings(monkeypatch, tmp_path, kind, extra, expected):
    from bertkit.tasks import finetune

    seen = {}
    monkeypatch.setattr(finetune, "run_finetuning", lambda k, train, devs, cfg, task: seen.update(
        kind=k, train=train, devs=devs, cfg=cfg, task=task) or {"seeds": {}, "summary": {}})
    assert main(["finetune", kind, "--model", "m", "--train", "t.tsv", "--dev", "a.tsv", "--dev", "b.tsv",
                 "--output", str(tmp_path), "--seeds", "1,2", "--feature-layers", "-1,-2", "--resume", "auto",
                 *extra]) == 0
    cfg = seen["cfg"]
    assert (seen["kind"], seen["train"], seen["devs"]) == (kind, "t.tsv", ["a.tsv", "b.tsv"])
    assert expected.items() <= seen["task"].items()
    assert (cfg.seeds, cfg.feature_layers, cfg.resume, cfg.learning_rate, cfg.output) == ((1, 2), (-1, -2), True,
                                                                                          None, tmp_path)
    assert (cfg.epochs, cfg.batch_size, cfg.adam_epsilon, cfg.group_by_length) == (3.0, 32, 1e-8, True)


def test_the_help_of_every_command_imports_no_torch():
    """--help of the generated commands (pretrain, finetune) too: their settings live in bertkit.settings."""
    commands = ("pretrain", "finetune", "finetune classification", "finetune tagging", "finetune squad",
                "finetune multiple-choice", "predict", "evaluate", "extract", "serve", "export onnx",
                "data pretraining", "tokenizer train", "quickstart", "info", "convert", "doctor")
    code = (f"import sys; from bertkit.cli import main; [main([*c.split(), '--help']) for c in {commands!r}]; "
            "print(sorted({'torch', 'numpy'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().endswith("[]")
