"""The quickstart's report: the per-seed table with mean ± std, the verdict on pre-training, the
figures (pre-training curves, dev accuracy per fine-tuning epoch) and report.md, all from the summary
that `stages.summarize` builds (quickstart.json).

Design decision: everything here reads the summary dict and the run directories' metrics.jsonl, so a
report can be redrawn from a finished run's files alone, and nothing here trains or measures.
"""

from __future__ import annotations

import collections
import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bertkit.workflows.significance import SIGNIFICANCE_LEVEL, SeedComparison, compare_seeds

REPORT_FILE = "report.md"
PRETRAIN_FIGURE = "pretraining.png"
FINETUNE_FIGURE = "finetuning.png"
MIN_HELPFUL_SEQUENCES = 32_000
"""Pre-training sequences below which the study (docs/quickstart.md) saw no gain: 400 steps of 32 were worse than
random initialisation, 1,500 gave +11 points; counted in sequences (1,000 steps of 32), not steps, because the
recipe's batch changed (to 16)."""


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


def seed_table(results: dict[str, Any]) -> dict[str, Any]:
    """Per seed dev/test accuracy (at the seed's best dev epoch) and their mean ± sample std."""
    seeds = {seed: {"dev": m["accuracy"], "test": m["test_accuracy"], "step": m.get("step")}
             for seed, m in results["seeds"].items()}
    table: dict[str, Any] = {"seeds": seeds}
    for split in ("dev", "test"):
        values = [s[split] for s in seeds.values()]
        table[split] = {"mean": statistics.fmean(values),
                        "std": statistics.stdev(values) if len(values) > 1 else 0.0}
    return table


def comparison_lines(summary: dict[str, Any]) -> str:
    """Plain-text lines of the comparison for the terminal."""
    lines = []
    for name, table in summary["finetuning"].items():
        seeds = len(table["seeds"])
        lines.append(f"{name:>10}: dev accuracy {_pm(table['dev'], seeds)}, test accuracy "
                     f"{_pm(table['test'], seeds)} ({plural(seeds, 'seed')})")
    gain = pretraining_gain(summary)
    verdict = pretraining_verdict(summary)
    return "\n".join(lines + [line for line in (gain, verdict) if line])


def _comparisons(summary: dict[str, Any]) -> dict[str, SeedComparison]:
    """Pre-trained against random initialisation per split ({} without a random-initialisation baseline)."""
    tables = summary["finetuning"]
    if not {"pretrained", "random"} <= tables.keys():
        return {}
    return {split: compare_seeds(*([100 * seed[split] for seed in tables[name]["seeds"].values()]
                                   for name in ("pretrained", "random"))) for split in ("dev", "test")}


def pretraining_gain(summary: dict[str, Any]) -> str | None:
    """Pre-trained minus random initialisation, in points per split, each with whether it is more than seed
    noise (None without a random-initialisation baseline)."""
    comparisons = _comparisons(summary)
    if not comparisons:
        return None
    parts = [f"{c.difference:+.1f} points on {split} ({c.note})" for split, c in comparisons.items()]
    return "Gain from pre-training (difference of the means): " + "; ".join(parts) + "."


def _pm(stats: dict[str, float], seeds: int) -> str:
    """Mean ± sample std over seeds; one seed has no spread to show."""
    spread = f" ± {100 * stats['std']:.1f}" if seeds > 1 else ""
    return f"{100 * stats['mean']:.1f}{spread}%"


def pretraining_verdict(summary: dict[str, Any]) -> str | None:
    """A plain sentence when pre-training was too short to be expected to help (None otherwise)."""
    steps, batch = summary["pretraining"]["steps"], int(summary.get("recipe", {}).get("batch_size", 32))
    if steps * batch >= MIN_HELPFUL_SEQUENCES:
        return None
    shown = any(c.difference > 0 and c.p_value is not None and c.p_value < SIGNIFICANCE_LEVEL
                for c in _comparisons(summary).values())
    expectation = ("a gain already shows here, and more pre-training gives more" if shown else
                   "so the pre-trained model is not expected to beat random initialisation")
    return (f"Pre-training ran {plural(steps, 'step')} of {batch} sequences: below the "
            f"~{MIN_HELPFUL_SEQUENCES // batch:,} steps ({MIN_HELPFUL_SEQUENCES:,} sequences) where the study saw a "
            f"gain appear (docs/quickstart.md); {expectation}; give it more with --max-steps 2500 (a step budget, "
            f"however busy the machine) or a larger --minutes.")


