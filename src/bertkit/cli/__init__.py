"""The `bertkit` command line: a table from subcommand name to the module that defines it.

Design decision: subcommands are imported lazily, only when invoked, so `bertkit --help` answers
without importing torch, and each command group lives in its own module (`bertkit/cli/<name>.py`)
that only parses flags and calls library functions. The flags of every command that configures a run
are generated from the settings dataclasses its library function takes (`bertkit.settings`,
`bertkit.quickstart.config`; `bertkit.cli.options`), which import no torch, so their `--help` is fast
too (a test checks every command's). A `BertkitError` raised anywhere below is
printed as one line on stderr with exit status 2, never as a traceback. SIGINT and SIGTERM stop a
command as a whole: long runs save and raise `Interrupted`, which is printed with the command line
that continues the run; elsewhere the command just stops. Either way the exit status is 130 (SIGINT)
or 143 (SIGTERM), as a shell reports death by those signals, so `a && b` does not go on to b.
"""

from __future__ import annotations

import errno
import importlib
import shlex
import signal
import sys
from typing import Any

import click

from bertkit.errors import BertkitError, Interrupted, ModelFault
from bertkit.runtime.allocator import keep_freed_memory
from bertkit.settings.distillation import DISTILL_KINDS
from bertkit.settings.tasks import FINETUNE_KINDS

# name -> "module:attribute" of a click command or group.
COMMANDS: dict[str, str] = {
    "info": "bertkit.cli.checkpoint:info",
    "doctor": "bertkit.cli.doctor:doctor",
    "convert": "bertkit.cli.checkpoint:convert",
    "tokenizer": "bertkit.cli.tokenizer:tokenizer",
    "data": "bertkit.cli.data:data",
    "pretrain": "bertkit.cli.pretrain:pretrain",
    "finetune": "bertkit.cli.finetune:finetune",
    "distill": "bertkit.cli.distill:distill",
    "glue": "bertkit.cli.glue:glue",
    "predict": "bertkit.cli.predict:predict",
    "evaluate": "bertkit.cli.predict:evaluate",
    "extract": "bertkit.cli.inference:extract",
    "export": "bertkit.cli.inference:export",
    "serve": "bertkit.cli.inference:serve",
    "quickstart": "bertkit.cli.quickstart:quickstart",
}

# One-line summaries, so the top-level --help needs no imports.
SUMMARIES: dict[str, str] = {
    "info": "Show a checkpoint's config, parameter count and vocabulary.",
    "doctor": "Show this machine, its measured fp32/bf16/int8 rates, and what --precision auto picks.",
    "convert": "Convert Google's TensorFlow BERT checkpoint to a bertkit/Hugging Face directory.",
    "tokenizer": "Train or inspect a WordPiece vocabulary.",
    "data": "Build pre-training data (MLM + NSP instances) from text.",
    "pretrain": "Pre-train BERT with masked LM (+ next sentence prediction where the recipe or --nsp says).",
    "finetune": "Fine-tune one of: " + ", ".join(FINETUNE_KINDS) + ".",
    "distill": ("Distil a model into a smaller, faster student (" + ", ".join((*DISTILL_KINDS, "embedding",
                                                                               "pretraining")) + ")."),
    "glue": "Fine-tune on every task of a GLUE directory (lr chosen on dev, seeds) -> one table like the paper's.",
    "predict": "Predict with a fine-tuned model directory.",
    "evaluate": "Evaluate a fine-tuned model directory on a labelled file.",
    "extract": "Extract contextual features (per-token layers or pooled sentence vectors).",
    "export": "Export a model to ONNX.",
    "serve": "Serve a model over HTTP.",
    "quickstart": "Vocabulary -> data -> pre-train -> fine-tune -> report on the bundled corpus.",
}


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Summaries come from the table, so listing commands imports none of them.
        with formatter.section("Commands"):
            formatter.write_dl([(name, SUMMARIES[name]) for name in self.list_commands(ctx)])

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module_name, attribute = COMMANDS[name].split(":")
        return getattr(importlib.import_module(module_name), attribute)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.version_option(package_name="bertkit")
