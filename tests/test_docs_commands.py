"""Every `bertkit ...` command shown in README.md and docs/ names a real subcommand and real flags.

Each command's behaviour is tested in its own test module; this test keeps the documentation from
drifting away from the CLI (a renamed flag fails here).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest

from bertkit.cli import cli

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def documented_commands() -> list[tuple[str, list[str]]]:
    """(where, argv after 'bertkit') for each bertkit command line inside a fenced code block."""
    found = []
    for document in DOCUMENTS:
        in_code, pending, start = False, "", 0
        for number, line in enumerate(document.read_text(encoding="utf-8").splitlines(), 1):
            if line.lstrip().startswith("```"):
                in_code = not in_code
                continue
            if not in_code or line.strip().startswith("#"):
                continue
            start = start if pending else number
            pending += " " + line.strip()
            if pending.endswith("\\"):  # a continued shell line
                pending = pending[:-1]
                continue
            match = re.search(r"(?:^|\s-m\s+)bertkit(?:\.cli)?\s+(.*)$", pending.strip())
            if match:
                command = re.split(r" #| \| | && ", match.group(1))[0]
                words = [w for w in shlex.split(command) if w != "..."]
                found.append((f"{document.name}:{start}", words))
            pending = ""
    return found


COMMANDS = documented_commands()


def test_the_readme_shows_the_main_commands():
    shown = {argv[0] for _, argv in COMMANDS if argv}
    assert {"tokenizer", "data", "pretrain", "finetune", "predict", "extract", "serve", "quickstart"} <= shown


@pytest.mark.parametrize("where, argv", COMMANDS, ids=[w for w, _ in COMMANDS])
def test_documented_command_uses_real_flags(where, argv):
    command: click.Command = cli
    context = click.Context(cli)
    words = list(argv)
    while isinstance(command, click.Group) and words and not words[0].startswith("-"):
        sub = command.get_command(context, words.pop(0))
        assert sub is not None, f"{where}: unknown subcommand in `bertkit {' '.join(argv)}`"
        command = sub
    known = {name for param in command.params for name in (*param.opts, *param.secondary_opts)}
    known |= {"--help", "-h"}
    used = [w.split("=")[0] for w in words if w.startswith("--")]
    unknown = [flag for flag in used if flag not in known]
    assert not unknown, f"{where}: `bertkit {' '.join(argv)}` uses unknown flags {unknown}"
