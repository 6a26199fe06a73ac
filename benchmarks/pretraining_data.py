"""Benchmark: `bertkit data pretraining` vs a pure-Python reimplementation of the original script.

Both run on the bundled King James Bible (src/bertkit/assets/kjv/corpus.txt.gz: verses as lines,
chapters as documents), repeated to the requested size under /tmp, with the same settings
(the original's defaults: max_seq_length 128, dupe_factor 10, masked_lm_prob 0.15, static masks)
and the same vocabulary (trained here on the corpus). The reference is
tests/data/pretraining_reference.py: google-research/bert `create_pretraining_data.py` with its
pure-Python `FullTokenizer`, single process, everything in memory (the original's design); its
instance writing (TFRecord) is not timed, ours includes writing the shards.

Each side runs in a fresh process, so its peak RSS (ru_maxrss) is its own: for bertkit, the main
process and, separately, the largest worker. Throughput is MB of input text per second of wall time;
CPU time (user + system, bertkit's workers included) per MB is printed too, because on a shared
machine wall time depends on the load (the load average is printed before and after).

Usage (keep runs short on shared machines):

    python benchmarks/pretraining_data.py --ours-mb 50 --reference-mb 2 --workers 2

`--fill` measures something else (issue 24, docs/data.md "Packing (MLM-only)"): on --ours-mb of the
corpus, the instances, steps per epoch and real-token fill of NSP pairs (what `bertkit pretrain --no-nsp`
trained on before packing) and of each --no-nsp packing, all with dynamic masking and one pass:

    python benchmarks/pretraining_data.py --fill --ours-mb 10 --max-seq-length 128
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import multiprocessing
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def make_corpus(directory: Path, megabytes: float) -> Path:
    """The KJV corpus repeated (whole copies, then a prefix of documents) to about `megabytes`."""
    from bertkit.assets import kjv_path

    text = gzip.decompress(kjv_path("corpus.txt.gz").read_bytes())
    target = int(megabytes * 2**20)
    path = directory / f"kjv-{megabytes:g}mb.txt"
    with open(path, "wb") as f:
        written = 0
        while written + len(text) <= target:
            f.write(text if text.endswith(b"\n\n") else text.rstrip(b"\n") + b"\n\n")
            written += len(text)
        if written < target:
            cut = text.rfind(b"\n\n", 0, target - written)
            f.write(text[: max(cut, 0)] + b"\n\n")
    return path


def peak_rss_mb() -> tuple[float, float]:
    """(this process's peak RSS, its largest waited-for child's peak RSS) in MB."""
    return (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)


def cpu_seconds() -> float:
    """User + system CPU time of this process and its waited-for children."""
    usages = map(resource.getrusage, (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return sum(u.ru_utime + u.ru_stime for u in usages)


def run_ours(corpus: Path, vocab_dir: Path, workers: int, queue) -> None:
    from bertkit.data import InstanceSettings, build_pretraining_data
    from bertkit.settings import PretrainingDataSettings
    from bertkit.tokenizer import WordPieceTokenizer

    tokenizer = WordPieceTokenizer.from_pretrained(vocab_dir)
    output = Path(tempfile.mkdtemp(prefix="bertkit-bench-"))
    try:
        start, cpu = time.perf_counter(), cpu_seconds()
        manifest = build_pretraining_data(PretrainingDataSettings(
            (str(corpus),), "(in memory)", str(output), workers=workers, overwrite=True, quiet=True,
            instances=InstanceSettings()), tokenizer)
        seconds, cpu = time.perf_counter() - start, cpu_seconds() - cpu
    finally:
        shutil.rmtree(output)
    queue.put({"seconds": seconds, "cpu": cpu, "instances": manifest["num_instances"], "rss": peak_rss_mb()})


def run_reference(corpus: Path, vocab_dir: Path, queue) -> None:
    import random

    spec = importlib.util.spec_from_file_location("pretraining_reference", ROOT / "tests/data/pretraining_reference.py")
    reference = sys.modules.setdefault("pretraining_reference", importlib.util.module_from_spec(spec))
    spec.loader.exec_module(reference)
    with open(vocab_dir / "vocab.txt", encoding="utf-8") as handle:
        vocab = {line.rstrip("\n"): i for i, line in enumerate(handle)}
    tokenizer = reference.FullTokenizer(vocab)
    start, cpu = time.perf_counter(), cpu_seconds()
    instances = reference.create_training_instances([corpus], tokenizer, 128, 10, 0.1, 0.15, 20, random.Random(12345))
    seconds, cpu = time.perf_counter() - start, cpu_seconds() - cpu
    queue.put({"seconds": seconds, "cpu": cpu, "instances": len(instances), "rss": peak_rss_mb()})


def in_fresh_process(target, *args) -> dict:
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=target, args=(*args, queue))
    process.start()
    result = queue.get()
    process.join()
    return result


def fill_report(corpus: Path, vocab_dir: Path, max_seq_length: int, batch_size: int, workers: int) -> None:
    """Instances, steps per epoch and fill (tokens / positions) of NSP pairs and of each packing."""
    import numpy as np

    from bertkit.data import InstanceSettings, PretrainingDataset, build_pretraining_data
    from bertkit.settings import PACKINGS, PretrainingDataSettings
    from bertkit.tokenizer import WordPieceTokenizer

    tokenizer = WordPieceTokenizer.from_pretrained(vocab_dir)
    print(f"max_seq_length {max_seq_length}, batch {batch_size}; fill = tokens / positions, padded to "
          f"max_seq_length, or to each random batch's longest (as collate_pretraining pads)")
    print(f"{'data':<26}{'instances':>10}{'steps/epoch':>12}{'fill':>8}{'batch fill':>11}"
          f"{'tokens':>12}{'corpus tokens':>15}{'cut':>9}{'s':>6}")
    for packing in (None, *PACKINGS):
        options = InstanceSettings(max_seq_length=max_seq_length, masking="dynamic", dupe_factor=1,
                                         nsp=packing is None, packing=packing)
        with tempfile.TemporaryDirectory(prefix="bertkit-fill-") as output:
            start = time.perf_counter()
            manifest = build_pretraining_data(PretrainingDataSettings(
                (str(corpus),), "(in memory)", str(output), workers=workers, overwrite=True, quiet=True,
                instances=options), tokenizer)
            seconds = time.perf_counter() - start
            lengths = np.concatenate([np.diff(shard["offsets"]) for shard in PretrainingDataset(output).shards])
        batches = np.array_split(np.random.default_rng(0).permutation(lengths), -(-len(lengths) // batch_size))
        batch_fill = lengths.sum() / sum(len(b) * b.max() for b in batches)
        s = manifest["summary"]
        print(f"{packing or 'NSP pairs (before)':<26}{s['instances']:>10,}{-(-s['instances'] // batch_size):>12,}"
              f"{s['fill']:>8.3f}{batch_fill:>11.3f}{s['instance_tokens']:>12,}{s['sentence_tokens']:>15,}"
              f"{s['truncated_tokens']:>9,}{seconds:>6.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ours-mb", type=float, default=20.0, help="MB of text for bertkit")
    parser.add_argument("--reference-mb", type=float, default=1.0, help="MB of text for the reference (slow)")
    parser.add_argument("--workers", type=int, default=os.cpu_count(), help="bertkit worker processes")
    parser.add_argument("--vocab-size", type=int, default=8000, help="WordPiece vocabulary trained on the corpus")
    parser.add_argument("--skip-reference", action="store_true", help="only run bertkit (e.g. for a big RSS run)")
    parser.add_argument("--fill", action="store_true", help="report fill and steps per epoch of NSP pairs and "
                        "of each --no-nsp packing on --ours-mb of text, instead of the speed comparison")
    parser.add_argument("--max-seq-length", type=int, default=128, help="--fill: instance length")
    parser.add_argument("--batch-size", type=int, default=32, help="--fill: batch for steps per epoch")
    args = parser.parse_args()


    from bertkit.runtime import report
    from bertkit.tokenizer import WordPieceTokenizer

    print(report.header())
    with tempfile.TemporaryDirectory(prefix="bertkit-bench-") as tmp:
        tmp = Path(tmp)
        one_copy = make_corpus(tmp, 3.0)
        WordPieceTokenizer.train([one_copy], vocab_size=args.vocab_size).save_pretrained(tmp / "vocab")
        ours_corpus = make_corpus(tmp, args.ours_mb)
        if args.fill:
            fill_report(ours_corpus, tmp / "vocab", args.max_seq_length, args.batch_size, args.workers)
            return
        ours_mb = ours_corpus.stat().st_size / 1e6
        print(f"load average before: {os.getloadavg()[0]:.2f} ({os.cpu_count()} cores)")
        ours = in_fresh_process(run_ours, ours_corpus, tmp / "vocab", args.workers)
        ours_speed = ours_mb / ours["seconds"]
        print(f"bertkit   : {ours_mb:8.1f} MB in {ours['seconds']:7.1f} s = {ours_speed:7.2f} MB/s, "
              f"{ours['cpu'] / ours_mb:.3f} CPU-s/MB, {ours['instances']:,} instances, peak RSS main "
              f"{ours['rss'][0]:.0f} MB, largest worker {ours['rss'][1]:.0f} MB ({args.workers} workers)")
        if not args.skip_reference:
            ref_corpus = make_corpus(tmp, args.reference_mb)
            ref_mb = ref_corpus.stat().st_size / 1e6
            ref = in_fresh_process(run_reference, ref_corpus, tmp / "vocab")
            ref_speed = ref_mb / ref["seconds"]
            print(f"reference : {ref_mb:8.1f} MB in {ref['seconds']:7.1f} s = {ref_speed:7.2f} MB/s, "
                  f"{ref['cpu'] / ref_mb:.3f} CPU-s/MB, {ref['instances']:,} instances, peak RSS "
                  f"{ref['rss'][0]:.0f} MB (1 process, all in memory)")
            print(f"speed-up  : {ours_speed / ref_speed:.1f}x wall-clock, "
                  f"{(ref['cpu'] / ref_mb) / (ours['cpu'] / ours_mb):.1f}x per CPU-second")
        print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
