"""bertkit.allocator: large tensors are reused, not mapped afresh (and page-faulted) on every forward."""

from __future__ import annotations

import resource
import sys

import pytest
import torch

import bertkit.cli
from bertkit import allocator

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")


def _minor_faults_of_a_fresh_64_mib_tensor() -> int:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    torch.ones(16 * 1024 * 1024)  # 64 MiB, written in full, then freed
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


@linux
def test_a_freed_large_tensor_is_reused_without_page_faults():
    assert allocator.keep_freed_memory()
    _minor_faults_of_a_fresh_64_mib_tensor()  # the first one grows the heap
    # 16,384 pages would each fault in a fresh mapping; reused memory faults on (almost) none of them
    assert min(_minor_faults_of_a_fresh_64_mib_tensor() for _ in range(3)) < 1_000


def test_the_environment_turns_it_off(monkeypatch):
    monkeypatch.setenv("BERTKIT_KEEP_FREED_MEMORY", "0")
    allocator.keep_freed_memory.cache_clear()
    try:
        assert allocator.keep_freed_memory() is False
    finally:
        allocator.keep_freed_memory.cache_clear()


def test_every_command_and_inference_copy_sets_it(monkeypatch):
    calls = []
    monkeypatch.setattr(bertkit.cli, "keep_freed_memory", lambda: calls.append("cli"))
    assert bertkit.cli.main(["--help"]) == 0
    from bertkit.config import preset
    from bertkit.model import BertModel, accelerate, for_inference

    monkeypatch.setattr(accelerate, "keep_freed_memory", lambda: calls.append("inference"))
    for_inference(BertModel(preset("bert-debug")), "fp32")
    assert calls == ["cli", "inference"]
