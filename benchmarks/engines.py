"""Inference throughput against the engines users deploy on CPUs: ONNX Runtime and OpenVINO (issue 30).

    python benchmarks/engines.py                          # bert-base shape, 2 threads, every engine found
    python benchmarks/engines.py --model bert-mini --batches 4 --engines bertkit-fp32,ort-fp32

The contenders are optional: `pip install -e ".[bench]"` installs onnxruntime and openvino; an engine whose
package is missing is skipped and named.

Contenders, each set up as its own documentation recommends for BERT:
- bertkit fp32, bf16 and int8: `for_inference` (padding-free, the measured CPU kernels; int8: oneDNN's int8
  kernel with per-row activation scales, `Int8Linear`), inputs as given.
- transformers fp32 (`BertModel`, SDPA), the eager baseline of the other benchmarks.
- ort-fp32: transformers' BertModel exported to ONNX with eager attention, then ONNX Runtime's transformer
  optimizer (`optimize_model(model_type="bert", num_heads, hidden_size)`, which fuses Attention,
  SkipLayerNormalization, BiasGelu, EmbedLayerNormalization; the fused-op counts are printed), run by an
  InferenceSession with intra_op_num_threads = --threads.
- ort-int8: that fused graph with ONNX Runtime's dynamic quantization (`quantize_dynamic`, QInt8 weights).
- openvino / openvino-bf16: OpenVINO (pip `openvino`) compiling the exported (unfused) ONNX graph for the
  CPU with INFERENCE_NUM_THREADS = --threads and the LATENCY hint (one stream, like the others): its default
  precision, and INFERENCE_PRECISION_HINT bf16 (f32 on CPUs without bf16 instructions).

Every engine runs in a process of its own (OpenVINO's and ONNX Runtime's thread pools slow torch in the same
process), every one under the glibc malloc thresholds bertkit sets for itself (`bertkit.runtime.allocator`, given
here as MALLOC_MMAP_THRESHOLD_ and MALLOC_TRIM_THRESHOLD_, so they are no edge of bertkit's), on the same
batches: "varied" (32 real KJV verses padded to the longest, as a user's traffic) and
"full" (32 x 128 windows of running text, no padding); the first batch is a warm-up. bertkit fp32 runs first
and last as the reference: ratios are against the mean of those two runs, which brackets the others in time
(a shared machine's load drifts). Printed: tokens/s (real tokens), the ratio, and the largest difference of
the last hidden state (real positions) from transformers fp32 on the first batch.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ENGINES = ("bertkit-fp32", "bertkit-bf16", "bertkit-int8", "transformers-fp32", "ort-fp32", "ort-int8", "openvino",
           "openvino-bf16")
HERE = Path(__file__).resolve().parent


def batches(model_name: str, count: int) -> dict[str, list[tuple[list[list[int]], list[list[int]]]]]:
    """{'varied': [...], 'full': [...]}: (input_ids, attention_mask) as lists, the same for every process."""
    sys.path.insert(0, str(HERE))
    from bertkit.tokenizer import WordPieceTokenizer
    from inference import VOCAB, full_batches, sentences, varied_batches

    tokenizer = WordPieceTokenizer.from_pretrained(VOCAB)
    texts = sentences()
    return {kind: [(ids.tolist(), mask.tolist()) for ids, mask in make(tokenizer, texts, count)]
            for kind, make in (("varied", varied_batches), ("full", full_batches))}


def build_checkpoint(model_name: str, directory: Path) -> None:
    """Random weights (seed 0) of the preset's shape, as a save_pretrained directory every engine reads."""
    import torch

    from bertkit.config import preset
    from bertkit.model import BertModel

    torch.manual_seed(0)
    BertModel(preset(model_name, vocab_size=30522)).save_pretrained(directory)


