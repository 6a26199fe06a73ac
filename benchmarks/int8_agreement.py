"""int8 on a fine-tuned classifier or tagger (issue 30, item 4; issue 40): how many labels int8 keeps, and how fast
it is.

    python benchmarks/int8_agreement.py --model FINETUNED_DIR --input test.tsv [--onnx] [--calibration SAMPLE.txt]
    python benchmarks/int8_agreement.py --model TAGGER_DIR --input test.conll --calibration SAMPLE.txt

A tagger's labels are its words' tags (every word of the CoNLL file, read as `bertkit evaluate` reads it); the
ONNX Runtime rows are for classifiers only.

Labels every row of `--input` (a TSV/CSV/JSONL with a text and a label column) with the classifier in
bertkit fp32 (the reference), bertkit int8 (`--precision int8`: oneDNN's int8 kernel, `Int8Linear`), with
`--calibration` bertkit int8 with SmoothQuant's scales measured on that sample (`--precision int8
--calibration`, on a copy of the model so the plain int8 run never sees kept scales) and ONNX Runtime's
calibrated static int8 (`onnxruntime.quantization.quantize_static` on the exported graph, per-channel
weights, activations calibrated by MinMax on the same sample), and with `--onnx` ONNX Runtime on `bertkit
export onnx --optimize --quantize int8` (its fused graph with dynamic int8 weights), in batches of 32
padded to the longest. Printed per engine: accuracy, the share of
fp32's labels kept (all rows, and the rows where fp32 is not torn between two labels), the largest
change of a probability, and rows/s (each engine timed on its own after a warm-up batch; ONNX Runtime last, so
its thread pool does not slow torch).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime
import torch

from bertkit.config import BertConfig
from bertkit.data.conll import read_conll
from bertkit.data.glue import read_table
from bertkit.export.onnx import export_onnx, sample_batch
from bertkit.inference.smoothquant import SMOOTHING_FILE
from bertkit.runtime import report
from bertkit.serve.predictor import load_predictor
from bertkit.settings import ExportSettings, ServeSettings
from bertkit.tasks.finetuned import read_task_file
from bertkit.tokenizer import WordPieceTokenizer

MARGIN = 0.05  # a row whose two likeliest labels are closer than this is a coin toss for any precision


def bertkit_labels(model: Path, texts: list[str], precision: str, batch_size: int,
                   calibration: Path | None = None) -> tuple[list[str], float, list]:
    """(labels, seconds, each row's probabilities in label order)."""
    predictor = load_predictor(ServeSettings(model, precision=precision, calibration=calibration), batch_size)
    predictor.classify(texts[:batch_size])  # warm-up
    start = time.perf_counter()
    rows = predictor.classify(texts)
    seconds = time.perf_counter() - start
    return [row["label"] for row in rows], seconds, [sorted(row["probabilities"].items()) for row in rows]


def bertkit_tags(model: Path, sentences: list, precision: str, batch_size: int,
                 calibration: Path | None = None) -> tuple[list[str], float, list]:
    """A tagger's (tag of every word, seconds, every word's probabilities in label order)."""
    predictor = load_predictor(ServeSettings(model, precision=precision, calibration=calibration), batch_size)
    task = predictor.task
    predictor.task_outputs(task, task.features(sentences[:batch_size], predictor.tokenizer))  # warm-up
    start = time.perf_counter()
    features = task.features(sentences, predictor.tokenizer)
    outputs = predictor.task_outputs(task, features)
    seconds = time.perf_counter() - start
    words: list[list] = [[None] * len(s.words) for s in sentences]
    for feature, logits in zip(features, outputs["logits"]):
        probabilities = torch.softmax(torch.as_tensor(logits, dtype=torch.float64), dim=-1).numpy()
        for position, word in enumerate(feature["word_positions"]):
            if word is not None:
                words[feature["sentence_index"]][word] = probabilities[position]
    rows = [row for sentence in words for row in sentence]
    labels = [task.settings.labels[int(np.argmax(row))] for row in rows]
    return labels, seconds, [list(enumerate(row)) for row in rows]


def margins(probabilities: list) -> np.ndarray:
    """Each row's gap between its two highest probabilities."""
    top = np.sort(np.array([[p for _, p in row] for row in probabilities]), axis=1)
    return top[:, -1] - top[:, -2]


def onnx_labels(model: Path, texts: list[str], batch_size: int, threads: int, work: Path,
                calibration: list[str] | None = None) -> tuple[list[str], float, None]:
    """ONNX Runtime's labels: the fused graph with dynamic int8 weights, or with `calibration` texts the plain
    graph statically quantized (activations calibrated on them)."""
    if calibration is None:
        report = export_onnx(ExportSettings(model=model, output=work / "onnx", quantize="int8", optimize=True))
        print("ONNX Runtime graph:", "; ".join(report.lines()[:3]))
        graph = report.path
    else:
        report = export_onnx(ExportSettings(model=model, output=work / "onnx"))
        graph = _static_int8(report.path, WordPieceTokenizer.from_pretrained(work / "onnx"), calibration, work)
    tokenizer = WordPieceTokenizer.from_pretrained(work / "onnx")
    id2label = BertConfig.from_json_file(work / "onnx" / "config.json").id2label or {}
    batches = [sample_batch(tokenizer, texts[i:i + batch_size], "BertForSequenceClassification")
               for i in range(0, len(texts), batch_size)]
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    session = onnxruntime.InferenceSession(str(graph), options, providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}

    def run(batch: dict) -> np.ndarray:
        return session.run(None, {k: v.numpy() for k, v in batch.items() if k in names})[0]
    run(batches[0])  # warm-up
    start = time.perf_counter()
    logits = np.concatenate([run(batch) for batch in batches])
    seconds = time.perf_counter() - start
    return [id2label.get(int(i), str(int(i))) for i in logits.argmax(-1)], seconds, None


def _static_int8(graph: Path, tokenizer: WordPieceTokenizer, texts: list[str], work: Path) -> Path:
    """ONNX Runtime's calibrated static int8 of `graph`: QDQ, per-channel int8 weights, uint8 activations
    whose ranges MinMax calibration measured on `texts` (one at a time, so no padding enters the ranges)."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Sample(CalibrationDataReader):
        def __init__(self) -> None:
            self.rows = iter([{k: v.numpy() for k, v in sample_batch(tokenizer, [t], "BertForSequenceClassification")
                               .items()} for t in texts])

        def get_next(self) -> dict | None:
            return next(self.rows, None)

    output = work / "static-int8.onnx"
    quantize_static(str(graph), str(output), Sample(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    return output


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True, help="a fine-tuned classification directory")
    parser.add_argument("--input", type=Path, required=True, help="labelled rows: text and label columns")
    parser.add_argument("--text-column", default="text")
    parser.add_argument("--label-column", default="label")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--onnx", action="store_true", help="also ONNX Runtime's fused int8 graph")
    parser.add_argument("--calibration", type=Path, help="a sample of inputs, one per line: also bertkit int8 with "
                        "SmoothQuant and ONNX Runtime's calibrated static int8")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = BertConfig.from_json_file(args.model / "config.json")
    print(report.header(config.hidden_size))
    tagger = (read_task_file(args.model) or {}).get("task") == "tagging"
    if tagger:
        texts = read_conll(args.input)  # for a tagger, the sentences; each word is a row below
        gold = [label for sentence in texts for label in sentence.labels or []]
        run = bertkit_tags
    else:
        examples, _ = read_table(args.input, args.text_column, label_column=args.label_column)
        texts, gold, run = [e.text for e in examples], [e.label for e in examples], bertkit_labels
    print(f"# {args.model} ({config.num_hidden_layers} layers, width {config.hidden_size}), {len(texts)} "
          f"{'sentences' if tagger else 'rows'} of {args.input}, batches of {args.batch_size}, {args.threads} threads")
    results = {}
    reference, seconds, probabilities = run(args.model, texts, "fp32", args.batch_size)
    results["bertkit fp32"] = (reference, seconds, probabilities)
    confident = margins(probabilities) >= MARGIN
    with tempfile.TemporaryDirectory() as work:
        copy = Path(work) / "model"  # each int8 run on a copy: plain int8 never sees kept scales, and new ones
        shutil.copytree(args.model, copy)  # land in the copy, not in the user's directory
        (copy / SMOOTHING_FILE).unlink(missing_ok=True)
        results["bertkit int8"] = run(copy, texts, "int8", args.batch_size)
        if args.calibration:
            results["bertkit int8 + SmoothQuant"] = run(copy, texts, "int8", args.batch_size, args.calibration)
    if tagger:
        pass  # ONNX Runtime's rows below read a classifier's graph
    elif args.calibration:
        sample = [line for line in args.calibration.read_text().splitlines() if line.strip()][:512]
        with tempfile.TemporaryDirectory() as work:
            results["ONNX Runtime static int8 (calibrated)"] = onnx_labels(args.model, texts, args.batch_size,
                                                                          args.threads, Path(work), sample)
    if args.onnx and not tagger:
        with tempfile.TemporaryDirectory() as work:
            results["ONNX Runtime int8 (fused)"] = onnx_labels(args.model, texts, args.batch_size, args.threads,
                                                               Path(work))
    print(f"| engine | accuracy | labels kept vs fp32 | kept where fp32's top two differ by >= {MARGIN} "
          f"({100 * confident.mean():.0f}% of rows) | max probability change | rows/s | vs bertkit fp32 |")
    print("|---|---|---|---|---|---|---|")
    table = {}
    for name, (labels, took, probs) in results.items():
        accuracy = float(np.mean([a == b for a, b in zip(labels, gold)]))
        same = np.array([a == b for a, b in zip(labels, reference)])
        change = (np.abs(np.array([[p for _, p in r] for r in probs]) -
                         np.array([[p for _, p in r] for r in probabilities])).max() if probs else float("nan"))
        table[name] = {"accuracy": accuracy, "kept": float(same.mean()),
                       "kept_confident": float(same[confident].mean()), "max_probability_change": float(change),
                       "rows_per_s": len(texts) / took}
        print(f"| {name} | {100 * accuracy:.1f}% | {100 * same.mean():.1f}% | {100 * same[confident].mean():.1f}% | "
              f"{change:.3f} | {len(texts) / took:.1f} | {seconds / took:.2f}x |")
    if tagger:
        print(f"(a row is a word: {len(gold)} words; rows/s counts sentences)")
    print(json.dumps(table))


if __name__ == "__main__":
    main()
