"""The recipe study behind `bertkit quickstart` (docs/quickstart.md): pre-train bert-mini on the bundled
King James Bible with several recipes under the same deterministic step budget, fine-tune each on the
bundled task with several seeds and label counts, fine-tune the same architecture from random
initialisation with the same seeds, and print the table (mean ± sample std over seeds).

Design decision: recipes are compared at equal *step* budgets converted from measured throughput, not
at equal wall-clock time, because the 2-core machine they ran on is shared and its timings are noisy;
the final recipe is then confirmed with the real time budget (`bertkit quickstart`). Every stage is the
quickstart's own function, so a finished stage is reused when the script is run again.

    OMP_NUM_THREADS=2 python scripts/quickstart_recipe.py run --root /tmp/study --recipe quickstart \
        --steps 1500 --baseline
    python scripts/quickstart_recipe.py table --root /tmp/study
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, replace
from pathlib import Path

import click

from bertkit.quickstart import (
    MODEL,
    QuickstartSettings,
    Recipe,
    build_data,
    fill_mask_examples,
    finetune_model,
    pretrain_model,
    seed_table,
    train_vocabulary,
)
from bertkit.train.reporting import read_metrics

# transformers' usual recipe scaled to a short run, the quickstart's recipe, and its levers one at a time.
RECIPES: dict[str, Recipe] = {
    "usual": Recipe(max_seq_length=128, max_predictions_per_seq=20, batch_size=32, learning_rate=1e-4,
                    warmup_ratio=0.01, dropout=0.1),
    "quickstart": Recipe(),
    "no-nsp": Recipe(nsp=False),
    "lr1e-3": Recipe(learning_rate=1e-3),
    "batch64-seq128": Recipe(max_seq_length=128, max_predictions_per_seq=20, batch_size=64, learning_rate=1e-3),
    "mask30": Recipe(masked_lm_prob=0.3, max_predictions_per_seq=20),
}


@click.group()
def cli() -> None:
    """Run one recipe of the study, or print the table of the finished ones."""


@cli.command()
@click.option("--root", required=True, type=click.Path(file_okay=False, path_type=Path), help="Study directory.")
@click.option("--recipe", "name", required=True, type=click.Choice(sorted(RECIPES)), help="Recipe to run.")
@click.option("--steps", required=True, type=int,
              help="Pre-training optimizer steps (convert a time budget with each recipe's measured steps/s).")
@click.option("--seeds", default="1,2,3", show_default=True, help="Fine-tuning seeds.")
@click.option("--train-examples", default="1000", show_default=True,
              help="Comma-separated labelled-set sizes to fine-tune on (0: all 4,000).")
@click.option("--baseline/--no-baseline", default=False, show_default=True,
              help="Also fine-tune from random initialisation (needed once per label count).")
@click.option("--finetune-lr", default=Recipe().finetune_learning_rate, show_default=True, type=float,
              help="Fine-tuning learning rate (both initialisations).")
def run(root: Path, name: str, steps: int, seeds: str, train_examples: str, baseline: bool,
        finetune_lr: float) -> None:
    """Pre-train with one recipe for a step budget, then fine-tune it (and the baseline) per label count."""
    recipe = replace(RECIPES[name], finetune_learning_rate=finetune_lr)
    cfg = QuickstartSettings(output=root / name, minutes=None, max_steps=steps,
                           seeds=tuple(int(s) for s in seeds.split(",")), recipe=recipe, resume=True,
                           eval_every=max(10, steps // 10))
    cfg.output.mkdir(parents=True, exist_ok=True)
    tokenizer = train_vocabulary(cfg, click.echo)
    build_data(cfg, tokenizer, click.echo)
    final = pretrain_model(cfg, click.echo)
    result = {"recipe": name, "settings": asdict(recipe), "steps": cfg.max_steps, "pretraining": _pretraining(cfg),
              "fill_mask": fill_mask_examples(final)[:2], "finetuning": {}}
    for count in (int(c) for c in train_examples.split(",")):
        sized = replace(cfg, recipe=replace(recipe, train_examples=count or None))
        inits = {"pretrained": str(final), **({"random": MODEL} if baseline else {})}
        for init, model in inits.items():
            key = f"{init}-n{count or 4000}-lr{finetune_lr:g}"
            result["finetuning"][key] = seed_table(finetune_model(sized, model, key, click.echo))
    (cfg.output / f"study-lr{finetune_lr:g}.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    click.echo(json.dumps(result["pretraining"]))


def _pretraining(cfg: QuickstartSettings) -> dict:
    records = read_metrics(cfg.output / "pretrain" / "metrics.jsonl")
    train = [r for r in records if r["kind"] == "train"]
    final = [r for r in records if r["kind"] == "eval"][-1]
    seconds = train[-1]["elapsed_s"]
    return {"steps": len(train), "elapsed_s": seconds, "steps_per_s": len(train) / seconds,
            "mlm_accuracy": final["mlm_accuracy"], "nsp_accuracy": final.get("nsp_accuracy"),
            "mlm_loss": final["mlm_loss"]}


@cli.command()
@click.option("--root", required=True, type=click.Path(file_okay=False, path_type=Path), help="Study directory.")
def table(root: Path) -> None:
    """Print the Markdown table of every finished recipe under --root."""
    results = [json.loads(p.read_text(encoding="utf-8")) for p in sorted(root.glob("*/study-lr*.json"))]
    if not results:
        sys.exit(f"no study-lr*.json under {root}; run some recipes first")
    runs = sorted({key for r in results for key in r["finetuning"]})
    click.echo("| recipe | steps | MLM acc | NSP acc | " + " | ".join(f"{k} dev / test" for k in runs) + " |")
    click.echo("|---" * (4 + len(runs)) + "|")
    for r in results:
        pre = r["pretraining"]
        nsp = f"{100 * pre['nsp_accuracy']:.1f}" if pre["nsp_accuracy"] is not None else "-"
        cells = [_cell(r["finetuning"].get(k)) for k in runs]
        click.echo(f"| {r['recipe']} | {r['steps']} | {100 * pre['mlm_accuracy']:.1f} | {nsp} | "
                   + " | ".join(cells) + " |")


def _cell(stats: dict | None) -> str:
    if stats is None:
        return ""
    return " / ".join(f"{100 * stats[s]['mean']:.1f} ± {100 * stats[s]['std']:.1f}" for s in ("dev", "test"))


if __name__ == "__main__":
    cli()