def plot_pretraining(run: Path, png: Path, by_step: bool = False) -> Path:
    """Held-out MLM and NSP accuracy (right) and MLM loss (left) against minutes of training (or steps:
    the comparable axis when the machine was shared and minutes depend on the load)."""
    from bertkit.train.reporting import read_metrics

    records = read_metrics(run / "metrics.jsonl")
    x_of_step = {r["step"]: r["step"] if by_step else r["elapsed_s"] / 60 for r in records if r.get("kind") == "train"}
    evals = [r for r in records if r.get("kind") == "eval" and r["step"] in x_of_step]
    train = [r for r in records if r.get("kind") == "train"]
    plt = _pyplot()
    figure, (loss_axis, accuracy_axis) = plt.subplots(1, 2, figsize=(11, 4))
    loss_axis.plot([x_of_step[r["step"]] for r in train], [r["mlm_loss"] for r in train], color="C0", alpha=0.3,
                   label="train MLM loss")
    loss_axis.plot([x_of_step[r["step"]] for r in evals], [r["mlm_loss"] for r in evals], "o-", color="C0",
                   label="held-out MLM loss")
    for key, color in (("mlm_accuracy", "C1"), ("nsp_accuracy", "C2")):
        points = [(x_of_step[r["step"]], 100 * r[key]) for r in evals if key in r]
        if points:
            accuracy_axis.plot(*zip(*points), "o-", color=color, label=f"held-out {key.split('_')[0].upper()} accuracy")
    for axis, title in ((loss_axis, "MLM loss"), (accuracy_axis, "held-out accuracy (%)")):
        axis.set_xlabel("optimizer step" if by_step else "minutes of pre-training")
        axis.set_title(title)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    return _save(figure, png)


SEED_COLOURS = {"pretrained": "Blues", "random": "Oranges"}
"""The colour map of each initialisation's seeds (one shade per seed); another name takes Greens, Purples, ..."""
SEED_MARKERS = "osD^vP*X"
SEED_DODGE = 0.05
"""Epochs between the points of neighbouring lines (every initialisation and seed), so runs with equal
accuracy (e.g. all at the majority class) stay visible side by side instead of one hiding the others."""


def plot_finetuning(output: Path, names: Sequence[str], png: Path, majority: dict[str, Any] | None = None) -> Path:
    """finetuning_figure into `png`."""
    return _save(finetuning_figure(output, names, majority), png)


def finetuning_figure(output: Path, names: Sequence[str], majority: dict[str, Any] | None = None) -> Any:
    """Dev accuracy after every fine-tuning epoch: one line per initialisation and seed, each with its own
    colour (a colour family per initialisation) and marker, integer epoch ticks, and the majority class's
    accuracy on dev as a dashed line when it is known (`majority`: {"label", "share"}, see
    `majority_class`)."""
    from matplotlib.ticker import MaxNLocator

    from bertkit.train.reporting import read_metrics

    seeds = {name: sorted((output / f"finetune-{name}").glob("seed-*"), key=lambda d: int(d.name[5:]))
             for name in names}
    lines = sum(map(len, seeds.values()))
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(8, 4))
    spare = iter(("Greens", "Purples", "Greys", "Reds"))
    epochs: set[int] = set()
    position = 0  # of the line among all lines, for its dodge
    for name, seed_dirs in seeds.items():
        colours = plt.get_cmap(SEED_COLOURS.get(name) or next(spare))
        for index, seed_dir in enumerate(seed_dirs):
            evals = [r for r in read_metrics(seed_dir / "metrics.jsonl") if r.get("kind") == "eval"]
            steps_per_epoch = evals[0]["step"] if evals else 1
            epochs.update(round(r["step"] / steps_per_epoch) for r in evals)
            dodge = (position - (lines - 1) / 2) * SEED_DODGE
            position += 1
            axis.plot([r["step"] / steps_per_epoch + dodge for r in evals], [100 * r["accuracy"] for r in evals],
                      marker=SEED_MARKERS[index % len(SEED_MARKERS)], markersize=5,
                      color=colours(0.45 + 0.45 * index / max(len(seed_dirs) - 1, 1)),
                      label=f"{name}, {seed_dir.name.replace('-', ' ')}")
    if majority:
        axis.axhline(100 * majority["share"], color="0.3", linestyle="--", linewidth=1, zorder=1.5,  # under the seeds
                     label=f"majority class ({majority['label']}): {100 * majority['share']:.1f}%")
    if epochs:  # half an epoch either side: room for the dodged points, and an integer tick even for one epoch
        axis.set_xlim(min(epochs) - 0.5, max(epochs) + 0.5)
    axis.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
    axis.set_xlabel("epoch")
    axis.set_ylabel("dev accuracy (%)")
    axis.set_title("fine-tuning on the bundled task (one line per initialisation and seed)")
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    return figure


def majority_class(labels: Sequence[str]) -> dict[str, Any]:
    """The most frequent label and its share: the accuracy of always answering it."""
    counts = collections.Counter(labels)
    label, count = counts.most_common(1)[0]
    return {"label": label, "share": count / len(labels)}


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(figure: Any, png: Path) -> Path:
    figure.tight_layout()
    figure.savefig(png, dpi=110)
    _pyplot().close(figure)
    return png


def write_figures(output: Path, names: Sequence[str], majority: dict[str, Any] | None) -> None:
    """pretraining.png and finetuning.png (of the fine-tunings `names`), beside report.md."""
    plot_pretraining(output / "pretrain", output / PRETRAIN_FIGURE)
    plot_finetuning(output, list(names), output / FINETUNE_FIGURE, majority)


def write_report(output: Path, summary: dict[str, Any], figures: bool = True) -> Path:
    """report.md from the summary (with `figures`, pretraining.png and finetuning.png drawn beside it first)."""
    if figures:
        write_figures(output, list(summary["finetuning"]), summary.get("dev_majority"))
    sections = [_report_header(summary), _report_pretraining(summary), _report_fill_mask(summary),
                _report_finetuning(summary), _report_reuse(output)]
    path = output / REPORT_FILE
    path.write_text("\n\n".join(sections) + "\n", encoding="utf-8")
    return path


def _report_header(summary: dict[str, Any]) -> str:
    machine = summary["machine"]
    runs = ("once from the pre-trained weights and once from random initialisation, with the same recipe and "
            "seeds" if "random" in summary["finetuning"] else "from the pre-trained weights")
    return (f"# bertkit quickstart report\n\n"
            f"{summary['model']} pre-trained on the bundled King James Bible, then fine-tuned on the bundled 6-way "
            f"task \"which part of the Bible is this verse from\" - {runs}.\n\n"
            f"Machine: {machine['cpus']} CPUs, {machine['torch_threads']} torch threads, precision "
            f"{machine['precision']}, torch {machine['torch']}, Python {machine['python']}"
            f"{', GPU ' + machine['cuda'] if machine['cuda'] else ''}.\n\n"
            f"{_report_time(summary)}\n\n"
            f"Recipe: `{json.dumps(summary['recipe'])}`")


def _report_time(summary: dict[str, Any]) -> str:
    """How the time was planned (with --minutes) and how it was spent, stage by stage."""
    timings, plan = summary["timings"], summary.get("plan")
    names = (("setup_s", "set-up"), ("vocabulary_and_data_s", "vocabulary + data"), ("speed_probe_s", "speed probe"),
             ("pretraining_s", "pre-training"), ("finetuning_s", "fine-tuning"), ("report_s", "fill-mask + figures"))
    spent = (", ".join(f"{name} {timings[key]:.0f} s" for key, name in names if key in timings)
             + f": {sum(timings.values()) / 60:.1f} min in all")
    if not plan:
        return f"Time (a step budget, no time plan): {spent}."
    rates = plan["rates"]
    return (f"Time budget {plan['total_s'] / 60:g} min, planned from throughput measured on this machine "
            f"(pre-training {rates['pretrain_steps_per_s']:.2f} steps/s, fine-tuning "
            f"{rates['finetune_steps_per_s']:.2f} steps/s, evaluation {rates['eval_examples_per_s']:.0f} "
            f"examples/s): pre-training {plan['pretrain_s']:.0f} s, fine-tuning ~{plan['finetune_s']:.0f} s"
            + (f" ({plan['shortened']})" if plan["shortened"] else "") + f".  \nSpent: {spent}.")


