"""The table of an adaptation study, from the fine-tuning runs in the current directory (ft-MODEL-LR/, each with
eval_results.json and ft-MODEL-LR.log) and the pre-training runs (pt-NAME/metrics.jsonl): every model at every
rate (dev and test, mean ± std over seeds), each model's best rate chosen on dev, the comparisons asked for
(Welch's test on test accuracy) and the held-out MLM accuracy of each pre-training; all of it also written to
results.json. Shared by scripts/adaptation_sweep.sh and scripts/mlm_head_adaptation.sh.

    python scripts/adaptation_table.py --compare warm:released --pretrain warm nowarm [--at-auto]
"""

import argparse
import glob
import json
import re
import statistics
from pathlib import Path

from bertkit.workflows.significance import compare_seeds


def scores(run: str) -> tuple[list[float], list[float]]:
    seeds = json.loads(Path(f"{run}/eval_results.json").read_text())["seeds"]
    return [100 * s["accuracy"] for s in seeds.values()], [100 * s["test_accuracy"] for s in seeds.values()]


def chosen_rate(run: str) -> str:
    """The rate `auto` resolved to, as the run's log printed it."""
    match = re.search(r"learning rate auto: ([0-9.e-]+)", Path(f"{run}.log").read_text())
    return match.group(1) if match else "?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compare", nargs="*", default=[], help="MODEL:AGAINST pairs, each at its best rate")
    parser.add_argument("--at-auto", action="store_true", help="also compare the pairs at --learning-rate auto")
    parser.add_argument("--pretrain", nargs="*", default=[], help="pre-training runs pt-NAME to report")
    args = parser.parse_args()
    results: dict = {}
    best: dict[str, str] = {}
    for path in sorted(glob.glob("ft-*-*/eval_results.json")):
        run = path.split("/")[0]
        name, lr = run[3:].split("-", 1)
        dev, test = scores(run)
        shown = f"auto ({chosen_rate(run)})" if lr == "auto" else lr
        results[run] = {"model": name, "learning_rate": shown, "dev": dev, "test": test}
        print(f"{name:<9} lr {shown:<16} dev {statistics.fmean(dev):5.1f} ± {statistics.stdev(dev):.1f}   "
              f"test {statistics.fmean(test):5.1f} ± {statistics.stdev(test):.1f}  "
              f"({', '.join(f'{v:.1f}' for v in test)})")
        if name not in best or statistics.fmean(dev) > statistics.fmean(results[best[name]]["dev"]):
            best[name] = run  # each model's best learning rate, chosen on dev, reported on test
    for name, run in best.items():
        print(f"best on dev for {name}: lr {results[run]['learning_rate']}")
    for pair in args.compare:
        name, against = pair.split(":")
        runs = [("best lr", best.get(name), best.get(against))]
        if args.at_auto:
            runs.append(("auto", f"ft-{name}-auto", f"ft-{against}-auto"))
        for label, run, other in runs:
            if run not in results or other not in results:
                continue
            comparison = compare_seeds(results[run]["test"], results[other]["test"])
            results[f"{name}_versus_{against}_{label.replace(' ', '_')}"] = {
                "difference": comparison.difference, "p_value": comparison.p_value, "note": comparison.note}
            print(f"{name} vs {against} ({label}), test: {comparison.difference:+.1f} points ({comparison.note})")
    for name in args.pretrain:
        lines = Path(f"pt-{name}/metrics.jsonl").read_text().splitlines()
        evals = [json.loads(line) for line in lines if '"eval"' in line]
        results[f"pretrain-{name}"] = [{k: e.get(k) for k in ("step", "mlm_loss", "mlm_accuracy", "nsp_accuracy")}
                                       for e in evals]
        print(f"pre-training {name}: held-out MLM accuracy "
              + ", ".join(f"{e['step']}: {100 * e['mlm_accuracy']:.1f}%" for e in evals))
    Path("results.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
