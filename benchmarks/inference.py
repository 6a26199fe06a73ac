"""Inference throughput: bertkit's BertModel vs transformers' BertModel, same weights, one process.

    python benchmarks/inference.py                      # bert-base shape, fp32 and bf16, varied + full-length
    python benchmarks/inference.py --precision bf16 --batches 20 --rounds 3
    python benchmarks/inference.py --precision int8 --kind varied   # both sides dynamically quantized

Inputs are batches of 32 real sentences (verses of the bundled King James Bible, in corpus order,
tokenized with Google's bert-base-uncased vocabulary), padded to the longest in the batch as a
transformers user would; "full" batches are 32 x 128 windows of running text (no padding at all).
Both models run the same batch back to back, alternating which goes first, and the per-batch time
ratio is reported as a median (robust when the machine is shared). Achieved TFLOP/s counts the
model's useful FLOPs on real tokens (dense 24*D^2 per token per layer + attention 4*D per token pair)
against a measured matrix-multiply peak of the same dtype on the same machine (the faster of
`torch.mm` and oneDNN with a prepacked weight). int8 quantizes the dense layers of both encoders the
same way (oneDNN's int8 kernel, int8 weights per output channel, activations quantized per call:
`bertkit.model.accelerate.quantize_linear_layers`, the `Int8Linear` that `--precision int8` runs) and is
set against the fp32 peak. The header is `bertkit doctor`'s.
"""

from __future__ import annotations

import argparse
import gzip
import statistics
from pathlib import Path

import torch
import transformers
from peak import matmul_peak, timed

from bertkit.assets import kjv_path
from bertkit.config import preset
from bertkit.model import BertModel, for_inference
from bertkit.model.accelerate import quantize_linear_layers
from bertkit.model.hf_names import to_hf
from bertkit.runtime import report
from bertkit.tokenizer import WordPieceTokenizer

VOCAB = Path(__file__).resolve().parents[1] / "tests" / "assets" / "vocab" / "bert-base-uncased"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "int8": torch.float32}  # int8: fp32 activations


def sentences() -> list[str]:
    with gzip.open(kjv_path("corpus.txt.gz"), "rt", encoding="utf-8") as handle:
        return [line for line in handle.read().splitlines() if line]


def varied_batches(tokenizer, texts, count, batch_size=32, max_length=128):
    batches = []
    for b in range(count):
        encodings = tokenizer.encode_batch(texts[b * batch_size:(b + 1) * batch_size], max_length=max_length)
        longest = max(len(e.input_ids) for e in encodings)
        ids = torch.zeros(batch_size, longest, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, encoding in enumerate(encodings):
            ids[row, :len(encoding.input_ids)] = torch.tensor(encoding.input_ids)
            mask[row, :len(encoding.input_ids)] = 1
        batches.append((ids, mask))
    return batches


def full_batches(tokenizer, texts, count, batch_size=32, seq_len=128):
    stream = [i for ids in tokenizer.encode_ids(texts[:20000]) for i in ids]
    body = seq_len - 2
    batches = []
    for b in range(count):
        rows = [[tokenizer.cls_token_id, *stream[(b * batch_size + r) * body:(b * batch_size + r + 1) * body],
                 tokenizer.sep_token_id] for r in range(batch_size)]
        ids = torch.tensor(rows)
        batches.append((ids, torch.ones_like(ids)))
    return batches


def useful_flops(mask: torch.Tensor, hidden: int, layers: int) -> float:
    lengths = mask.sum(1).double()
    dense = 24 * hidden ** 2 * lengths.sum()
    attention = 4 * hidden * (lengths ** 2).sum()
    return float(layers * (dense + attention))


def run(shape: str, precision: str, kind: str, count: int, rounds: int, tokenizer, texts) -> dict:
    torch.manual_seed(0)
    config = preset(shape, vocab_size=tokenizer.vocab_size)
    ours = BertModel(config).eval()
    theirs = transformers.BertModel(transformers.BertConfig(**config.to_dict())).eval()
    theirs.load_state_dict(to_hf(ours.state_dict()))
    ours = for_inference(ours, precision)
    if precision == "int8":
        quantize_linear_layers(theirs.encoder)  # every dense layer of the encoder, as bertkit's
    else:
        theirs.to(DTYPES[precision])
    batches = (varied_batches if kind == "varied" else full_batches)(tokenizer, texts, count)
    ratios, times = [], {"bertkit": 0.0, "transformers": 0.0}
    tokens = flops = 0.0
    with torch.inference_mode():
        ours(*batches[0][:1], attention_mask=batches[0][1])  # warm-up
        theirs(input_ids=batches[0][0], attention_mask=batches[0][1])
        for r in range(rounds):
            for i, (ids, mask) in enumerate(batches):
                # Both lambdas are called within this iteration, so the loop variables are the current ones.
                runs = [("bertkit", lambda: ours(ids, attention_mask=mask)),  # noqa: B023
                        ("transformers", lambda: theirs(input_ids=ids, attention_mask=mask))]  # noqa: B023
                if (i + r) % 2:
                    runs.reverse()
                elapsed = {name: timed(fn) for name, fn in runs}
                for name, seconds in elapsed.items():
                    times[name] += seconds
                ratios.append(elapsed["transformers"] / elapsed["bertkit"])
                tokens += float(mask.sum())
                flops += useful_flops(mask, config.hidden_size, config.num_hidden_layers)
    fill = sum(float(m.sum()) for _, m in batches) / sum(m.numel() for _, m in batches)
    return {"precision": precision, "batches": kind, "fill": fill,
            "bertkit tok/s": tokens / times["bertkit"], "transformers tok/s": tokens / times["transformers"],
            "ratio (median)": statistics.median(ratios),
            "bertkit TFLOP/s": flops / times["bertkit"] / 1e12}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="bert-base", help="model preset")
    parser.add_argument("--precision", choices=["fp32", "bf16", "int8", "both"], default="both",
                        help="both: fp32 and bf16")
    parser.add_argument("--kind", choices=["varied", "full", "both"], default="both")
    parser.add_argument("--batches", type=int, default=12, help="batches of 32 per measurement")
    parser.add_argument("--rounds", type=int, default=2, help="passes over the batches")
    args = parser.parse_args()
    tokenizer = WordPieceTokenizer.from_pretrained(VOCAB)
    texts = sentences()
    precisions = ["fp32", "bf16"] if args.precision == "both" else [args.precision]
    kinds = ["varied", "full"] if args.kind == "both" else [args.kind]
    print(report.header(preset(args.shape).hidden_size))
    print(f"# transformers {transformers.__version__}, shape {args.shape}")
    peaks = {p: matmul_peak(DTYPES[p]) for p in precisions}
    print("| precision | batches | fill | bertkit tok/s | transformers tok/s | ratio (median) | bertkit TFLOP/s | "
          "matmul peak TFLOP/s | % of peak |")
    print("|---|---|---|---|---|---|---|---|---|")
    for precision in precisions:
        for kind in kinds:
            row = run(args.shape, precision, kind, args.batches, args.rounds, tokenizer, texts)
            peak = peaks[precision]
            print(f"| {precision} | {kind} | {row['fill']:.2f} | {row['bertkit tok/s']:.0f} | "
                  f"{row['transformers tok/s']:.0f} | {row['ratio (median)']:.2f}x | {row['bertkit TFLOP/s']:.3f} | "
                  f"{peak:.3f} | {100 * row['bertkit TFLOP/s'] / peak:.0f}% |", flush=True)


if __name__ == "__main__":
    main()