def export_onnx(directory: Path, num_heads: int, hidden: int, work: Path) -> dict:
    """transformers' BertModel (eager attention) -> ONNX -> ORT-fused fp32 and dynamic int8 graphs."""
    import onnx
    import torch
    import transformers
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.transformers.optimizer import optimize_model

    class LastHiddenState(torch.nn.Module):  # named inputs, one output, whatever forward's signature is
        def __init__(self) -> None:
            super().__init__()
            self.bert = transformers.BertModel.from_pretrained(directory, attn_implementation="eager").eval()

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.bert(input_ids=input_ids, attention_mask=attention_mask,
                             token_type_ids=token_type_ids).last_hidden_state

    ids = torch.ones(2, 16, dtype=torch.long)
    plain = work / "model.onnx"
    torch.onnx.export(LastHiddenState(), (ids, torch.ones_like(ids), torch.zeros_like(ids)), str(plain),
                      input_names=["input_ids", "attention_mask", "token_type_ids"],
                      output_names=["last_hidden_state"], opset_version=17, dynamo=False,
                      dynamic_axes={name: {0: "batch", 1: "sequence"} for name in
                                    ("input_ids", "attention_mask", "token_type_ids", "last_hidden_state")})
    optimized = optimize_model(str(plain), model_type="bert", num_heads=num_heads, hidden_size=hidden, opt_level=1)
    fused = {k: v for k, v in optimized.get_fused_operator_statistics().items() if v}
    optimized.save_model_to_file(str(work / "fused.onnx"))
    # The fused graph's contrib ops have no shape inference: the float type of their outputs is stated.
    quantize_dynamic(str(work / "fused.onnx"), str(work / "int8.onnx"), weight_type=QuantType.QInt8,
                     extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    return fused


def child(engine: str, args: argparse.Namespace) -> dict:
    """Time one engine on the batches in the work directory; its own process."""
    import numpy as np
    import torch

    torch.set_num_threads(args.threads)
    work = Path(args.work)
    data = json.loads((work / "batches.json").read_text())
    directory = work / "checkpoint"
    run = make_runner(engine, directory, work, args.threads)
    result: dict = {"engine": engine}
    for kind, items in data.items():
        arrays = [(np.array(ids, dtype=np.int64), np.array(mask, dtype=np.int64)) for ids, mask in items]
        first = run(*arrays[0])  # warm-up, and the output compared with transformers'
        np.save(work / f"{engine}-{kind}.npy", first)
        started = time.perf_counter()
        for ids, mask in arrays[1:]:
            run(ids, mask)
        seconds = time.perf_counter() - started
        tokens = sum(int(mask.sum()) for _, mask in arrays[1:])
        result[kind] = {"tokens_per_s": tokens / seconds, "seconds": seconds, "batches": len(arrays) - 1}
    return result


def make_runner(engine: str, directory: Path, work: Path, threads: int):
    """A function (input_ids, attention_mask) -> last hidden state as a float32 numpy array."""
    import numpy as np
    import torch

    if engine.startswith(("bertkit", "transformers")):
        if engine.startswith("bertkit"):
            from bertkit.model import BertModel, for_inference

            model = for_inference(BertModel.from_pretrained(directory), engine.split("-")[1])
        else:
            import transformers

            model = transformers.BertModel.from_pretrained(directory).eval()

        def run_torch(ids, mask):
            with torch.inference_mode():
                out = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask))
            return out.last_hidden_state.float().numpy()
        return run_torch
    if engine.startswith("ort"):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        name = "fused.onnx" if engine == "ort-fp32" else "int8.onnx"
        session = ort.InferenceSession(str(work / name), options, providers=["CPUExecutionProvider"])

        def run_ort(ids, mask):
            return session.run(None, {"input_ids": ids, "attention_mask": mask,
                                      "token_type_ids": np.zeros_like(ids)})[0]
        return run_ort
    import openvino as ov

    config = {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY"}
    if engine == "openvino-bf16":
        config["INFERENCE_PRECISION_HINT"] = "bf16"
    compiled = ov.Core().compile_model(str(work / "model.onnx"), "CPU", config)

    def run_openvino(ids, mask):
        outputs = compiled({"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)})
        return np.asarray(outputs[compiled.output(0)], dtype=np.float32)
    return run_openvino


def available(engine: str) -> str | None:
    """None when the engine can run here, else why not."""
    import importlib.util

    needs = {"ort": "onnxruntime", "openvino": "openvino"}
    module = next((m for prefix, m in needs.items() if engine.startswith(prefix)), None)
    if module and importlib.util.find_spec(module) is None:
        return f"{module} is not installed (pip install {module})"
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="bert-base")
    parser.add_argument("--batches", type=int, default=6, help="batches of each kind, the first a warm-up")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args)))
        return
    import numpy as np

    from bertkit.config import preset
    from bertkit.runtime import probe, report
    from bertkit.runtime.allocator import THRESHOLD

    print(f"# machine: {probe.machine().line()}")
    print(f"# matrix extensions: {report.matrix_extensions(probe.machine().flags)}")
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    unknown = set(engines) - set(ENGINES)
    if unknown:
        raise SystemExit(f"unknown engine(s) {sorted(unknown)}; choose from {', '.join(ENGINES)}")
    config = preset(args.model, vocab_size=30522)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        build_checkpoint(args.model, work / "checkpoint")
        (work / "batches.json").write_text(json.dumps(batches(args.model, args.batches)))
        if any(e.startswith(("ort", "openvino")) for e in engines):
            fused = export_onnx(work / "checkpoint", config.num_attention_heads, config.hidden_size, work)
            print(f"# ONNX Runtime fusion (opt_level 1): {fused}")
        order = ["bertkit-fp32", *[e for e in engines if e != "bertkit-fp32"], "bertkit-fp32"]
        results: list[dict] = []
        for engine in order:
            reason = available(engine)
            if reason:
                print(f"# {engine}: skipped, {reason}")
                continue
            # every engine under the same glibc malloc settings bertkit sets for itself (bertkit.runtime.allocator)
            env = {**os.environ, "OMP_NUM_THREADS": str(args.threads),
                   "MALLOC_MMAP_THRESHOLD_": str(THRESHOLD), "MALLOC_TRIM_THRESHOLD_": str(THRESHOLD)}
            command = [sys.executable, __file__, "--child", engine, "--work", str(work), "--threads",
                       str(args.threads)]
            done = subprocess.run(command, capture_output=True, text=True, env=env)
            if done.returncode != 0:
                print(f"# {engine}: failed: {done.stderr.strip().splitlines()[-1] if done.stderr else done.returncode}")
                continue
            results.append(json.loads(done.stdout.strip().splitlines()[-1]))
        reference = {kind: np.mean([r[kind]["tokens_per_s"] for r in results if r["engine"] == "bertkit-fp32"])
                     for kind in ("varied", "full")}
        baseline = {kind: np.load(work / f"transformers-fp32-{kind}.npy") if "transformers-fp32" in engines else None
                    for kind in ("varied", "full")}
        masks = {kind: np.array(json.loads((work / "batches.json").read_text())[kind][0][1], dtype=bool)
                 for kind in ("varied", "full")}
        print(f"\n{args.model}, batches of 32, {args.threads} threads, {args.batches - 1} timed batches of each kind "
              "after a warm-up, each engine in its own process; ratio against bertkit fp32 (mean of its first and "
              "last run)\n")
        print("| engine | varied tok/s | ratio | full tok/s | ratio | max abs diff vs transformers fp32 (varied) |")
        print("|---|---|---|---|---|---|")
        seen = set()
        for result in results:
            engine = result["engine"]
            label = engine + (" (last)" if engine in seen else "")
            seen.add(engine)
            diff = ""
            if baseline["varied"] is not None:
                ours = np.load(work / f"{engine}-varied.npy")
                diff = f"{np.abs(ours - baseline['varied'])[masks['varied']].max():.2e}"
            cells = [f"{result[k]['tokens_per_s']:,.0f} | {result[k]['tokens_per_s'] / reference[k]:.2f}x"
                     for k in ("varied", "full")]
            print(f"| {label} | {cells[0]} | {cells[1]} | {diff} |")


if __name__ == "__main__":
    main()
