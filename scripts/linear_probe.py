"""A cheap screen of pre-training levers: logistic regression on a frozen encoder's features, per layer.

    python scripts/linear_probe.py --task /tmp/gcide --model RUN/final --max-seq-length 128
    python scripts/linear_probe.py --task /tmp/gcide --random bert-mini --tokenizer RUN/vocab --seed 0

`--task` is a classification folder with train.jsonl and test.jsonl (rows {"text", "label"}, as written by
scripts/gcide_task_data.py). Every layer's hidden states (the embeddings are layer 0) are pooled two ways, the
mean over the tokens and the [CLS] vector; each is standardised on the training rows and read by a logistic
regression (scikit-learn, C=1), scored on the test rows. One line per model:

    NAME L0mean=29.5 L0cls=19.0 L1mean=28.0 ...

and, with `--results FILE`, one JSON row appended. The probe fits in about a minute on one CPU thread, where a
fine-tuning study of one model takes half an hour, so it screens pre-training levers before the study; it is a
screen, not the study's measure (docs/pretraining.md says how far it agreed with fine-tuning).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import numpy as np
import torch
from sklearn.linear_model import LogisticRegression

from bertkit.config import preset
from bertkit.inference.batching import sorted_batches
from bertkit.inference.pooling import pool
from bertkit.model import BertModel
from bertkit.tokenizer import WordPieceTokenizer


def read_rows(path: Path) -> tuple[list[str], list[str]]:
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [row["text"] for row in rows], [str(row["label"]) for row in rows]


def load_encoder(args: argparse.Namespace) -> tuple[BertModel, WordPieceTokenizer]:
    """bertkit's encoder of --model, or a randomly initialised --random preset with --tokenizer's vocabulary."""
    tokenizer = WordPieceTokenizer.from_pretrained(args.tokenizer or args.model)
    if args.model:
        return BertModel.from_pretrained(args.model), tokenizer
    config = dataclasses.replace(preset(args.random), vocab_size=len(tokenizer.vocab))
    return BertModel(config), tokenizer


@torch.no_grad()
def features(model: BertModel, tokenizer: WordPieceTokenizer, texts: list[str], length: int) -> np.ndarray:
    """(examples, layers + 1, 2 x hidden): each layer's token mean and [CLS] vector (bertkit's pooling)."""
    encodings = tokenizer.encode_batch(texts, max_length=length)
    rows = [{"input_ids": e.input_ids, "token_type_ids": e.token_type_ids, "attention_mask": e.attention_mask}
            for e in encodings]
    out = np.zeros((len(texts), model.config.num_hidden_layers + 1, 2 * model.config.hidden_size), np.float32)
    for indices, batch in sorted_batches(rows, 64, tokenizer.pad_token_id):
        states = model(**batch, output_hidden_states=True).hidden_states  # the embeddings first
        mask = batch["attention_mask"]
        pooled = torch.stack([torch.cat([pool(h, mask, "mean"), pool(h, mask, "cls")], -1) for h in states], 1)
        out[indices] = pooled.numpy()
    return out


def probe(train: np.ndarray, train_labels: list[str], test: np.ndarray, test_labels: list[str]) -> float:
    """Test accuracy (points) of a logistic regression on standardised features."""
    mean, std = train.mean(0), train.std(0) + 1e-6
    classifier = LogisticRegression(C=1.0, max_iter=3000).fit((train - mean) / std, train_labels)
    return 100.0 * classifier.score((test - mean) / std, test_labels)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", type=Path, required=True, help="Folder with train.jsonl and test.jsonl.")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", type=Path, help="A model directory (RUN/final).")
    source.add_argument("--random", help="A preset, randomly initialised (needs --tokenizer).")
    parser.add_argument("--tokenizer", type=Path, help="Vocabulary directory (default: --model).")
    parser.add_argument("--max-seq-length", type=int, default=128)
    parser.add_argument("--name", help="Label of the output line (default: the run directory's name).")
    parser.add_argument("--seed", type=int, default=0, help="Seed of a --random model's initialisation.")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--results", type=Path, help="JSONL file a result row is appended to.")
    args = parser.parse_args()
    if args.random and not args.tokenizer:
        parser.error("--random needs --tokenizer")
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    model, tokenizer = load_encoder(args)
    model.eval()
    train_texts, train_labels = read_rows(args.task / "train.jsonl")
    test_texts, test_labels = read_rows(args.task / "test.jsonl")
    train = features(model, tokenizer, train_texts, args.max_seq_length)
    test = features(model, tokenizer, test_texts, args.max_seq_length)
    width = train.shape[-1] // 2
    scores = {}
    for layer in range(train.shape[1]):
        for pooling, part in (("mean", slice(0, width)), ("cls", slice(width, 2 * width))):
            scores[f"L{layer}{pooling}"] = round(probe(train[:, layer, part], train_labels,
                                                       test[:, layer, part], test_labels), 1)
    name = args.name or (args.model.parent.name if args.model else f"random-{args.random}")
    print(name, " ".join(f"{key}={value:.1f}" for key, value in scores.items()), flush=True)
    if args.results:
        row = {"name": name, "model": str(args.model or args.random), "task": str(args.task),
               "max_seq_length": args.max_seq_length, "probe": scores}
        with args.results.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
