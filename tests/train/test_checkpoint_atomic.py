"""Checkpoint directories: atomic (a failed save leaves nothing and keeps the previous one), verified
by manifest hashes, keep-last-N, and `--resume auto` skipping partial or corrupt checkpoints."""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from bertkit.errors import BertkitError
from bertkit.runtime.device import seed_everything
from bertkit.train import checkpoint as ckpt


def _write_files(directory: Path, payload: bytes = b"weights") -> None:
    (directory / "model.safetensors").write_bytes(payload)
    ckpt.write_json(directory / "trainer_state.json", {"step": 1})


def _save(root: Path, step: int) -> Path:
    return ckpt.save_atomically(root, ckpt.checkpoint_name(step), _write_files)


def test_save_writes_manifest_with_hashes(tmp_path):
    path = _save(tmp_path, 5)
    manifest = ckpt.read_json(path / ckpt.MANIFEST)
    assert sorted(manifest["files"]) == ["model.safetensors", "trainer_state.json"]
    assert ckpt.verify_checkpoint(path) is None


def test_failed_save_leaves_nothing_and_keeps_previous(tmp_path):
    previous = _save(tmp_path, 1)

    def crash(directory: Path) -> None:
        _write_files(directory)
        raise KeyboardInterrupt  # killed mid-save

    with pytest.raises(KeyboardInterrupt):
        ckpt.save_atomically(tmp_path, ckpt.checkpoint_name(2), crash)
    assert [p.name for p in tmp_path.iterdir()] == [previous.name]
    assert ckpt.find_latest_valid(tmp_path) == previous


def test_auto_resume_skips_partial_and_corrupt_with_warning(tmp_path, caplog):
    good = _save(tmp_path, 1)
    corrupt = _save(tmp_path, 2)
    (corrupt / "model.safetensors").write_bytes(b"bit rot")
    partial = tmp_path / ckpt.checkpoint_name(3)
    partial.mkdir()
    _write_files(partial)  # renamed without a manifest: never written by us, but must not be trusted
    with caplog.at_level(logging.WARNING):
        assert ckpt.resolve_resume("auto", tmp_path) == good
    assert "step-00000003: no manifest.json" in caplog.text
    assert "step-00000002: model.safetensors does not match" in caplog.text
    with pytest.raises(BertkitError, match="not a valid checkpoint"):
        ckpt.resolve_resume(corrupt, tmp_path)


def test_resume_rules_without_resume_and_with_overwrite(tmp_path, caplog):
    assert ckpt.resolve_resume(None, tmp_path) is None  # a fresh directory
    _save(tmp_path, 1)
    with pytest.raises(BertkitError, match="--resume auto, start over with --overwrite"):
        ckpt.resolve_resume(None, tmp_path)
    with pytest.raises(BertkitError, match="contradict"):
        ckpt.resolve_resume("auto", tmp_path, overwrite=True)
    with caplog.at_level(logging.INFO):
        assert ckpt.resolve_resume(None, tmp_path, overwrite=True) is None
    assert ckpt.list_checkpoints(tmp_path) == [] and "deleted 1 checkpoints" in caplog.text
    assert all(r.levelno == logging.INFO for r in caplog.records)  # what the user asked for: no warning


def test_resume_auto_lists_at_most_five_broken_checkpoints(tmp_path):
    for step in range(1, 8):
        (_save(tmp_path, step) / "model.safetensors").write_bytes(b"bit rot")
    with pytest.raises(BertkitError, match=r"step-00000007 .*step-00000003 .*; and 2 more\. Not starting over"):
        ckpt.resolve_resume("auto", tmp_path)


def test_stale_temporary_directories_are_removed(tmp_path):
    (tmp_path / f"{ckpt.TEMP_PREFIX}step-00000004-999").mkdir()
    assert ckpt.remove_stale_temps(tmp_path) == 1
    assert list(tmp_path.iterdir()) == []


def test_keep_last_n(tmp_path):
    for step in (1, 2, 3, 4):
        _save(tmp_path, step)
    ckpt.prune_checkpoints(tmp_path, keep_last=2)
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["step-00000003", "step-00000004"]


def test_optimizer_state_round_trips_without_pickle(tmp_path):
    parameter = torch.nn.Parameter(torch.randn(3, 2))
    optimizer = torch.optim.AdamW([parameter], lr=0.1)
    parameter.grad = torch.randn(3, 2)
    optimizer.step()
    ckpt.save_optimizer(optimizer, tmp_path)
    fresh = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(3, 2))], lr=0.5)
    ckpt.load_optimizer(fresh, tmp_path)
    original, loaded = optimizer.state_dict(), fresh.state_dict()
    assert loaded["param_groups"] == original["param_groups"]
    for slot, value in original["state"][0].items():
        assert torch.equal(loaded["state"][0][slot], value), slot


def test_resume_keeps_this_runs_fused_optimizer_and_grad_scaler_works(tmp_path):
    """A checkpoint saved by a non-fused AdamW must not switch the fused one off on resume: its flag would
    be replaced while torch's grad-scaler support still points at the fused path (an assertion in step)."""
    parameter = torch.nn.Parameter(torch.randn(3, 2))
    old = torch.optim.AdamW([parameter], lr=0.1)
    parameter.grad = torch.randn(3, 2)
    old.step()
    ckpt.save_optimizer(old, tmp_path)
    resumed = torch.optim.AdamW([parameter], lr=0.1, fused=True)
    ckpt.load_optimizer(resumed, tmp_path)
    assert resumed.param_groups[0]["fused"] is True and resumed.param_groups[0]["lr"] == 0.1
    scaler = torch.amp.GradScaler("cpu")
    resumed.zero_grad()
    scaler.scale((parameter ** 2).sum()).backward()
    scaler.step(resumed)  # raised AssertionError when the flag came from the checkpoint


def test_rng_state_round_trips():
    seed_everything(3)
    state = ckpt.capture_rng_state()
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    ckpt.restore_rng_state(json.loads(json.dumps(state)))
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected
