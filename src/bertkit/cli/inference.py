"""`bertkit extract`, `bertkit export onnx` and `bertkit serve`: flags only, the work is in
`bertkit.features`, `bertkit.export` and `bertkit.serve`.

Design decision: heavy imports (torch, onnxruntime, FastAPI) happen inside each command, so `--help`
answers at once; the server binds 127.0.0.1 unless `--host` says otherwise, and the API key can come
from the environment (BERTKIT_API_KEY) so it stays out of shell history and process listings.
"""

from __future__ import annotations

import logging
from pathlib import Path

import click

from bertkit.settings import INFERENCE_PRECISIONS

CONTEXT = {"show_default": True}


@click.command(context_settings=CONTEXT)
@click.option("--model", required=True, type=click.Path(file_okay=False, exists=True, path_type=Path),
              help="Checkpoint directory (config.json, model.safetensors, vocab.txt); any head; "
                   "a sentence-transformers directory brings its own pooling.")
@click.option("--tokenizer", default=None, type=click.Path(exists=True, path_type=Path),
              help="Directory with vocab.txt (or the file) [default: the --model directory].")
@click.option("--input", "input_path", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="UTF-8 text, one input per line; 'text_a ||| text_b' for a pair.")
@click.option("--output", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="*.jsonl: per-token layer values; *.npy: one pooled vector per line.")
@click.option("--layers", default=None, show_default=False,
              help="Encoder layers to output, -1 = last (as extract_features.py) [default: -1,-2,-3,-4 for .jsonl, "
                   "-1 for .npy].")
@click.option("--pooling", type=click.Choice(["auto", "cls", "mean", "max", "mean_sqrt_len_tokens"]), default=None,
              show_default=False,
              help="How .npy vectors pool the tokens (layers concatenated); auto: a sentence-transformers "
                   "directory's pooling, else [CLS] [default: auto].")
@click.option("--normalize/--no-normalize", default=None, show_default=False,
              help="Unit-length .npy vectors [default: as the sentence-transformers directory says, else no].")
@click.option("--max-seq-length", type=click.IntRange(min=3), default=None, show_default=False,
              help="Longest input in tokens, specials included; longer lines are truncated (counted) "
                   "[default: the sentence-transformers directory's, else 128].")
@click.option("--batch-size", type=click.IntRange(min=1), default=32, help="Lines per forward pass.")
@click.option("--precision", type=click.Choice(INFERENCE_PRECISIONS), default="auto",
              help="auto: the faster of fp32 and bf16 as measured on this machine (`bertkit doctor`); bf16 values "
                   "are within bf16 rounding; int8: encoder layers quantized, CPU only.")
def extract(model: Path, tokenizer: Path | None, input_path: Path, output: Path, layers: str | None,
            pooling: str | None, normalize: bool | None, max_seq_length: int | None, batch_size: int,
            precision: str) -> None:
    """Extract contextual features (per-token layers or pooled sentence vectors)."""
    from bertkit.features import extract_features

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    count = extract_features(model, input_path, output, layers=layers, pooling=pooling, max_seq_length=max_seq_length,
                             batch_size=batch_size, precision=precision, tokenizer=tokenizer, normalize=normalize)
    click.echo(f"wrote features of {count} lines to {output}")


@click.group(context_settings=CONTEXT)
def export() -> None:
    """Export a model to ONNX."""


@export.command(context_settings=CONTEXT)
@click.option("--model", required=True, type=click.Path(file_okay=False, exists=True, path_type=Path),
              help="Checkpoint directory; its config.json architectures entry picks the head and outputs.")
@click.option("--output", required=True, type=click.Path(dir_okay=False, path_type=Path), help="ONNX file to write.")
@click.option("--quantize", type=click.Choice(["int8"]), default=None,
              help="Dynamic int8 quantization (onnxruntime); prints the measured output change.")
@click.option("--sample", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
              help="Text file (one input per line) to check outputs on; default: built-in sentences.")
@click.option("--opset", type=click.IntRange(min=14), default=17, help="ONNX opset version.")
def onnx(model: Path, output: Path, quantize: str | None, sample: Path | None, opset: int) -> None:
    """Export a checkpoint's head to ONNX and check it against onnxruntime."""
    from bertkit.export import export_onnx
    from bertkit.features import read_lines

    texts = [a for a, _ in read_lines(sample)] if sample is not None else None
    report = export_onnx(model, output, quantize=quantize, sample=texts, opset=opset)
    for line in report.lines():
        click.echo(line)


