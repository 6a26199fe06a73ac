"""Load test of `bertkit serve`: requests at concurrency C on loopback against a real uvicorn process.

    python benchmarks/serve_load.py                          # 2,000 requests, concurrency 16, a bert-tiny MLM
    python benchmarks/serve_load.py --model runs/mrpc/best --endpoint classify --requests 5000
    python benchmarks/serve_load.py --mixed --duration 60    # batching by count vs by tokens (issue 26)

Without --model it saves a randomly initialised model of `--preset` size to a temporary directory (the
numbers measure the serving stack, not the weights). The server is started with `python -m bertkit
serve` on 127.0.0.1, the script waits for /ready, sends the requests from an asyncio client (httpx)
keeping `--concurrency` in flight, and reports throughput, p50/p99 latency, the server's CPU time per
request (user + system, from /proc on Linux: steadier than throughput on a shared machine), and every
non-200 answer as an error. Finally it sends SIGTERM and reports the exit code.

Default mode: `--requests` short texts (4-15 words of a small inline vocabulary), bounded by `--time-limit`;
requests not sent by then are reported as not sent.

`--mixed`: mixed-length /embed traffic from real text, the bundled King James Bible (one text per
request): 70% one verse, 25% two consecutive verses, 5% consecutive verses joined to 75-100% of the
model's maximum length (512 tokens for the presets; the printed summary gives the token counts). The
model defaults to bert-small's shape (L4/H512) with random weights and a WordPiece vocabulary of 8,192
trained on the corpus, fp32. Two servers run back to back on the same request sequence, each warmed up
for `--warmup` s and then loaded for `--duration` s: batching by count (`--max-batch-tokens` 10^9, so only
`--max-batch-size` closes a batch: the server before issue 26) and by tokens (each of `--max-batch-tokens`,
comma-separated); with
`--rounds` > 1 the order alternates (count, tokens, tokens, count, ...) to cancel drift. It prints a
markdown table and exits 1 if any answer was a 5xx or a connection error.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gzip
import itertools
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bertkit.errors import BertkitError
from bertkit.serve.client import wait_until_ready

WORDS = ("the a of and to in is was he she it they we you that for on with as his her at by from this "
         "cat dog sat ran mat park house city river king people day time world water light").split()
TEXTS = [" ".join(WORDS[(i * 7 + k) % len(WORDS)] for k in range(4 + i % 12)) for i in range(64)]
UNLIMITED_TOKENS = 10**9  # "by count": no batch reaches this budget
MIX = (("one verse", 0.70), ("two verses", 0.25), ("near maximum", 0.05))


def build_model(directory: Path, preset_name: str, tokenizer: Any = None) -> Path:
    from bertkit.config import preset
    from bertkit.model import BertForMaskedLM
    from bertkit.tokenizer import WordPieceTokenizer

    tokenizer = tokenizer or WordPieceTokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS])
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


# --- mixed-length traffic -------------------------------------------------------------------------------

def kjv_verses() -> list[str]:
    from bertkit.assets import kjv_path

    with gzip.open(kjv_path("corpus.txt.gz"), "rt", encoding="utf-8") as lines:
        return [line.strip() for line in lines if line.strip()]


def mixed_texts(verses: list[str], count_tokens: Callable[[str], int], max_tokens: int, n: int, seed: int,
                ) -> tuple[list[str], list[str]]:
    """`n` texts drawn by MIX from consecutive verses, and the kind of each."""
    rng = random.Random(seed)
    texts, kinds = [], []
    for kind in rng.choices([k for k, _ in MIX], [p for _, p in MIX], k=n):
        start = rng.randrange(len(verses) - 1)
        if kind == "one verse":
            text = verses[start]
        elif kind == "two verses":
            text = f"{verses[start]} {verses[start + 1]}"
        else:
            target, end, text = rng.uniform(0.75, 1.0) * max_tokens, start, verses[start]
            while count_tokens(text) < target:
                end = (end + 1) % len(verses)
                text = f"{text} {verses[end]}"
        texts.append(text)
        kinds.append(kind)
    return texts, kinds


def mix_summary(texts: list[str], kinds: list[str], count_tokens: Callable[[str], int], max_tokens: int) -> str:
    tokens = np.array([min(count_tokens(t), max_tokens) for t in texts])
    shares = collections.Counter(kinds)
    parts = ", ".join(f"{kind} {shares[kind] / len(kinds):.0%}" for kind, _ in MIX)
    return (f"traffic: {len(texts)} KJV texts ({parts}); tokens per input (cut at {max_tokens}): mean "
            f"{tokens.mean():.0f}, p50 {np.percentile(tokens, 50):.0f}, p90 {np.percentile(tokens, 90):.0f}, "
            f"p99 {np.percentile(tokens, 99):.0f}, max {tokens.max()}")


# --- the load ---------------------------------------------------------------------------------------------

async def load(url: str, endpoint: str, requests: int, concurrency: int, deadline: float,
               make_payload: Callable[[int], dict] | None = None) -> dict:
    latencies: list[float] = []
    statuses: collections.Counter = collections.Counter()
    next_index = 0
    make_payload = make_payload or (lambda i: payload(endpoint, i))

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal next_index
        while next_index < requests and time.monotonic() < deadline:
            i, next_index = next_index, next_index + 1
            start = time.perf_counter()
            try:
                response = await client.post(f"{url}/{endpoint}", json=make_payload(i))
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


def with_server(args: argparse.Namespace, model: Path, log: Path, extra: list[str],
                work: Callable[[str, int], dict]) -> tuple[dict, int]:
    """Start `bertkit serve` on a free loopback port, run `work(url, pid)` once it is ready, stop it with
    SIGTERM; the work's result and the server's exit code."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "bertkit", "serve", "--model", str(model), "--port", str(port),
               "--threads", str(args.threads), "--max-batch-size", str(args.max_batch_size),
               "--precision", args.precision, "--log-level", "warning", *extra]
    with log.open("wb") as output:  # a file, not a pipe nobody reads while the server runs
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT,
                                   env={**os.environ, "OMP_NUM_THREADS": str(args.threads)})
        try:
            try:
                wait_until_ready(url, process, timeout_s=300)
            except BertkitError as exc:
                process.kill()
                process.wait()
                raise SystemExit(f"{exc}:\n{log.read_text(errors='replace')}") from None
            result = work(url, process.pid)
        finally:
            process.send_signal(signal.SIGTERM)
            code = process.wait(timeout=60)
    return result, code


