"""Where the Triton kernels run and what a user is told where they cannot; bertkit imports and its ops run on
the reference path without Triton; the kernels are defined at first use, not at import."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from bertkit.kernels import triton_support


def test_reasons_name_the_fix(monkeypatch):
    monkeypatch.setattr(triton_support, "installed", lambda: False)
    assert "pip install triton" in triton_support.reason_unavailable(torch.device("cuda"))
    assert not triton_support.available(torch.device("cpu"))
    monkeypatch.undo()
    if triton_support.installed():
        assert "CUDA" in triton_support.reason_unavailable(torch.device("meta"))
        monkeypatch.setenv("TRITON_INTERPRET", "0")
        assert "TRITON_INTERPRET=1" in triton_support.reason_unavailable(torch.device("cpu"))
        monkeypatch.setenv("TRITON_INTERPRET", "1")
        assert triton_support.available(torch.device("cpu"))


@pytest.mark.parametrize(("rows", "programs", "per_program"), [(1, 1, 4), (37, 10, 4), (4096, 1024, 4),
                                                                (32768, 1024, 32), (10**6, 15625, 64)])
def test_row_groups_cover_the_rows(rows, programs, per_program):
    assert triton_support.row_groups(rows, max_programs=1024) == (programs, per_program)


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)


def test_ops_run_without_triton_and_importing_them_does_not_import_triton():
    done = _run("""
        import sys
        import torch
        from bertkit.kernels import cross_entropy, gelu, norm, triton_support
        assert "triton" not in sys.modules  # defined at first use only
        sys.modules["triton"] = None  # as if not installed
        assert "pip install triton" in triton_support.reason_unavailable(torch.device("cuda"))
        x = torch.randn(3, 16, requires_grad=True)
        norm.dropout_add_layer_norm(x, x, torch.ones(16), torch.zeros(16), 0.1, 1e-12).sum().backward()
        gelu.bias_gelu(x, torch.zeros(16)).sum().backward()
        cross_entropy.masked_lm_loss(x, torch.tensor([1, 2, 3]), torch.ones(3))[0].backward()
        print("ok")
    """)
    assert done.stdout.strip() == "ok", done.stderr[-2000:]
