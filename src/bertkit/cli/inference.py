"""`bertkit extract`, `bertkit export onnx` and `bertkit serve`: flags only, the work is in
`bertkit.workflows.extract`, `bertkit.export.onnx` and `bertkit.serve`.

Design decision: the flags are generated (bertkit.cli.options) from the settings the library takes:
`ExtractSettings`, `ExportSettings`, and for serve `ServeSettings` (model, address, threads),
`ServerSettings`, `Limits` and a classifier's `LongDocumentSettings` (bertkit.settings,
torch-free). Heavy imports (torch, onnxruntime, FastAPI)
happen inside each command, so `--help` answers at once; the server binds 127.0.0.1 unless `--host` says
otherwise, and the API key can come from the environment (BERTKIT_API_KEY) so it stays out of shell
history and process listings. `serve` and `export onnx` need an optional extra of the package: a missing
module of it is refused first, in one line naming the extra to install, before anything is loaded or written.
"""

from __future__ import annotations

import importlib.util
import logging
from typing import Any

import click

from bertkit.cli.options import settings_from_flags, settings_options
from bertkit.errors import BertkitError
from bertkit.settings import (
    ExportSettings,
    ExtractSettings,
    LongDocumentSettings,
    ServerSettings,
    ServeSettings,
)

CONTEXT = {"show_default": True}

EXTRAS = {"serve": ("fastapi", "fastapi_offline", "uvicorn", "prometheus_client", "httpx"),
          "onnx": ("onnx", "onnxruntime")}
"""The modules of pyproject.toml's optional dependencies that a command needs (a test compares them)."""


def require_extra(extra: str, command: str) -> None:
    """Refuse `command` in one line naming `pip install "bertkit[extra]"` when a module of the extra is missing."""
    missing = [name for name in EXTRAS[extra] if importlib.util.find_spec(name) is None]
    if missing:
        raise BertkitError(f"bertkit {command} needs the optional packages of bertkit[{extra}] ({', '.join(missing)} "
                           f"not installed); install them with: pip install \"bertkit[{extra}]\"")


@click.command(context_settings=CONTEXT)
@settings_options(ExtractSettings, overrides={"precision": {"default": "auto"}, "pooling": {"default_text": "auto"}})
def extract(**flags: Any) -> None:
    """Extract contextual features (per-token layers or pooled sentence vectors)."""
    from bertkit.workflows.extract import extract_features

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    settings = settings_from_flags(ExtractSettings, flags)
    count = extract_features(settings)
    click.echo(f"wrote features of {count} lines to {settings.output}")


@click.group(context_settings=CONTEXT)
def export() -> None:
    """Export a model to ONNX."""


@export.command(context_settings=CONTEXT)
@settings_options(ExportSettings)
def onnx(**flags: Any) -> None:
    """Export a checkpoint's head to ONNX and check it against onnxruntime."""
    require_extra("onnx", "export onnx")
    from bertkit.export.onnx import export_onnx

    report = export_onnx(settings_from_flags(ExportSettings, flags))
    for line in report.lines():
        click.echo(line)


@click.command(context_settings=CONTEXT)
@settings_options(ServeSettings, overrides={"precision": {"default": "auto"}})
@settings_options(ServerSettings, overrides={"api_key": {"envvar": "BERTKIT_API_KEY", "show_envvar": True}})
@settings_options(LongDocumentSettings)
def serve(**flags: Any) -> None:
    """Serve a model over HTTP (FastAPI + uvicorn; OpenAPI docs at /docs)."""
    require_extra("serve", "serve")
    from bertkit.serve.app import check_port_free, create_app, run_server
    from bertkit.serve.predictor import load_predictor
    from bertkit.serve.routes import served_paths

    run = settings_from_flags(ServeSettings, flags)
    long_documents = settings_from_flags(LongDocumentSettings, flags)
    settings = settings_from_flags(ServerSettings, flags)
    logging.basicConfig(level=run.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    check_port_free(run.host, run.port)  # before the model loads, not after the "serving ... on" line
    predictor = load_predictor(run, settings.max_batch_size, long_documents)
    click.echo(f"serving {', '.join(served_paths(predictor))} (text-embeddings-inference's routes) "
               f"on http://{run.host}:{run.port}; docs: /docs")
    run_server(create_app(predictor, settings), run)
