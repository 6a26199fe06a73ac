"""bertkit.cli.options: a config dataclass's fields become click options (name, help, default, type,
choices, bounds, paths), and every command that configures a run is generated from the dataclasses its
library function takes: each flag reaches them."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import click
import pytest
from click.testing import CliRunner

from bertkit import settings as run_settings
from bertkit.cli import cli, main
from bertkit.cli.options import field_docs, pop_settings, settings_from_flags, settings_options, without_unset
from bertkit.errors import BertkitError
from bertkit.settings import Limits, ServerSettings, Settings

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


def _command(cls: type = Example, **kwargs) -> click.Command:
    """A command with `cls`'s generated options that prints the dataclass it rebuilds from them."""
    @click.command()
    @settings_options(cls, **kwargs)
    def run(**flags) -> None:
        click.echo(repr(settings_from_flags(cls, flags)))
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
    assert pop_settings(Example, flags, drop_none=("max_seq_length",)) == {"data": "d"} and flags == {"unrelated": 1}


def test_list_errors_are_one_line_user_errors_naming_the_flag():
    with pytest.raises(BertkitError, match=r"--seeds '1,x': expected comma-separated integers"):
        CliRunner().invoke(_command(), ["--data", "d", "--seeds", "1,x"], catch_exceptions=False)
    with pytest.raises(BertkitError, match="--seeds is empty"):
        CliRunner().invoke(_command(), ["--data", "d", "--seeds", ""], catch_exceptions=False)
    assert "layers=None" in CliRunner().invoke(_command(), ["--data", "d", "--layers", ""]).output


def test_a_misspelt_field_or_a_type_without_a_flag_is_refused_when_the_command_is_built():
    with pytest.raises(TypeError, match="no field"):
        settings_options(Example, exclude=("colours",))
    with pytest.raises(TypeError, match="no command-line type"):
        @dataclass
        class Odd:
            pair: tuple[float, float] = (0.9, 0.999)
        settings_options(Odd)


def test_field_docs_read_attribute_docstrings_as_one_line():
    docs = field_docs(Example)
    assert docs["warmup_steps"] == "Warmup steps; unset: none." and "internal" not in docs


@dataclass
class Files(Settings):
    """A config with files, bounds and other flag names."""

    inputs: tuple[str, ...] = field(metadata={"flag": "--input"})
    """Input files; repeat the flag."""
    model: Path = field(metadata={"path": "dir", "exists": True})
    """An existing directory."""
    port: int = field(default=80, metadata={"min": 0, "max": 65535})
    """TCP port."""
    timeout_s: float = field(default=1.0, metadata={"min": 0.01, "flag": "--timeout"})
    """Seconds."""
    lower: bool | None = field(default=None, metadata={"flag": "--lower-case/--cased"})
    """Lower-case; unset: the file's."""
    colour: str = field(default="red", metadata={"choices": COLOURS})
    """Colour of the run."""


def test_repeatable_fields_bounds_path_checks_and_flag_names_come_from_metadata(tmp_path):
    args = ["--input", "a", "--input", "b", "--model", str(tmp_path), "--port", "8", "--timeout", "2", "--cased"]
    result = CliRunner().invoke(_command(Files), args)
    assert result.exit_code == 0, result.output
    assert result.output.strip() == repr(Files(("a", "b"), tmp_path, 8, 2.0, False))
    help_text = " ".join(CliRunner().invoke(_command(Files), ["--help"]).output.split())
    for text in ("--input TEXT Input files; repeat the flag. [required]", "--model DIRECTORY",
                 "--port INTEGER RANGE TCP port. [default: 80; 0<=x<=65535]", "--timeout FLOAT RANGE",
                 "--lower-case / --cased"):
        assert text in help_text
    for wrong, flag in ((["--port", "70000"], "--port"), (["--timeout", "0"], "--timeout")):
        result = CliRunner().invoke(_command(Files), ["--input", "a", "--model", str(tmp_path), *wrong])
        assert result.exit_code == 2 and f"Invalid value for '{flag}'" in result.output
    result = CliRunner().invoke(_command(Files), ["--input", "a", "--model", str(tmp_path / "missing")])
    assert result.exit_code == 2 and "does not exist" in result.output


def test_only_keeps_the_named_fields():
    help_text = CliRunner().invoke(_command(Files, only=("port", "colour"), overrides={"port": {"default": 1}}),
                                   ["--help"]).output
    assert "--port" in help_text and "--colour" in help_text and "--timeout" not in help_text
    with pytest.raises(TypeError, match="no field"):
        settings_options(Files, only=("ports",))


