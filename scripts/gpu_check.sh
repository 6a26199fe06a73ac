#!/usr/bin/env bash
# The GPU check (scripts/gpu_check/__init__.py): environment, `pytest -m cuda tests/`, a one-rank NCCL
# group through bertkit.train.fit, and bert-base pre-training throughput/MFU against transformers, in
# under 8 minutes on an H100. Runs from source (no install): src/ and scripts/ go on PYTHONPATH.
#
#   bash scripts/gpu_check.sh              # on a GPU machine
#   bash scripts/gpu_check.sh --dry-run    # the same code paths on CPU with a tiny model
#   bash scripts/gpu_check.sh --help       # options (--out, --budget, --parts)
#
# Results: $GPU_CHECK_OUT (else $OUT, else ./gpu_check_out)/results.json, results.md, junit.xml, gpu_check.log.
# Exit status 0 when every required part passed. PYTHON=... picks the interpreter (default: python3).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
python="${PYTHON:-$(command -v python3 || command -v python)}"
export PYTHONPATH="$root/src:$root/scripts${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
exec "$python" -m gpu_check "$@"
