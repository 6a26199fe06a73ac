#!/usr/bin/env bash
# Domain adaptation with the head warm-up, each model at its own best fine-tuning learning rate
# (docs/pretraining.md, "Domain adaptation"; issue 37). all-MiniLM-L6-v2 as released (no MLM head) against
#   warm:   STEPS of `--recipe continue` on the KJV corpus, which now warms the fresh MLM head up first
#           (10% of the steps with the encoder held still, then the encoder ramps up);
#   nowarm: the same steps with --head-warmup-steps 0 (what the recipe did before), to see what the warm-up is worth,
#   ratio:  the warm-up and the encoder at 0.3 of the head's rate (--encoder-lr-ratio 0.3),
#   tapt:   the warm-up, on the task's own 4,000 training verses (TAPT) instead of the corpus,
#   warm6:  with SIX_PASSES=1 in the environment, the warm-up recipe with its own budget (no --max-steps: the
#           continue recipe's 6 passes over the corpus), fine-tuned at auto and the rates of LRS after the first,
# the first two fine-tuned on the bundled KJV task (1,000 training verses, seeds 1-3) at the default learning rate
# (auto) and at a small sweep (LRS), the others at the first rate of LRS. Usage:
#   scripts/adaptation_sweep.sh MODEL_DIR WORK_DIR [STEPS] [LRS] [PRECISION]
#       STEPS default 250; LRS default "1e-4 1.4e-4 2e-4 4e-4"; PRECISION default bf16 (fp32 where bf16 is slow)
# docs/pretraining.md ("Domain adaptation") has the table of 2026-11-28; its "auto (7.1e-5)" column is the
# explicit 7.1e-5 runs here (that day's auto; auto gives 1.4e-4 for this model since, run as "auto"). The
# default LRS also runs warm at 1.4e-4, which the table leaves out.
# Writes WORK_DIR/results.json and prints the table; each stage's wall time goes to WORK_DIR/timings.txt.
set -euo pipefail
MODEL=$1 WORK=$2 STEPS=${3:-250} LRS=${4:-"1e-4 1.4e-4 2e-4 4e-4"} PRECISION=${5:-bf16}
SCRIPTS=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$WORK"
cd "$WORK"
source "$SCRIPTS/adaptation_steps.sh"  # stage, finetune

python "$SCRIPTS/kjv_task_files.py"  # kjv.txt, train-1000.tsv, task-texts.txt

[ -d data ] || stage data bertkit data pretraining --input kjv.txt --tokenizer "$MODEL" --output data \
    --max-seq-length 64 --no-nsp --masking dynamic --seed 42 --quiet
[ -d pt-warm/final ] || stage pretrain-warm bertkit pretrain --data data --init-from "$MODEL" --output pt-warm \
    --max-steps "$STEPS" --eval-examples 500 --eval-every 50 --save-every 1000 --precision "$PRECISION"
[ -d pt-nowarm/final ] || stage pretrain-nowarm bertkit pretrain --data data --init-from "$MODEL" \
    --output pt-nowarm --max-steps "$STEPS" --eval-examples 500 --eval-every 50 --save-every 1000 \
    --head-warmup-steps 0 --precision "$PRECISION"
[ -d pt-ratio/final ] || stage pretrain-ratio bertkit pretrain --data data --init-from "$MODEL" \
    --output pt-ratio --max-steps "$STEPS" --eval-examples 500 --eval-every 50 --save-every 1000 \
    --encoder-lr-ratio 0.3 --precision "$PRECISION"
if [ "${SIX_PASSES:-0}" = 1 ] && [ ! -d pt-warm6/final ]; then
  stage pretrain-warm6 bertkit pretrain --data data --init-from "$MODEL" --output pt-warm6 --eval-examples 500 \
      --eval-every 500 --save-every 1000 --precision "$PRECISION"
fi
[ -d data-tapt ] || stage data-tapt bertkit data pretraining --input task-texts.txt --tokenizer "$MODEL" \
    --output data-tapt --max-seq-length 64 --no-nsp --masking dynamic --seed 42 --quiet
[ -d pt-tapt/final ] || stage pretrain-tapt bertkit pretrain --data data-tapt --init-from "$MODEL" --output pt-tapt \
    --max-steps "$STEPS" --eval-examples 200 --eval-every 50 --save-every 1000 --precision "$PRECISION"

first=${LRS%% *}
finetune released "$MODEL" "$first"
finetune warm pt-warm/final "$first"
finetune nowarm pt-nowarm/final "$first"
finetune ratio pt-ratio/final "$first"
finetune tapt pt-tapt/final "$first"
finetune released "$MODEL" 7.1e-5  # the width-only rule's rate of 2026-11-28 (auto gives 1.4e-4 for this model since)
finetune warm pt-warm/final 7.1e-5
finetune released "$MODEL" auto
for lr in ${LRS#"$first"}; do
  finetune released "$MODEL" "$lr"
  finetune warm pt-warm/final "$lr"
done
six=()
if [ "${SIX_PASSES:-0}" = 1 ]; then
  finetune warm6 pt-warm6/final auto
  for lr in ${LRS#"$first"}; do finetune warm6 pt-warm6/final "$lr"; done
  six=(warm6:released)
fi

python "$SCRIPTS/adaptation_table.py" --compare warm:released nowarm:released ratio:released tapt:released \
    "${six[@]}" --pretrain warm nowarm ratio tapt ${six:+warm6}
cat timings.txt