def test_python_callers_are_held_to_the_same_bounds_with_the_flag_named():
    with pytest.raises(BertkitError, match=r"--port must be in \[0, 65535\], got 70000"):
        Files(("a",), Path("m"), port=70000)
    with pytest.raises(BertkitError, match=r"--timeout must be >= 0.01, got 0"):
        ServerSettings(timeout_s=0)
    with pytest.raises(BertkitError, match=r"--max-inputs must be >= 1, got 0"):
        Limits(max_inputs=0)


COMMANDS = ("pretrain", "finetune", "data pretraining", "tokenizer train", "tokenizer encode", "tokenizer extend",
            "extract", "export onnx", "serve", "predict", "evaluate", "quickstart")
"""Every command whose flags are generated from settings dataclasses (groups expand to their subcommands)."""


def _leaf_commands() -> list[tuple[str, click.Command]]:
    context, commands = click.Context(cli), []
    for name in COMMANDS:
        command: click.Command = cli
        for part in name.split():
            command = command.get_command(context, part)  # type: ignore[attr-defined]
        if isinstance(command, click.Group):
            commands += [(f"{name} {sub}", command.get_command(context, sub)) for sub in command.list_commands(context)]
        else:
            commands.append((name, command))
    return commands


@pytest.mark.parametrize("name, command", _leaf_commands(), ids=[n for n, _ in _leaf_commands()])
def test_every_generated_flag_has_help(name, command):
    """A field without a docstring would be a flag without help: this catches it."""
    missing = [param.opts[0] for param in command.params if isinstance(param, click.Option) and not param.help]
    assert not missing, f"bertkit {name}: flags without help (give their dataclass fields a docstring): {missing}"


UNSET_CLAUSE = re.compile(r"\bunset\b(?!\))")
"""What a docstring says None means ("; unset: ..."); "auto (unset)" names the default itself."""


@pytest.mark.parametrize("name, command", _leaf_commands(), ids=[n for n, _ in _leaf_commands()])
def test_help_never_contradicts_the_default_it_shows(name, command):
    """A flag that can never be None (it has a default, a default decided elsewhere, or is required) does
    not describe what None would do; no help shows two defaults; every flag a help names exists here."""
    context = click.Context(command)
    flags = {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)}
    for param in command.params:
        if not isinstance(param, click.Option):
            continue
        flag, text = param.opts[0], param.get_help_record(context)[1]
        never_none = param.required or "[default:" in text or param.get_default(context) is not None
        assert not (never_none and UNSET_CLAUSE.search(text)), f"bertkit {name} {flag}: {text}"
        assert text.count("default:") <= 1, f"bertkit {name} {flag} shows two defaults: {text}"
        named = set(re.findall(r"--[a-z][a-z0-9-]*[a-z0-9]", text.replace("-\n", "")))
        assert named <= flags, f"bertkit {name} {flag} names flags the command lacks: {named - flags}"


def test_the_unset_clause_is_cut_to_the_end_of_its_sentence():
    assert without_unset("Every N steps; unset: only at the end (and at 0.5 of it). More.") == "Every N steps. More."
    assert without_unset("Every N steps; unset: only at the end") == "Every N steps"
    assert without_unset("How vectors pool; auto (unset): [CLS].") == "How vectors pool; auto (unset): [CLS]."


TRAINING_COMMANDS = ("pretrain", "finetune", "glue")


def test_choices_are_the_settings_constants():
    expected = {"--lr-schedule": run_settings.LR_SCHEDULES, "--device": run_settings.DEVICES,
                "--optimizer": run_settings.OPTIMIZERS, "--recipe": run_settings.RECIPES,
                "--feature-combine": run_settings.FEATURE_COMBINES, "--tag-scheme": run_settings.TAG_SCHEMES,
                "--masking": run_settings.MASKINGS, "--rng": run_settings.DATA_RNGS,
                "--pooling": run_settings.POOLINGS, "--quantize": run_settings.QUANTIZATIONS,
                "--log-level": run_settings.LOG_LEVELS, "--long-documents": run_settings.LONG_DOCUMENTS,
                "--window-aggregation": run_settings.WINDOW_AGGREGATIONS}
    seen = set()
    for name, command in _leaf_commands():
        training = name.startswith(TRAINING_COMMANDS)
        precisions = run_settings.PRECISIONS if training else run_settings.INFERENCE_PRECISIONS
        for param in command.params:
            pooling = run_settings.EMBEDDING_POOLINGS if name == "finetune embedding" else run_settings.POOLINGS
            choices = {**expected, "--precision": precisions, "--pooling": pooling}.get(param.opts[0])
            if choices is not None:
                assert tuple(param.type.choices) == tuple(choices), f"bertkit {name} {param.opts[0]}"
                seen.add(param.opts[0])
    assert seen == {*expected, "--precision"}