def cli() -> None:
    """bertkit: BERT end to end - vocabulary, pre-training data, pre-training, fine-tuning,
    feature extraction and serving, with Hugging Face-compatible checkpoints."""


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `bertkit` console script."""
    argv = sys.argv[1:] if argv is None else list(argv)
    previous = _stop_on_sigterm()
    keep_freed_memory()  # large tensors reused instead of page-faulted on every step (bertkit.runtime.allocator)
    try:
        cli.main(args=argv, prog_name="bertkit", standalone_mode=False)
    except (BertkitError, ModelFault) as exc:
        click.echo(f"bertkit: error: {exc}", err=True)
        return 2
    except OSError as exc:  # a failure no check could foresee (a disk that filled, a path removed meanwhile)
        click.echo(f"bertkit: error: {_os_error(exc)}", err=True)
        return 1
    except MemoryError:  # every reader is bounded, but a bound can still exceed a small machine's memory
        click.echo("bertkit: error: out of memory; give large data as Parquet or a `datasets` directory (read in "
                   "batches), fewer or shorter inputs, or run on a machine with more memory", err=True)
        return 1
    except (click.exceptions.Abort, KeyboardInterrupt) as exc:
        return _interrupted(exc, argv)
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.exceptions.Exit as exc:
        return exc.exit_code
    finally:
        _restore_sigterm(previous)
    return 0


def _stop_on_sigterm() -> Any:
    """SIGTERM stops the command like Ctrl-C does (the training loop installs its own saving handler)."""
    def stop(signum: int, frame: Any) -> None:
        raise Interrupted("stopped by SIGTERM", signum)
    try:
        return signal.signal(signal.SIGTERM, stop)
    except ValueError:  # not the main thread (e.g. called from a test's worker thread)
        return None


def _restore_sigterm(previous: Any) -> None:
    if previous is not None:
        signal.signal(signal.SIGTERM, previous)


def _os_error(exc: OSError) -> str:
    """An OSError in one line: the path, what failed, what to do."""
    where = f"{exc.filename}: " if exc.filename else ""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        advice = "free space on that disk, then run the command again (with --resume auto where it has one)"
    elif exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        advice = "choose a path you can write to"
    else:
        advice = "check the path and run the command again"
    return f"{where}{exc.strerror or exc}; {advice}"


def _interrupted(exc: BaseException, argv: list[str]) -> int:
    """Print why the command stopped and how to continue it; return 128 + the signal's number."""
    cause = exc if isinstance(exc, Interrupted) else exc.__cause__ or exc.__context__  # click wraps it in Abort
    if not isinstance(cause, Interrupted):
        click.echo("bertkit: interrupted (SIGINT)", err=True)
        return 128 + signal.SIGINT
    message = f"bertkit: {cause}"
    if cause.resume_flag:
        message += f"\ncontinue with: {shlex.join(['bertkit', *continuing(argv, cause.resume_flag)])}"
    click.echo(message, err=True)
    return cause.exit_code


# Flags that start a run over, which a resumed run refuses ("--resume and --overwrite contradict each other").
START_OVER_FLAGS = ("--overwrite",)


def continuing(argv: list[str], resume_flag: str) -> list[str]:
    """The command line that continues the interrupted `argv`: the flags that start over dropped, any
    --resume of its own (e.g. an older checkpoint, which would start a new branch) replaced by `resume_flag`
    ('--resume auto', or quickstart's bare '--resume'), so the printed line runs as it is."""
    flag, *value = resume_flag.split()
    kept: list[str] = []
    skip = 0
    for arg in argv:
        if skip:
            skip -= 1
        elif arg in START_OVER_FLAGS or arg.startswith(flag + "="):
            continue
        elif arg == flag:
            skip = len(value)  # its value follows as the next argument
        else:
            kept.append(arg)
    return [*kept, flag, *value]


if __name__ == "__main__":
    sys.exit(main())
