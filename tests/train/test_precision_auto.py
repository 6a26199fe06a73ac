"""precision='auto' for training is the measured choice (bertkit.runtime.probe), never read from CPU flags:
this machine's flags name avx512_bf16 either way, and the answer follows the measurements."""

from __future__ import annotations

import contextlib

import torch

from bertkit.runtime import device as runtime
from bertkit.runtime import probe
from bertkit.train import TrainConfig
from bertkit.train.distributed import DistributedContext
from bertkit.workflows.prepare import prepare_training


def test_auto_follows_the_measurements_not_the_flags(use_profile):
    cpu = torch.device("cpu")
    use_profile("intel-xeon-no-amx")  # avx512_bf16, but bf16 0.6x fp32
    assert runtime.resolve_precision("auto", cpu) == "fp32"
    config = TrainConfig(max_steps=1, learning_rate=1e-3, precision="auto")
    _, resolved = prepare_training(torch.nn.Linear(4, 4), config, DistributedContext(device=cpu))
    assert resolved.precision == "fp32" and runtime.autocast(resolved.precision, cpu) is contextlib.nullcontext
    use_profile("amd-epyc")
    assert runtime.resolve_precision("auto", cpu) == "bf16"
    assert runtime.resolve_precision("fp32", cpu) == "fp32" and runtime.resolve_precision("bf16", cpu) == "bf16"


def test_auto_is_measured_at_the_models_width(monkeypatch):
    asked = []
    monkeypatch.setattr(probe, "auto_precision",
                        lambda device, width, purpose: asked.append((width, purpose)) or "fp32")
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.Linear(1024, 256), torch.nn.Linear(256, 256))
    runtime.resolve_precision("auto", torch.device("cpu"), model)
    runtime.resolve_precision("auto", torch.device("cpu"))
    assert asked == [(256, "training"), (probe.DEFAULT_WIDTH, "training")]
