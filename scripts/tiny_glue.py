"""Write a small GLUE-shaped directory from the bundled King James verses, for smoke runs of `bertkit glue`.

    python scripts/tiny_glue.py --output tiny_glue [--train-rows 256] [--dev-rows 128] [--seed 0]

Every task folder of download_glue_data.py's layout (CoLA/, SST-2/, MRPC/, STS-B/, QQP/, MNLI/ with
dev_matched.tsv and dev_mismatched.tsv, QNLI/, RTE/, WNLI/), each file in that task's column layout, the
texts being verses of the bundled 6-way task (bertkit.assets: train.tsv for train, dev.tsv for dev). The
labels are made up from which part of the Bible a verse comes from (single sentences: Old or New
Testament; pairs: from the same part or not; STS-B: 5.0 for the same part, 0.0 otherwise), so a model can
learn them, but the scores mean nothing about GLUE: this is a smoke test of the command, not GLUE data.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

from bertkit.assets import kjv_path

NEW_TESTAMENT = {"gospels", "letters"}
MNLI_TRAIN = ("index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\tsentence1_parse\t"
              "sentence2_parse\tsentence1\tsentence2\tlabel1\tgold_label")
MNLI_DEV = MNLI_TRAIN.replace("label1\tgold_label", "label1\tlabel2\tlabel3\tlabel4\tlabel5\tgold_label")


def verses(split: str) -> list[tuple[str, str]]:
    """(text, part) of the bundled verses of `split` (train or dev)."""
    lines = kjv_path(f"{split}.tsv").read_text(encoding="utf-8").splitlines()[1:]
    return [(text, part) for text, part in (line.split("\t") for line in lines)]


def rows(folder: str, pool: list[tuple[str, str]], count: int, rng: random.Random, dev: bool) -> list[str]:
    """`count` rows of one task file in its download_glue_data.py column layout (its header first)."""
    out = []
    for i in range(count):
        (a, part_a), (b, part_b) = rng.choice(pool), rng.choice(pool)
        testament = int(part_a in NEW_TESTAMENT)
        same = part_a == part_b
        if folder == "CoLA":
            out.append(f"kjv\t{testament}\t\t{a}")
        elif folder == "SST-2":
            out.append(f"{a}\t{testament}")
        elif folder == "MRPC":
            out.append(f"{int(same)}\t{i}\t{i + count}\t{a}\t{b}")
        elif folder == "STS-B":
            out.append(f"{i}\tmain-kjv\tkjv\t2024\t{i}\tnone\tnone\t{a}\t{b}\t{5.0 if same else 0.0}")
        elif folder == "QQP":
            out.append(f"{i}\t{2 * i}\t{2 * i + 1}\t{a}\t{b}\t{int(same)}")
        elif folder == "MNLI":
            label = "entailment" if same else (
                "contradiction" if testament != int(part_b in NEW_TESTAMENT) else "neutral")
            labels = "\t".join([label] * (6 if dev else 2))
            out.append(f"{i}\t{i}\t{i}e\tkjv\t(a)\t(b)\t(a)\t(b)\t{a}\t{b}\t{labels}")
        elif folder in ("QNLI", "RTE"):
            out.append(f"{i}\t{a}\t{b}\t{'entailment' if same else 'not_entailment'}")
        else:  # WNLI
            out.append(f"{i}\t{a}\t{b}\t{int(same)}")
    header = {"CoLA": None, "SST-2": "sentence\tlabel", "MRPC": "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String",
              "STS-B": "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore",
              "QQP": "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate", "MNLI": MNLI_DEV if dev else MNLI_TRAIN,
              "QNLI": "index\tquestion\tsentence\tlabel"}.get(folder, "index\tsentence1\tsentence2\tlabel")
    return ([header] if header else []) + out


def write_tiny_glue(output: Path, train_rows: int = 256, dev_rows: int = 128, seed: int = 0) -> Path:
    rng = random.Random(seed)
    train, dev = verses("train"), verses("dev")
    for folder in ("CoLA", "SST-2", "MRPC", "STS-B", "QQP", "MNLI", "QNLI", "RTE", "WNLI"):
        directory = output / folder
        directory.mkdir(parents=True, exist_ok=True)
        devs = ("dev_matched.tsv", "dev_mismatched.tsv") if folder == "MNLI" else ("dev.tsv",)
        files = {"train.tsv": (train, train_rows, False), **dict.fromkeys(devs, (dev, dev_rows, True))}
        for name, (pool, count, is_dev) in files.items():
            (directory / name).write_text("\n".join(rows(folder, pool, count, rng, is_dev)) + "\n", encoding="utf-8")
    return output


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--train-rows", type=int, default=256)
    parser.add_argument("--dev-rows", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    write_tiny_glue(args.output, args.train_rows, args.dev_rows, args.seed)
    print(f"wrote {args.output}: 9 GLUE-shaped task folders, {args.train_rows} train / {args.dev_rows} dev rows each")


if __name__ == "__main__":
    main()
