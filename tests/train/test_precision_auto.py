"""precision='auto' picks bf16 exactly where the hardware has bf16 units."""

from __future__ import annotations

from pathlib import Path

import torch

from bertkit.train import loop


def test_auto_follows_cpu_bf16_flags(monkeypatch):
    cpu = torch.device("cpu")
    for flags, expected in [("fpu sse avx512f avx512_bf16", "bf16"), ("fpu amx_bf16 amx_tile", "bf16"),
                            ("fpu sse avx2", "fp32")]:
        monkeypatch.setattr(Path, "read_text", lambda self, encoding=None, flags=flags: f"flags\t: {flags}\n")
        assert loop.resolve_precision("auto", cpu) == expected
    assert loop.resolve_precision("fp32", cpu) == "fp32"


def test_auto_is_fp32_when_cpu_flags_cannot_be_read(monkeypatch):
    def unreadable(self, encoding=None):
        raise OSError("no /proc here")

    monkeypatch.setattr(Path, "read_text", unreadable)
    assert loop.resolve_precision("auto", torch.device("cpu")) == "fp32"
