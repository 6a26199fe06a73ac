"""precision='auto' for training is the measured choice (bertkit.hardware), never read from CPU flags:
this machine's flags name avx512_bf16 either way, and the answer follows the measurements."""

from __future__ import annotations

import contextlib

import torch

from bertkit import hardware, runtime
from bertkit.train import loop
from bertkit.train.distributed import DistributedContext


def test_auto_follows_the_measurements_not_the_flags(use_profile):
    cpu = torch.device("cpu")
    use_profile("intel-xeon-no-amx")  # avx512_bf16, but bf16 0.6x fp32
    assert runtime.resolve_precision("auto", cpu) == "fp32"
    config = loop.TrainConfig(max_steps=1, precision="auto")
    autocast, scaler = loop._precision(config, DistributedContext(device=cpu), torch.nn.Linear(4, 4))
    assert autocast is contextlib.nullcontext and scaler is None
    use_profile("amd-epyc")
    assert runtime.resolve_precision("auto", cpu) == "bf16"
    assert runtime.resolve_precision("fp32", cpu) == "fp32" and runtime.resolve_precision("bf16", cpu) == "bf16"


def test_auto_is_measured_at_the_models_width(monkeypatch):
    asked = []
    monkeypatch.setattr(hardware, "auto_precision",
                        lambda device, width, purpose: asked.append((width, purpose)) or "fp32")
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.Linear(1024, 256), torch.nn.Linear(256, 256))
    runtime.resolve_precision("auto", torch.device("cpu"), model)
    runtime.resolve_precision("auto", torch.device("cpu"))
    assert asked == [(256, "training"), (hardware.DEFAULT_WIDTH, "training")]