@click.command(context_settings=CONTEXT)
@click.option("--model", required=True, type=click.Path(file_okay=False, exists=True, path_type=Path),
              help="Checkpoint directory; endpoints follow from bertkit_task.json / config.json.")
@click.option("--tokenizer", "tokenizer_dir", type=click.Path(file_okay=False, exists=True, path_type=Path),
              default=None, help="Tokenizer directory to use instead of the model's (same vocabulary size).")
@click.option("--host", default="127.0.0.1", help="Interface to bind; 0.0.0.0 exposes the server to the network.")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, help="TCP port.")
@click.option("--api-key", envvar="BERTKIT_API_KEY", default=None, show_envvar=True,
              help="Require this key (X-API-Key or Authorization: Bearer) on task endpoints.")
@click.option("--max-batch-size", type=click.IntRange(min=1), default=32, help="Most inputs per model call.")
@click.option("--max-wait-ms", type=click.FloatRange(min=0), default=5.0,
              help="How long to gather concurrent requests into one batch.")
@click.option("--max-queue", type=click.IntRange(min=1), default=256, help="Waiting requests before answering 429.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0.01), default=30.0,
              help="Per-request time limit in seconds (504 past it).")
@click.option("--max-body-bytes", type=click.IntRange(min=64), default=1_048_576, help="Largest body (413 above).")
@click.option("--max-inputs", type=click.IntRange(min=1), default=64, help="Most texts per request (422 above).")
@click.option("--max-input-chars", type=click.IntRange(min=1), default=20_000,
              help="Most characters per text, question or context (422 above).")
@click.option("--max-connections", type=click.IntRange(min=1), default=1000,
              help="Open connections; past it a new one replaces the slowest unfinished request, else gets 503.")
@click.option("--header-timeout", type=click.FloatRange(min=0.01), default=10.0,
              help="Seconds to send a request's headers, from connecting or the previous response (408 past it).")
@click.option("--body-timeout", type=click.FloatRange(min=0.01), default=30.0,
              help="Seconds to send a request's body once its headers are in (408 past it).")
@click.option("--keep-alive-timeout", type=click.FloatRange(min=0.01), default=5.0,
              help="Seconds an idle connection stays open between requests.")
@click.option("--max-header-bytes", type=click.IntRange(min=1024), default=16_384,
              help="Largest request line + headers (431 above).")
@click.option("--drain-timeout", type=click.FloatRange(min=0), default=30.0,
              help="Seconds to finish in-flight requests after SIGTERM/SIGINT.")
@click.option("--threads", type=click.IntRange(min=1), default=None, help="torch CPU threads (default: torch's).")
@click.option("--precision", type=click.Choice(INFERENCE_PRECISIONS), default="auto",
              help="auto: the faster of fp32 and bf16 as measured on this machine (`bertkit doctor`); bf16 scores "
                   "are within bf16 rounding; int8: encoder layers quantized, CPU only.")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="info",
              help="Server log level.")
def serve(model: Path, tokenizer_dir: Path | None, host: str, port: int, api_key: str | None, max_batch_size: int,
          max_wait_ms: float, max_queue: int, timeout_s: float, max_body_bytes: int, max_inputs: int,
          max_input_chars: int, max_connections: int, header_timeout: float, body_timeout: float,
          keep_alive_timeout: float, max_header_bytes: int, drain_timeout: float, threads: int | None,
          precision: str, log_level: str) -> None:
    """Serve a model over HTTP (FastAPI + uvicorn; OpenAPI docs at /docs)."""
    import torch

    from bertkit.serve.app import ServerSettings, create_app, run_server
    from bertkit.serve.limits import Limits
    from bertkit.serve.predictor import load_predictor

    logging.basicConfig(level=log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    if threads is not None:
        torch.set_num_threads(threads)
    predictor = load_predictor(model, batch_size=max_batch_size, precision=precision, tokenizer_dir=tokenizer_dir)
    limits = Limits(max_body_bytes=max_body_bytes, max_inputs=max_inputs, max_input_chars=max_input_chars,
                    max_connections=max_connections, header_timeout_s=header_timeout, body_timeout_s=body_timeout,
                    keep_alive_timeout_s=keep_alive_timeout, max_header_bytes=max_header_bytes)
    settings = ServerSettings(limits, max_batch_size, max_wait_ms, max_queue, timeout_s, api_key)
    click.echo(f"serving {', '.join('/' + e for e in predictor.endpoints)} on http://{host}:{port} (docs: /docs)")
    run_server(create_app(predictor, settings), host=host, port=port, drain_timeout_s=drain_timeout,
               log_level=log_level)
