"""bertkit.runtime.allocator: large tensors are reused, not mapped afresh (and page-faulted) on every forward."""

from __future__ import annotations

import ctypes
import sys

import pytest
import torch

import bertkit.cli
from bertkit.runtime import allocator
from bertkit.train import DistributedContext, TrainConfig

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def _bytes_in_mmapped_blocks() -> int:
    """glibc's count of memory it handed out as separate mappings (mallinfo2().hblkhd)."""
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _Mallinfo2
    return int(libc.mallinfo2().hblkhd)


@linux
def test_a_large_tensor_comes_from_the_heap_not_a_fresh_mapping():
    """The mechanism itself: glibc maps a 64 MiB block afresh by default (threshold <= 32 MiB); here not."""
    if not allocator.keep_freed_memory():
        pytest.skip("mallopt refused or turned off")
    try:
        _bytes_in_mmapped_blocks()
    except AttributeError:
        pytest.skip("glibc before 2.33 has no mallinfo2")
    before = _bytes_in_mmapped_blocks()
    tensor = torch.empty(16 * 1024 * 1024)
    assert _bytes_in_mmapped_blocks() - before < 1024 * 1024
    del tensor


def test_the_environment_turns_it_off(monkeypatch):
    monkeypatch.setenv("BERTKIT_KEEP_FREED_MEMORY", "0")
    allocator.keep_freed_memory.cache_clear()
    try:
        assert allocator.keep_freed_memory() is False
    finally:
        allocator.keep_freed_memory.cache_clear()


def test_every_command_and_inference_entry_point_sets_it(monkeypatch, tmp_path):
    """The commands, the predictors a library caller loads, and training (workflows.prepare) set it; a model
    transform (accelerate_for_inference) changes no process-wide setting."""
    calls = []
    monkeypatch.setattr(bertkit.cli, "keep_freed_memory", lambda: calls.append("cli"))
    assert bertkit.cli.main(["--help"]) == 0
    from bertkit.config import preset
    from bertkit.model import BertModel, accelerate, for_inference
    from bertkit.serve import predictor
    from bertkit.tokenizer import WordPieceTokenizer
    from bertkit.workflows import prepare

    monkeypatch.setattr(predictor, "keep_freed_memory", lambda: calls.append("predictor"))
    monkeypatch.setattr(prepare, "keep_freed_memory", lambda: calls.append("training"))
    assert not hasattr(accelerate, "keep_freed_memory")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "cat"]
    BertModel(preset("bert-debug", vocab_size=len(vocab))).save_pretrained(
        tmp_path, tokenizer=WordPieceTokenizer(vocab))
    predictor.load_predictor(tmp_path)
    for_inference(BertModel(preset("bert-debug")), "fp32")
    prepare.prepare_training(torch.nn.Linear(2, 2), TrainConfig(max_steps=1, precision="fp32", learning_rate=1e-4),
                             DistributedContext())
    assert calls == ["cli", "predictor", "training"]
