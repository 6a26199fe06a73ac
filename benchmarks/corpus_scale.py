"""Benchmark: the corpus pipeline at scale - `tokenizer train`, `data pretraining` and `pretrain` up to its
first optimizer step - on 100 MB and 1 GB of text and on 1 GB as Parquet, with wall time and peak memory.

The corpus is the bundled King James Bible (verses as lines, chapters as documents) repeated to each size
(`pretraining_data.make_corpus`); the Parquet copy holds the same documents, one row per document in a
"text" column, written in row groups of 10,000 documents (as pandas and `datasets` write them). Each stage
is the real command (`python -m bertkit ...`) in a process of its own, run one after another, so:

- wall time is the command's, start-up included;
- peak RSS is the largest single process of the command (the main process or one of its workers; Linux's
  ru_maxrss of waited-for descendants), and, where psutil is installed, the peak of the whole process tree
  sampled every 0.2 s (main + workers together);
- `data pretraining` makes dynamically masked data with --dupe-factor 2 (1 GB of text gives about 1.4 GB of
  shards; masks are drawn at load, so more passes add little), on every core;
- `pretrain` runs bert-mini with `--max-steps 1`; "first step" is the time from the command's start until
  metrics.jsonl holds its first training record, which includes opening every shard, holding out the
  evaluation instances and planning the epoch over all of the data.

A rerun of one stage (`--stages pretrain`) reuses the vocabulary and data the earlier stages left in
`--work`. Targets (issue 24): peak RSS under 2 GB at every stage and size; time per GB within 1.2x of time per 100 MB;
the first pre-training step within 30 s of start on 1 GB of shards. Run it alone on the machine: the stages
use every core, and a second heavy job slows both.

Usage:

    python benchmarks/corpus_scale.py --sizes 100,1000 --parquet 1000 --work /tmp/bertkit-scale
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pretraining_data import make_corpus  # the sibling benchmark's corpus maker

ROW_GROUP_DOCUMENTS = 10_000


def write_parquet(text_path: Path, parquet_path: Path) -> Path:
    """The documents of a blank-line-separated text file as Parquet rows ("text": the document's lines
    joined by line feeds), streamed in row groups so the conversion itself stays small."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([("text", pa.string())])
    with pq.ParquetWriter(parquet_path, schema) as writer, open(text_path, encoding="utf-8") as source:
        documents: list[str] = []
        lines: list[str] = []
        for line in source:
            line = line.strip()
            if line:
                lines.append(line)
                continue
            if lines:
                documents.append("\n".join(lines))
                lines = []
            if len(documents) >= ROW_GROUP_DOCUMENTS:
                writer.write_table(pa.table({"text": documents}, schema=schema))
                documents = []
        if lines:
            documents.append("\n".join(lines))
        if documents:
            writer.write_table(pa.table({"text": documents}, schema=schema))
    return parquet_path


class TreeMemory:
    """Peak RSS of a process and its descendants together, sampled every 0.2 s (psutil; None where it is
    missing): in all, and anonymous only (RSS less the file-backed pages: the memory-mapped shards' pages a
    process has touched are counted in its RSS, but they are the page cache's, shared and reclaimable)."""

    def __init__(self, pid: int) -> None:
        try:
            import psutil
        except ImportError:
            self.peak, self.peak_anonymous, self.thread = None, None, None
            return
        self.peak, self.peak_anonymous = 0, 0
        self.process, self.stop = psutil.Process(pid), threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()

    def _sample(self) -> None:
        import psutil

        while not self.stop.is_set():
            try:
                processes = [self.process, *self.process.children(recursive=True)]
            except psutil.Error:
                return
            total = anonymous = 0
            for process in processes:
                try:
                    memory = process.memory_info()
                except psutil.Error:
                    continue
                total += memory.rss
                anonymous += memory.rss - memory.shared  # shared: RssFile + RssShmem on Linux
            self.peak = max(self.peak or 0, total)
            self.peak_anonymous = max(self.peak_anonymous or 0, anonymous)
            self.stop.wait(0.2)

    def finish(self) -> tuple[int | None, int | None]:
        if self.thread is not None:
            self.stop.set()
            self.thread.join()
        return self.peak, self.peak_anonymous