def measured(url: str, pid: int, load_run: Callable[[float], dict], duration: float) -> dict:
    cpu_before = cpu_seconds(pid)
    result = asyncio.run(load_run(time.monotonic() + duration))
    result["server_cpu_s"] = cpu_seconds(pid) - cpu_before
    return result


# --- default mode -----------------------------------------------------------------------------------------

def run_default(args: argparse.Namespace, scratch: Path) -> None:
    model = args.model or build_model(scratch / "model", args.preset or "bert-tiny")

    def work(url: str, pid: int) -> dict:
        return measured(url, pid, lambda deadline: load(url, args.endpoint, args.requests, args.concurrency,
                                                          deadline), args.time_limit)

    result, code = with_server(args, model, scratch / "server.log", [], work)
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


# --- mixed mode: by count vs by tokens -------------------------------------------------------------------

def run_mixed(args: argparse.Namespace, scratch: Path) -> int:
    from bertkit.config import BertConfig
    from bertkit.tokenizer import WordPieceTokenizer

    verses = kjv_verses()
    if args.model is None:
        corpus = scratch / "kjv.txt"
        corpus.write_text("\n".join(verses), encoding="utf-8")
        tokenizer = WordPieceTokenizer.train([corpus], vocab_size=8192, show_progress=False)
        model = build_model(scratch / "model", args.preset or "bert-small", tokenizer)
    else:
        model, tokenizer = args.model, WordPieceTokenizer.from_pretrained(args.model)
    max_tokens = BertConfig.from_json_file(model / "config.json").max_position_embeddings

    def count_tokens(text: str) -> int:
        return len(tokenizer.encode_ids([text])[0]) + 2

    texts, kinds = mixed_texts(verses, count_tokens, max_tokens, 8192, args.seed)
    print(mix_summary(texts, kinds, count_tokens, max_tokens))
    configs = {"by count": UNLIMITED_TOKENS, **{f"by tokens ({budget})": budget for budget in args.max_batch_tokens}}
    order = [name for pair in itertools.islice(itertools.cycle([list(configs), list(configs)[::-1]]), args.rounds)
             for name in pair]
    runs: dict[str, list[dict]] = {name: [] for name in configs}
    for name in order:
        result, code = with_server(args, model, scratch / "server.log", ["--max-batch-tokens", str(configs[name])],
                                   lambda url, pid: mixed_run(args, url, pid, texts))
        result["exit_code"] = code
        runs[name].append(result)
        print(f"  {name}: {result['sent'] / result['elapsed']:.1f} requests/s", flush=True)
    return table(args, configs, runs)


def mixed_run(args: argparse.Namespace, url: str, pid: int, texts: list[str]) -> dict:
    def make(offset: int) -> Callable[[int], dict]:
        return lambda i: {"inputs": [texts[(offset + i) % len(texts)]]}

    asyncio.run(load(url, "embed", 10**9, args.concurrency, time.monotonic() + args.warmup,
                     make(len(texts) // 2)))  # warm-up: other texts than the measured ones
    return measured(url, pid, lambda deadline: load(url, "embed", 10**9, args.concurrency, deadline, make(0)),
                    args.duration)


def table(args: argparse.Namespace, configs: dict[str, int], runs: dict[str, list[dict]]) -> int:
    print(f"\n/embed at concurrency {args.concurrency}, {args.duration:g} s x {args.rounds} round(s) each, "
          f"server threads {args.threads}, --max-batch-size {args.max_batch_size}, precision {args.precision}\n")
    print("| batching | --max-batch-tokens | requests | requests/s | p50 ms | p99 ms | server CPU ms/request | "
          "non-200 | 5xx or connection errors |")
    print("|---|---|---|---|---|---|---|---|---|")
    rows, failures = {}, 0
    for name, results in runs.items():
        latencies = np.concatenate([np.array(r["latencies"]) * 1000 for r in results])
        sent, elapsed = sum(r["sent"] for r in results), sum(r["elapsed"] for r in results)
        statuses = sum((r["statuses"] for r in results), collections.Counter())
        non_200 = sum(n for status, n in statuses.items() if status != 200)
        broken = sum(n for status, n in statuses.items() if not isinstance(status, int) or status >= 500)
        failures += broken + sum(r["exit_code"] != 0 for r in results)
        rps, p50, p99 = rows[name] = (sent / elapsed, np.percentile(latencies, 50), np.percentile(latencies, 99))
        budget = "unlimited" if configs[name] == UNLIMITED_TOKENS else str(configs[name])
        cpu = sum(r["server_cpu_s"] for r in results) * 1000 / max(sent, 1)
        print(f"| {name.split(' (')[0]} | {budget} | {sent} | {rps:.1f} | {p50:.0f} | {p99:.0f} | {cpu:.1f} | "
              f"{non_200} | {broken} |")
    count_rps, _, count_p99 = rows.pop("by count")
    print()
    for name, (rps, _, p99) in rows.items():
        print(f"{name} / by count: {rps / count_rps:.2f}x requests/s, p99 {p99 / count_p99:.2f}x "
              "(target: >= 1.3x requests/s at a p99 ratio <= 1.0)")
    if failures:
        print(f"FAILED: {failures} 5xx answers, connection errors or non-zero server exits")
    return 1 if failures else 0


def _integers(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(","))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, default=None, help="checkpoint directory (default: a temporary one)")
    parser.add_argument("--preset", default=None, help="size of the temporary model (bert-tiny; --mixed: bert-small)")
    parser.add_argument("--endpoint", default="fill-mask", help="fill-mask, embed, classify, tag or answer")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--time-limit", type=float, default=120.0, help="seconds for the whole load phase")
    parser.add_argument("--threads", type=int, default=1, help="server torch threads")
    parser.add_argument("--max-batch-size", type=int, default=32)
    parser.add_argument("--precision", default=None, help="server --precision (default: auto; --mixed: fp32, "
                        "so both runs compute alike)")
    parser.add_argument("--mixed", action="store_true", help="mixed-length KJV traffic: by count vs by tokens")
    parser.add_argument("--max-batch-tokens", type=_integers, default=(1024, 2048),
                        help="--mixed: the by-tokens budget(s), comma-separated (default 1024,2048)")
    parser.add_argument("--duration", type=float, default=60.0, help="--mixed: measured seconds per run")
    parser.add_argument("--warmup", type=float, default=5.0, help="--mixed: unmeasured seconds before each run")
    parser.add_argument("--rounds", type=int, default=1, help="--mixed: runs of each configuration")
    parser.add_argument("--seed", type=int, default=0, help="--mixed: seed of the traffic")
    args = parser.parse_args()
    args.precision = args.precision or ("fp32" if args.mixed else "auto")
    from bertkit.runtime import report

    print(report.header())
    with tempfile.TemporaryDirectory() as scratch:
        if args.mixed:
            sys.exit(run_mixed(args, Path(scratch)))
        run_default(args, Path(scratch))


if __name__ == "__main__":
    main()
