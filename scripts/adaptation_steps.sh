# Sourced by scripts/adaptation_sweep.sh and scripts/mlm_head_adaptation.sh (in WORK_DIR): the timed stage and
# the KJV-task fine-tuning both studies run the same way.
#   stage NAME COMMAND...        run COMMAND, append "NAME SECONDs" to timings.txt
#   finetune NAME MODEL_DIR LR   the KJV task (train-1000.tsv; dev and test the bundled ones), seeds 1-3, into
#                                ft-NAME-LR/ (skipped when done), with --precision $PRECISION where it is set
stage() { local name=$1; shift; local t0; t0=$(date +%s); "$@"; echo "$name $(( $(date +%s) - t0 ))s" | tee -a timings.txt; }

DEV=$(python -c "from bertkit.assets import kjv_path; print(kjv_path('dev.tsv'))")
TEST=$(python -c "from bertkit.assets import kjv_path; print(kjv_path('test.tsv'))")
finetune() {
  [ -f "ft-$1-$3/eval_results.json" ] && return
  stage "finetune-$1-$3" bertkit finetune classification --model "$2" --train train-1000.tsv --dev "$DEV" \
      --dev "$TEST" --text-column text --label-column label --seeds 1,2,3 --epochs 3 --batch-size 32 \
      --learning-rate "$3" --max-seq-length 128 ${PRECISION:+--precision "$PRECISION"} --output "ft-$1-$3" 2>&1 \
      | tee "ft-$1-$3.log" | grep -E "learning rate|^seed|accuracy" || true
}
