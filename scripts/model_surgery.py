"""Which part of a pre-trained model a fine-tuning loses on: re-draw parts of it, or look at its word embeddings.

    python scripts/model_surgery.py fresh --model RUN/final --output DIR --parts word_embeddings
    python scripts/model_surgery.py fresh --model RUN/final --output DIR --parts layers:0
    python scripts/model_surgery.py geometry --model RUN/final --corpus corpus.txt
    python scripts/model_surgery.py tile-positions --model RUN/final --output DIR

`fresh` copies a model directory (a bertkit or transformers BERT checkpoint with model.safetensors) and re-draws
the named parts with BERT's initialisation (weights normal(0, the config's initializer_range), biases 0,
LayerNorm 1 and 0; `--seed`): `word_embeddings`, `position_embeddings`, `token_type_embeddings`, `embeddings`
(all three and their LayerNorm), `layers:K` (encoder layers K and up, and the pooler), `pooler`. A tied MLM
decoder follows the word embeddings. Fine-tuning the result beside the whole model and random initialisation
says which part carries a loss (docs/pretraining.md, "What the Treasury's loss is").

`geometry` counts the model's WordPiece tokens in the first --lines lines of a corpus and prints, per frequency
band, the mean norm of the word embeddings and their mean pairwise cosine: random initialisation gives 0; a tied
decoder trained with softmax pushes every rarely seen token along the same direction (the representation
degeneration of Gao et al. 2019), which shows as a high cosine in the rare bands.

`tile-positions` copies a model directory and gives every position p at or past T the embedding of position
p mod T, T being the positions the model trained (`--trained`, default the `trained_positions` of its
bertkit_pretraining.json): Longformer's initialisation of positions past those trained (Beltagy et al. 2020, sec.
5). Fine-tuning it beside the model says whether the untrained positions carry a loss (docs/pretraining.md, "Every
position a fine-tuning reads").
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import shutil
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from bertkit.inference.positions import PRETRAINING_FILE, directory_trained_positions
from bertkit.tokenizer import WordPieceTokenizer

WORDS = "embeddings.word_embeddings.weight"
POSITIONS = "embeddings.position_embeddings.weight"
PARTS = ("embeddings", "word_embeddings", "position_embeddings", "token_type_embeddings", "pooler")
BANDS = ((0, 500), (500, 2000), (2000, 5000), (5000, None))


def is_fresh(key: str, parts: list[str]) -> bool:
    """Whether parameter `key` (transformers' names) belongs to one of `parts`."""
    layer = re.search(r"encoder\.layer\.(\d+)\.", key)
    for part in parts:
        if part.startswith("layers:"):
            matched = (layer is not None and int(layer.group(1)) >= int(part.split(":")[1])) or ".pooler." in key
        else:
            matched = f".{part}." in key
        if matched:
            return True
    return False


def fresh_value(key: str, value: torch.Tensor, std: float) -> torch.Tensor:
    if "LayerNorm.weight" in key:
        return torch.ones_like(value)
    if key.endswith("bias"):
        return torch.zeros_like(value)
    return torch.randn(value.shape, dtype=torch.float32).mul_(std).to(value.dtype)


def check_parts(parts: list[str], layers: int) -> None:
    """Stop with one line on a part this script does not know, or an encoder layer the model does not have."""
    for part in parts:
        name, _, first = part.partition(":")
        if name == "layers" and first.isdigit() and int(first) < layers:
            continue
        if name == "layers":
            raise SystemExit(f"--parts {part}: the model has encoder layers 0-{layers - 1}; give layers:K with K "
                             "among them")
        if part not in PARTS:
            raise SystemExit(f"--parts {part}: not a part; give {', '.join(PARTS)} or layers:K")


def fresh(model: Path, output: Path, parts: list[str], seed: int) -> None:
    check_model(model, output)
    torch.manual_seed(seed)
    config = json.loads((model / "config.json").read_text())
    check_parts(parts, config["num_hidden_layers"])
    std = config.get("initializer_range", 0.02)
    state = dict(load_file(model / "model.safetensors"))
    drawn = [key for key in state if key.startswith("bert.") and is_fresh(key, parts)]
    if not drawn:
        raise SystemExit(f"--parts {','.join(parts)}: no parameter of {model} matches")
    for key in drawn:
        state[key] = fresh_value(key, state[key], std)
    words = next(key for key in state if key.endswith(WORDS))
    for key in state:
        if key.endswith("decoder.weight"):  # tied to the word embeddings
            state[key] = state[words]
    write_copy(model, output, state)
    print(f"{output}: {len(drawn)} tensors re-drawn ({', '.join(parts)}), the rest as in {model}")


def tile_positions(model: Path, output: Path, trained: int | None) -> None:
    check_model(model, output)
    trained = trained if trained is not None else directory_trained_positions(model)
    if trained is None:
        raise SystemExit(f"--model {model}: no trained_positions in its {PRETRAINING_FILE}; give --trained T")
    state = dict(load_file(model / "model.safetensors"))
    key = next((key for key in state if key.endswith(POSITIONS)), None)
    if key is None:
        raise SystemExit(f"--model {model}: no {POSITIONS} in model.safetensors")
    table = state[key]
    if not 0 < trained < len(table):
        raise SystemExit(f"--trained {trained}: the model has {len(table)} positions; give T in 1-{len(table) - 1}")
    state[key] = table[torch.arange(len(table)) % trained]
    write_copy(model, output, state)
    print(f"{output}: positions {trained}-{len(table) - 1} copied from 0-{trained - 1} (p takes p mod {trained}), "
          f"the rest as in {model}")


def check_model(model: Path, output: Path) -> None:
    """Stop with one line unless `model` is a model directory and `output` a new one."""
    for name in ("config.json", "model.safetensors"):
        if not (model / name).is_file():
            raise SystemExit(f"--model {model}: no {name}; give a model directory (RUN/final)")
    if output.exists():  # never written over: it could be the model itself, or another run's surgery
        raise SystemExit(f"--output {output}: exists; give a new directory")


def write_copy(model: Path, output: Path, state: dict[str, torch.Tensor]) -> None:
    """`output`: a copy of the model directory with `state` as its weights, complete or absent. It is built beside
    `output` and renamed last, so an interrupted run never leaves the untouched model under the surgery's name."""
    partial = output.with_name(f".{output.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)  # an earlier run's, interrupted
    try:
        shutil.copytree(model, partial)
        save_file({key: value.contiguous() for key, value in state.items()}, partial / "model.safetensors",
                  metadata={"format": "pt"})
        partial.rename(output)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise


def geometry(model: Path, corpus: Path, lines: int) -> None:
    tokenizer = WordPieceTokenizer.from_pretrained(model)
    counts: collections.Counter[int] = collections.Counter()
    with corpus.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle):
            if number >= lines:
                break
            counts.update(tokenizer.convert_tokens_to_ids(tokenizer.tokenize(line.strip())))
    state = load_file(model / "model.safetensors")
    words = state[next(key for key in state if key.endswith(WORDS))].float()
    frequency = torch.tensor([counts.get(index, 0) for index in range(len(words))], dtype=torch.float)
    order = frequency.argsort(descending=True)
    for start, end in BANDS:
        band = order[start:end]
        if len(band) < 2:  # a vocabulary smaller than the band's start
            continue
        unit = F.normalize(words[band], dim=1)
        n = len(band)
        cosine = ((unit.sum(0) ** 2).sum() - n) / (n * n - n)  # mean over pairs i != j of cos(i, j)
        print(f"tokens {start}-{start + len(band)} by frequency (median count {frequency[band].median():.0f}): "
              f"mean norm {words[band].norm(dim=1).mean():.3f}, mean pairwise cosine {cosine:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    draw = commands.add_parser("fresh", help="copy a model, re-drawing some parts")
    draw.add_argument("--model", type=Path, required=True)
    draw.add_argument("--output", type=Path, required=True)
    draw.add_argument("--parts", required=True, help="Comma-separated: word_embeddings, layers:K, ...")
    draw.add_argument("--seed", type=int, default=0)
    look = commands.add_parser("geometry", help="word-embedding norms and cosines by token frequency")
    look.add_argument("--model", type=Path, required=True)
    look.add_argument("--corpus", type=Path, required=True)
    look.add_argument("--lines", type=int, default=60_000)
    tile = commands.add_parser("tile-positions", help="copy a model, positions past those trained copied from them")
    tile.add_argument("--model", type=Path, required=True)
    tile.add_argument("--output", type=Path, required=True)
    tile.add_argument("--trained", type=int, help="Positions trained (default: the model's record says).")
    args = parser.parse_args()
    if args.command == "fresh":
        fresh(args.model, args.output, args.parts.split(","), args.seed)
    elif args.command == "tile-positions":
        tile_positions(args.model, args.output, args.trained)
    else:
        geometry(args.model, args.corpus, args.lines)


if __name__ == "__main__":
    main()
