"""`bertkit --help`, `bertkit info` and user errors: one clear line, exit status 2, no traceback."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bertkit.cli import COMMANDS, main
from bertkit.config import preset
from bertkit.model import BertForPreTraining
from bertkit.tokenizer import WordPieceTokenizer

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "##s", "sat"]


def test_top_level_help_lists_every_command_without_importing_torch():
    code = "import sys; from bertkit.cli import main; main(['--help']); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    for name in COMMANDS:
        assert name in out
    assert out.strip().endswith("False")


def _all_command_paths() -> list[list[str]]:
    import click

    from bertkit.cli import cli

    paths, context = [], click.Context(cli)
    for name in COMMANDS:
        command = cli.get_command(context, name)
        paths.append([name])
        if isinstance(command, click.Group):
            paths += [[name, sub] for sub in command.list_commands(context)]
    return paths


@pytest.mark.parametrize("path", _all_command_paths(), ids=" ".join)
def test_every_command_has_help(path, capsys):
    assert main([*path, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"Usage: bertkit {' '.join(path)}") and "--help" in out


def test_info_summarises_a_checkpoint(tmp_path, capsys):
    model = BertForPreTraining(preset("bert-debug", vocab_size=len(VOCAB)))
    model.save_pretrained(tmp_path, tokenizer=WordPieceTokenizer(VOCAB))
    assert main(["info", str(tmp_path), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["parameters"] == model.num_parameters()
    assert summary["architectures"] == ["BertForPreTraining"]
    assert summary["vocabulary"]["size"] == len(VOCAB)
    assert summary["vocabulary"]["special ids"]["[MASK]"] == 4
    assert main(["info", str(tmp_path)]) == 0
    assert "parameters:" in capsys.readouterr().out


def test_user_error_is_one_line_without_traceback(tmp_path):
    result = subprocess.run([sys.executable, "-m", "bertkit.cli", "info", str(tmp_path / "missing")],
                            capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.startswith("bertkit: error:") and "missing: no such model directory" in result.stderr
    assert result.stderr.count("\n") == 1
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
