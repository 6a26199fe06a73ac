"""The GPU check (issue 23 item 10, issue 28): what an H100 or H200 runs, in under 8 minutes, to tell
whether bertkit's CUDA paths work and how fast bert-base pre-trains against transformers.

    bash scripts/gpu_check.sh              # on the GPU machine, from the repository root (no install)
    bash scripts/gpu_check.sh --dry-run    # the same code paths on CPU, tiny model, well under a minute

Results go to $GPU_CHECK_OUT (else $OUT, else ./gpu_check_out): results.json, results.md, junit.xml and
gpu_check.log (every part's output). The parts, each in its own process with its own timeout
(`run.py`): `environment` (imports, device, driver, versions), `cuda_tests` (`pytest -m cuda tests/`),
`process_group` (a one-rank NCCL group driving `bertkit.train.fit`), `throughput` (bert-base phase-1
tokens/s and MFU, bertkit vs transformers), and, when time is left, `compile_smoke` and
`throughput_tf32`. Each part module has `run(options) -> (status, details, error)`.
"""
