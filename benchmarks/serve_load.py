"""Load test of `bertkit serve`: N requests at concurrency C on loopback against a real uvicorn process.

    python benchmarks/serve_load.py                          # 2,000 requests, concurrency 16, a bert-tiny MLM
    python benchmarks/serve_load.py --model runs/mrpc/best --endpoint classify --requests 5000

Without --model it saves a randomly initialised model of `--preset` size with a small inline
vocabulary to a temporary directory (the numbers measure the serving stack, not the weights). The
server is started with `python -m bertkit serve` on 127.0.0.1, the script waits for /ready, sends the
requests from an asyncio client (httpx) keeping `--concurrency` in flight, and reports throughput,
p50/p99 latency, the server's CPU time per request (user + system, from /proc on Linux: steadier than
throughput on a shared machine), and every non-200 answer as an error. The whole run is bounded by
`--time-limit`; requests not sent by then are reported as not sent. Finally it sends SIGTERM and
reports the exit code.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from bertkit.errors import BertkitError
from bertkit.serve.client import wait_until_ready

WORDS = ("the a of and to in is was he she it they we you that for on with as his her at by from this "
         "cat dog sat ran mat park house city river king people day time world water light").split()
TEXTS = [" ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(4 + i % 12)) for i in range(64)]


def build_model(directory: Path, preset_name: str) -> Path:
    from bertkit.config import preset
    from bertkit.model import BertForMaskedLM
    from bertkit.tokenizer import WordPieceTokenizer

    tokenizer = WordPieceTokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS])
    BertForMaskedLM(preset(preset_name, vocab_size=tokenizer.vocab_size)).save_pretrained(directory, tokenizer)
    return directory


def payload(endpoint: str, i: int) -> dict:
    text = TEXTS[i % len(TEXTS)]
    if endpoint == "fill-mask":
        words = text.split()
        words[len(words) // 2] = "[MASK]"
        return {"inputs": [" ".join(words)], "top_k": 5}
    if endpoint == "answer":
        return {"question": "where did the cat sit?", "context": text}
    return {"inputs": [text]}


async def load(url: str, endpoint: str, requests: int, concurrency: int, deadline: float) -> dict:
    latencies: list[float] = []
    statuses: collections.Counter = collections.Counter()
    next_index = 0

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal next_index
        while next_index < requests and time.monotonic() < deadline:
            i, next_index = next_index, next_index + 1
            start = time.perf_counter()
            try:
                response = await client.post(f"{url}/{endpoint}", json=payload(endpoint, i))
                statuses[response.status_code] += 1
            except httpx.HTTPError as exc:
                statuses[type(exc).__name__] += 1
            latencies.append(time.perf_counter() - start)

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        began = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
        elapsed = time.perf_counter() - began
    return {"latencies": latencies, "statuses": statuses, "elapsed": elapsed, "sent": len(latencies)}


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (NaN where /proc is missing)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime (fields 14, 15)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, default=None, help="checkpoint directory (default: a temporary one)")
    parser.add_argument("--preset", default="bert-tiny", help="size of the temporary model")
    parser.add_argument("--endpoint", default="fill-mask", help="fill-mask, embed, classify, tag or answer")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--time-limit", type=float, default=120.0, help="seconds for the whole load phase")
    parser.add_argument("--threads", type=int, default=1, help="server torch threads")
    parser.add_argument("--max-batch-size", type=int, default=32)
    args = parser.parse_args()
    from bertkit import hardware

    print(hardware.header())

    with tempfile.TemporaryDirectory() as scratch:
        model = args.model or build_model(Path(scratch) / "model", args.preset)
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        url = f"http://127.0.0.1:{port}"
        command = [sys.executable, "-m", "bertkit", "serve", "--model", str(model), "--port", str(port),
                   "--threads", str(args.threads), "--max-batch-size", str(args.max_batch_size),
                   "--log-level", "warning"]
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   env={**os.environ, "OMP_NUM_THREADS": str(args.threads)})
        try:
            try:
                wait_until_ready(url, process, timeout_s=120)
            except BertkitError as exc:
                process.kill()  # a server that is still starting would never close its output
                raise SystemExit(f"{exc}:\n{process.communicate()[0].decode()}") from None
            cpu_before = cpu_seconds(process.pid)
            result = asyncio.run(load(url, args.endpoint, args.requests, args.concurrency,
                                      time.monotonic() + args.time_limit))
            result["server_cpu_s"] = cpu_seconds(process.pid) - cpu_before
        finally:
            process.send_signal(signal.SIGTERM)
            code = process.wait(timeout=60)
    report(args, result, code)


def report(args: argparse.Namespace, result: dict, exit_code: int) -> None:
    latencies = np.array(result["latencies"]) * 1000
    errors = sum(n for status, n in result["statuses"].items() if status != 200)
    print(f"endpoint /{args.endpoint}, {args.requests} requests at concurrency {args.concurrency}, "
          f"server threads {args.threads}, max batch {args.max_batch_size}")
    print(f"sent {result['sent']} (not sent within {args.time_limit:g} s: {args.requests - result['sent']}) "
          f"in {result['elapsed']:.2f} s -> {result['sent'] / result['elapsed']:.1f} requests/s")
    print(f"latency ms: p50 {np.percentile(latencies, 50):.1f}, p99 {np.percentile(latencies, 99):.1f}, "
          f"max {latencies.max():.1f}")
    print(f"server CPU: {result['server_cpu_s'] * 1000 / max(result['sent'], 1):.2f} ms per request")
    print(f"errors: {errors} (status counts: {dict(result['statuses'])}); server exit code after SIGTERM: {exit_code}")


if __name__ == "__main__":
    main()