def _report_pretraining(summary: dict[str, Any]) -> str:
    pre = summary["pretraining"]
    final = pre["final_eval"]
    accuracies = f"MLM accuracy **{100 * final.get('mlm_accuracy', 0):.1f}%**"
    if "nsp_accuracy" in final:
        accuracies += f", NSP accuracy **{100 * final['nsp_accuracy']:.1f}%**"
    rate = pre["steps"] / max(pre["elapsed_s"], 1e-9)
    return (f"## Pre-training\n\n{pre['steps']:,} steps in {pre['elapsed_s'] / 60:.1f} min of training ({rate:.2f} "
            f"steps/s, its evaluations included; the stage's time above adds building and writing the model) on "
            f"{pre['instances']:,} instances. Held-out at the end: MLM loss {final.get('mlm_loss', float('nan')):.3f}, "
            f"{accuracies}. (docs/quickstart.md: about 2,600 steps fit in 10 minutes of two free cores, "
            f"and a busy machine fits fewer; --max-steps sets a step budget instead.)\n\n"
            f"![pre-training curves]({PRETRAIN_FIGURE})")


def _report_fill_mask(summary: dict[str, Any]) -> str:
    rows = ["| sentence | top 5 guesses for [MASK] (probability) |", "|---|---|"]
    for item in summary["fill_mask"]:
        guesses = ", ".join(f"{token} ({score:.3f})" for token, score in item["top"])
        rows.append(f"| {item['text']} | {guesses} |")
    return "## Fill-mask with the pre-trained model\n\n" + "\n".join(rows)


def _report_finetuning(summary: dict[str, Any]) -> str:
    tables = summary["finetuning"]
    names = list(tables)
    seeds = list(tables[names[0]]["seeds"])
    header = "| seed | " + " | ".join(f"{n} dev | {n} test" for n in names) + " |"
    rows = [header, "|---" * (1 + 2 * len(names)) + "|"]
    for seed in seeds:
        cells = [f"{100 * tables[n]['seeds'][seed][split]:.1f}" for n in names for split in ("dev", "test")]
        rows.append(f"| {seed} | " + " | ".join(cells) + " |")
    label = "**mean ± std**" if len(seeds) > 1 else "**mean**"
    rows.append(f"| {label} | " + " | ".join(f"**{_pm(tables[n][split], len(seeds))}**" for n in names
                                             for split in ("dev", "test")) + " |")
    recipe = summary["recipe"]
    train = recipe["train_examples"] or 4000
    title = "Fine-tuning: pre-trained vs random initialisation" if "random" in tables else "Fine-tuning"
    text = (f"## {title}\n\n{train:,} labelled training verses, "
            f"{recipe['finetune_epochs']:g} epochs, lr {recipe['finetune_learning_rate']:g}, batch "
            f"{recipe['finetune_batch_size']}; accuracy (%) at each seed's best dev epoch, test at that epoch "
            f"(dev and test chapters never appear in the pre-training text).\n\n" + "\n".join(rows))
    gain = pretraining_gain(summary)
    if gain:
        text += f"\n\n{gain}"
    else:
        text += "\n\nNo random-initialisation baseline was trained (--no-baseline), so no gain is computed."
    majority = summary.get("dev_majority")
    if majority:
        text += (f" Always answering the majority class ({majority['label']}) scores {100 * majority['share']:.1f}% "
                 "on dev (the dashed line in the figure).")
    verdict = pretraining_verdict(summary)
    if verdict:
        text += f"\n\n**{verdict}**"
    return text + f"\n\n![fine-tuning curves]({FINETUNE_FIGURE})"


def _report_reuse(output: Path) -> str:
    return (f"## Reuse the outputs\n\n```\n"
            f"bertkit pretrain --data {output}/data --init-from {output}/pretrain/final --output more/ --max-time 1h\n"
            f"bertkit finetune classification --model {output}/pretrain/final --train my.tsv --dev my_dev.tsv "
            f"--output mine/\n"
            f"bertkit predict --model {output}/finetune-pretrained/best --input verses.jsonl --output preds/\n"
            f"bertkit serve --model {output}/pretrain/final\n```")
