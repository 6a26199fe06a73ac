"""Keep freed memory in the process, so a model's large activations do not page-fault on every forward.

glibc's malloc serves each allocation above its mmap threshold (at most 32 MiB by default) with a fresh
`mmap` and hands it back to the kernel on `free`. A bert-base forward over 32 x 128 tokens allocates
dozens of such tensors (the (4096, 3072) feed-forward activation alone is 48 MiB in fp32), so every
forward and every training step touches new pages, and the kernel zeroes each one on first touch. The
time shows up in whatever op writes the tensor first (measured: docs/performance.md, "Full rows").

`keep_freed_memory()` raises glibc's mmap threshold to 1 GiB and its trim threshold likewise, with
`mallopt`, so large blocks come from the heap and freed ones are reused. The cost: the process keeps
its peak memory after the peak (freed blocks stay mapped, and are reused by the next step), which is
what a training run or a server does anyway (the measured cost: docs/performance.md, "Full rows"). Reuse is
not guaranteed: small allocations between two big ones can split a freed block, and the heap grows instead
(bounded).
PyTorch's CPU tuning guide recommends jemalloc or tcmalloc (LD_PRELOAD) for the same reason; this is
the step that needs no preload (not measured against them).

It is called by every `bertkit` command and by the library's entry points that run a model: predictors
(`load_predictor`), `extract_features`, `predict_file` and training (`workflows.prepare.prepare_training`);
a model transform never changes it. `BERTKIT_KEEP_FREED_MEMORY=0` in the environment turns it off.
Elsewhere than glibc (macOS, musl, Windows) it does nothing, and under a preloaded jemalloc or tcmalloc it
changes nothing (those allocators reuse memory already). This module imports no torch, so the CLI can call it
before any command loads.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
THRESHOLD = 1 << 30  # 1 GiB: any tensor a BERT allocates comes from the heap


@functools.cache
def keep_freed_memory() -> bool:
    """Make glibc's malloc keep and reuse freed large blocks (module docstring), once per process. True
    when the setting took effect; False where it was turned off or does not apply."""
    if os.environ.get("BERTKIT_KEEP_FREED_MEMORY", "1") == "0" or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")  # glibc's name on Linux (find_library would run ldconfig: ~15 ms)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # mallopt returns 1 on success; glibc before 2.26 refuses a threshold above 32 MiB (then nothing changes)
    return bool(mallopt(M_MMAP_THRESHOLD, THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, THRESHOLD))