def run_stage(name: str, args: list[str], log: Path, first_record: Path | None = None) -> dict:
    """Run `python -m bertkit ARGS` in a fresh interpreter (through a small wrapper that reports the largest
    descendant's ru_maxrss); returns wall time, peak RSS and, with `first_record`, the time to the first line
    of that file."""
    wrapper = ("import resource, subprocess, sys; code = subprocess.call(sys.argv[1:]); "
               "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); sys.exit(code)")
    command = [sys.executable, "-c", wrapper, sys.executable, "-m", "bertkit", *args]
    started = time.perf_counter()
    first = None
    with open(log, "w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.PIPE, text=True)
        memory = TreeMemory(process.pid)
        while process.poll() is None:
            if first_record is not None and first is None and first_record.is_file() and first_record.stat().st_size:
                first = time.perf_counter() - started
            time.sleep(0.05)
        stderr = process.stderr.read() if process.stderr else ""
    wall = time.perf_counter() - started
    tree, anonymous = memory.finish()
    out_lines = stderr.strip().splitlines()
    with open(log, "a") as out:
        out.write("\n".join(out_lines[:-1]) + "\n")
    if process.returncode != 0:
        raise SystemExit(f"{name} failed (exit {process.returncode}); see {log}:\n" + "\n".join(out_lines[-15:]))
    largest_kb = int(out_lines[-1])
    result = {"stage": name, "wall_s": round(wall, 1), "largest_process_mb": round(largest_kb / 1024),
              "tree_peak_mb": round(tree / 2**20) if tree else None,
              "tree_anonymous_peak_mb": round(anonymous / 2**20) if anonymous else None}
    if first_record is not None:
        result["first_step_s"] = round(first, 1) if first is not None else None
    return result


def pipeline(corpus: Path, label: str, work: Path, vocab_size: int, workers: int, text_mb: float,
             stages: set[str]) -> list[dict]:
    """The chosen stages on one corpus (a later stage alone reuses the earlier stages' output in `work`);
    each result carries the size of the corpus as text and of its file."""
    tokenizer, data, run = work / f"{label}-vocab", work / f"{label}-data", work / f"{label}-run"
    if "tokenizer" in stages:
        shutil.rmtree(tokenizer, ignore_errors=True)
    if "data" in stages:
        shutil.rmtree(data, ignore_errors=True)
    shutil.rmtree(run, ignore_errors=True)
    results = []
    if "tokenizer" in stages:
        results.append(run_stage("tokenizer train", ["tokenizer", "train", "--input", str(corpus), "--output",
                                                     str(tokenizer), "--vocab-size", str(vocab_size),
                                                     "--no-progress"], work / f"{label}-tok.log"))
    if "data" in stages:
        results.append(run_stage("data pretraining", ["data", "pretraining", "--input", str(corpus), "--tokenizer",
                                                      str(tokenizer), "--output", str(data), "--workers",
                                                      str(workers), "--masking", "dynamic", "--dupe-factor", "2",
                                                      "--quiet"], work / f"{label}-data.log"))
    if "pretrain" in stages:
        results.append(run_stage("pretrain (1 step)", ["pretrain", "--data", str(data), "--tokenizer",
                                                       str(tokenizer), "--model", "bert-mini", "--output", str(run),
                                                       "--max-steps", "1", "--device", "cpu", "--precision", "fp32"],
                                 work / f"{label}-pretrain.log", first_record=run / "metrics.jsonl"))
    shard_bytes = sum(p.stat().st_size for p in data.rglob("*") if p.is_file())
    manifest = json.loads((data / "manifest.json").read_text())
    instances = sum(entry["num_instances"] for entry in manifest["shards"])
    for result in results:
        result.update(corpus=label, text_mb=round(text_mb, 1), file_mb=round(corpus.stat().st_size / 1e6, 1))
        if result["stage"] != "tokenizer train":
            result.update(instances=instances, shards_mb=round(shard_bytes / 1e6))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100,1000", help="MB of text, comma-separated")
    parser.add_argument("--parquet", default="1000", help="MB of text to run as Parquet too, comma-separated")
    parser.add_argument("--work", type=Path, default=Path("/tmp/bertkit-scale"), help="scratch directory")
    parser.add_argument("--vocab-size", type=int, default=30522)
    parser.add_argument("--workers", type=int, default=os.cpu_count())
    parser.add_argument("--stages", default="tokenizer,data,pretrain",
                        help="stages to run, comma-separated; a later stage alone reuses the earlier ones' output")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    stages = set(args.stages.split(","))


    from bertkit.runtime import report

    print(report.header())
    args.work.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    parquet_sizes = {float(s) for s in args.parquet.split(",") if s}
    for size in (float(s) for s in args.sizes.split(",")):
        corpus = make_corpus(args.work, size)
        text_mb = corpus.stat().st_size / 1e6
        print(f"load average before {size:g} MB: {os.getloadavg()[0]:.2f}", flush=True)
        runs = [(corpus, f"text-{size:g}mb")]
        if size in parquet_sizes:
            runs.append((write_parquet(corpus, args.work / f"kjv-{size:g}mb.parquet"), f"parquet-{size:g}mb"))
        for path, label in runs:
            for row in pipeline(path, label, args.work, args.vocab_size, args.workers, text_mb, stages):
                print(json.dumps(row), flush=True)
                rows.append(row)
        for path, _ in runs:
            path.unlink()
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    print("\n| corpus | stage | wall | s per 100 MB of text | largest process | whole tree (anonymous) | first step |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        fixed = row["stage"].startswith("pretrain")  # its cost does not follow the text's size
        per_100 = "-" if fixed else f"{row['wall_s'] / row['text_mb'] * 100:.1f} s"
        tree = f"{row['tree_peak_mb']:,} MB ({row['tree_anonymous_peak_mb']:,} MB)" if row["tree_peak_mb"] else "-"
        first = f"{row['first_step_s']} s" if row.get("first_step_s") is not None else "-"
        print(f"| {row['corpus']} ({row['text_mb']:g} MB of text, file {row['file_mb']:g} MB) | {row['stage']} | "
              f"{row['wall_s']} s | {per_100} | {row['largest_process_mb']:,} MB | {tree} | {first} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
