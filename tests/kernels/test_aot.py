"""Every Triton kernel compiles for the H100/H200 (sm_90) at BERT's sizes, in bf16 and fp32, without spilling
registers: compiled ahead of time on this CPU-only machine by Triton's own compiler and ptxas (aot_compile.py,
in a process of its own, not interpreting). This is what says the kernels will compile on the GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .aot_compile import SPECS

pytest.importorskip("triton")


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> dict[str, dict[str, Any]]:
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path_factory.mktemp("triton-cache"))  # a cold compile, not the user's cache
    script = Path(__file__).with_name("aot_compile.py")
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout)
    for name, result in results.items():  # shown with -s, and in the log of a failure
        print(f"{name:55s} " + ("error" if "error" in result else
                                "{registers} registers, {local_bytes} B local, {shared_bytes} B shared, "
                                "{num_warps} warps".format(**result)))
    return results


@pytest.mark.parametrize("name", list(SPECS))
def test_kernel_compiles_for_sm90_without_spills(compiled, name):
    result = compiled[name]
    assert "error" not in result, result.get("error")
    assert result["local_bytes"] == 0 and result["stack_bytes"] == 0, f"{name} spills registers: {result}"
    assert result["num_warps"] == SPECS[name].num_warps
    assert result["registers"] <= 255