def test_pretrain_flags_reach_the_settings_and_the_train_config(monkeypatch, tmp_path):
    from bertkit.workflows import pretrain as pretraining

    seen = {}
    monkeypatch.setattr(pretraining, "pretrain", lambda settings, config: seen.update(s=settings, c=config)
                        or SimpleNamespace(stop_reason="budget", checkpoint=None))
    assert main(["pretrain", "--data", str(tmp_path), "--output", str(tmp_path / "run"), "--max-time", "1h30m",
                 "--adam-epsilon", "1e-7", "--learning-rate", "3e-4", "--no-nsp", "--compile"]) == 0
    settings, config = seen["s"], seen["c"]
    assert (config.max_time_s, config.adam_epsilon, config.learning_rate) == (5400.0, 1e-7, 3e-4)
    assert (settings.nsp, config.compile) == (False, True)
    # what the recipe decides stays unset (None) for the run's plan to fill: no list of given flags
    assert (settings.max_seq_length, settings.dropout, config.warmup_ratio, config.head_warmup_steps) == (None,) * 4
    # defaults: the CLI's own (model, recipe, eval every 500 steps), else the dataclasses'
    assert (settings.model, settings.recipe, config.eval_every) == ("bert-base", "auto", 500)
    assert config.save_every == 1000
    # no batch flag: the recipe's global batch (the CLI leaves it unset for the recipe to fill), 32 without one
    assert (config.global_batch_size, config.micro_batch_size, config.batch_size) == (None, None, None)
    assert config.batch_plan(1) == (32, 32, 1)
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
    from bertkit.workflows import finetune

    seen = {}
    monkeypatch.setattr(finetune, "run_finetuning", lambda k, train, devs, cfg, task: seen.update(
        kind=k, train=train, devs=devs, cfg=cfg, task=task) or {"seeds": {}, "summary": {}})
    assert main(["finetune", kind, "--model", "m", "--train", "t.tsv", "--dev", "a.tsv", "--dev", "b.tsv",
                 "--output", str(tmp_path), "--seeds", "1,2", "--feature-layers", "-1,-2", "--resume", "auto",
                 *extra]) == 0
    cfg = seen["cfg"]
    assert (seen["kind"], seen["train"], seen["devs"]) == (kind, "t.tsv", ["a.tsv", "b.tsv"])
    assert expected.items() <= seen["task"].items()
    assert (cfg.seeds, cfg.feature_layers, cfg.resume, cfg.train.learning_rate, cfg.output) == (
        (1, 2), (-1, -2), True, None, tmp_path)
    assert (cfg.train.num_epochs, cfg.train.adam_epsilon, cfg.group_by_length) == (3.0, 1e-8, True)
    assert cfg.train.batch_plan(1) == (32, 32, 1) and cfg.train.batch_plan(4) == (32, 8, 1)  # the paper's batch of 32


def test_the_help_of_every_command_imports_no_torch():
    """--help of the generated commands (pretrain, finetune) too: their settings live in bertkit.settings."""
    commands = ("pretrain", "finetune", "finetune classification", "finetune tagging", "finetune squad",
                "finetune multiple-choice", "predict", "evaluate", "extract", "serve", "export onnx",
                "data pretraining", "tokenizer train", "quickstart", "info", "convert", "doctor")
    code = (f"import sys; from bertkit.cli import main; [main([*c.split(), '--help']) for c in {commands!r}]; "
            "print(sorted({'torch', 'numpy'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().endswith("[]")


@dataclass
class Inner:
    """A nested run description, as TrainConfig inside FinetuneSettings."""

    steps: int | None = None
    """Steps to run."""
    rate: float = 0.1
    """A rate."""
    hidden: str = "kept"
    """Not a flag of the outer command."""


@dataclass
class Outer:
    """A command's settings holding a nested one with defaults of its own."""

    name: str
    """The name."""
    inner: Inner = field(default_factory=lambda: Inner(steps=3, rate=0.5))
    """The nested settings."""


def test_a_nested_settings_field_becomes_its_fields_flags_with_the_holders_defaults():
    command = _command(Outer, exclude=("hidden",))
    help_text = " ".join(CliRunner().invoke(command, ["--help"]).output.split())
    assert "--steps INTEGER Steps to run. [default: 3]" in help_text
    assert "--rate FLOAT A rate. [default: 0.5]" in help_text
    assert "--inner" not in help_text and "--hidden" not in help_text
    result = CliRunner().invoke(command, ["--name", "n", "--rate", "0.25"])
    assert result.output.strip() == repr(Outer("n", Inner(steps=3, rate=0.25, hidden="kept")))


def test_a_name_declared_at_two_levels_is_refused():
    @dataclass
    class Clash:
        """Two settings of one name."""

        rate: float = 1.0
        """A rate."""
        inner: Inner = field(default_factory=Inner)
        """Nested."""

    with pytest.raises(TypeError, match=r"\['rate'\] declared at two levels"):
        settings_options(Clash)
