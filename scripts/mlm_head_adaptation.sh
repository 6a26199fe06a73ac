#!/usr/bin/env bash
# Domain adaptation of a checkpoint released WITH its masked-LM (and NSP) head (issue 37, item 1's second
# checkpoint; docs/pretraining.md, "Domain adaptation"). No released BERT with its MLM weights is served by the
# package registry, so bertkit pre-trains a "general" bert-mini on text outside the target domain (WordNet
# 3.0's glosses, `scripts/study_data.py`; the bert-base-uncased vocabulary) and treats it as released (its
# bertkit_pretraining.json is left out, as a checkpoint made elsewhere has none). Then:
#   kjv:     ADAPT steps of `pretrain --init-from general` on the bundled KJV corpus (the recipe auto picks:
#            continue, with its NSP head kept and no head warm-up, since both heads came with the checkpoint);
#   general: the same steps on the general text again (the control: as many more steps, no new domain),
# and the three fine-tuned on the bundled KJV task (1,000 training verses, seeds 1-3, 3 epochs) at `auto` and
# at a small sweep (LRS); each model's best rate is chosen on dev and reported on test. Usage:
#   scripts/mlm_head_adaptation.sh WORDNET_DIR VOCAB_DIR WORK_DIR [GENERAL_STEPS] [ADAPT_STEPS] [LRS]
#     WORDNET_DIR: usr/share/wordnet of Debian's wordnet-base (scripts/study_data.py says how to get it);
#     VOCAB_DIR: a directory with the bert-base-uncased vocab.txt (e.g. all-MiniLM-L6-v2's, see "Try it" above);
#     GENERAL_STEPS default 3000; ADAPT_STEPS default 1000; LRS default "1e-4 3e-4 1e-3"
# Writes WORK_DIR/results.json and prints the table; each stage's wall time goes to WORK_DIR/timings.txt.
set -euo pipefail
WORDNET=$1 VOCAB=$2 WORK=$3 GENERAL=${4:-3000} ADAPT=${5:-1000} LRS=${6:-"1e-4 3e-4 1e-3"}
SCRIPTS=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$WORK"
cd "$WORK"
source "$SCRIPTS/adaptation_steps.sh"  # stage, finetune

python "$SCRIPTS/kjv_task_files.py"  # kjv.txt, train-1000.tsv, task-texts.txt
[ -d sd ] || python "$SCRIPTS/study_data.py" --wordnet "$WORDNET" --output sd > /dev/null
[ -d vocab ] || { mkdir vocab && cp "$VOCAB/vocab.txt" vocab/; }
[ -d data-wn ] || stage data-wn bertkit data pretraining --input sd/wordnet/corpus.txt --tokenizer vocab \
    --output data-wn --max-seq-length 64 --masking dynamic --seed 42 --quiet
[ -d data-kjv ] || stage data-kjv bertkit data pretraining --input kjv.txt --tokenizer vocab --output data-kjv \
    --max-seq-length 64 --masking dynamic --seed 42 --quiet
[ -d pt-general/final ] || stage pretrain-general bertkit pretrain --data data-wn --tokenizer vocab \
    --model bert-mini --output pt-general --max-steps "$GENERAL" --eval-examples 500 --eval-every 1000 \
    --save-every 1000
if [ ! -d released ]; then  # the general model as a checkpoint made elsewhere: no bertkit_pretraining.json
  cp -r pt-general/final released && rm released/bertkit_pretraining.json
fi
[ -d pt-kjv/final ] || stage pretrain-kjv bertkit pretrain --data data-kjv --init-from released --output pt-kjv \
    --max-steps "$ADAPT" --eval-examples 500 --eval-every 250 --save-every 1000
[ -d pt-control/final ] || stage pretrain-control bertkit pretrain --data data-wn --init-from released \
    --output pt-control --max-steps "$ADAPT" --eval-examples 500 --eval-every 250 --save-every 1000

for lr in auto $LRS; do
  finetune released released "$lr"
  finetune kjv pt-kjv/final "$lr"
  finetune general pt-control/final "$lr"
done

python "$SCRIPTS/adaptation_table.py" --compare kjv:released general:released kjv:general --at-auto \
    --pretrain general kjv control
cat timings.txt
