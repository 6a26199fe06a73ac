"""Exact resume: N steps straight == k steps, kill, resume, N - k steps (per-step losses and final
weights bit-identical on CPU), mid-epoch and with gradient accumulation; SIGTERM saves and resumes;
and dropping any one piece of restored state breaks the equality (so every piece is needed)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from toy_training import toy_data, toy_loss, toy_model, train_losses

from bertkit.runtime.device import seed_everything
from bertkit.train import TrainConfig, fit
from bertkit.train import checkpoint as ckpt

# 20 samples, global batch 3 x 2 = 6: 3 full steps + a tail of 2 per epoch -> 4 steps per epoch;
# a kill after step 5 is mid-epoch (epoch 1, one step in) and the run crosses two epoch boundaries.
CONFIG = dict(max_steps=10, micro_batch_size=3, gradient_accumulation_steps=2, learning_rate=1e-2, precision="fp32",
              warmup_steps=3, save_every=5, keep_last=5, log_every=1)


class Killed(Exception):
    """Stands in for the process dying mid-step (no save happens)."""


def killing_loss(after_calls: int):
    calls = {"n": 0}

    def loss_fn(model, batch):
        calls["n"] += 1
        if calls["n"] > after_calls:
            raise Killed
        return toy_loss(model, batch)
    return loss_fn


def final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(ckpt.list_checkpoints(run_dir / "checkpoints")[-1] / "model.safetensors"))


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("straight")
    fit(toy_model(), toy_loss, toy_data(), TrainConfig(**CONFIG), run_dir)
    return run_dir


def interrupted_run(run_dir: Path) -> None:
    """Five steps (10 micro-batches) complete, checkpoint at 5, then dies in step 6."""
    with pytest.raises(Killed):
        fit(toy_model(), killing_loss(after_calls=11), toy_data(), TrainConfig(**CONFIG), run_dir)
    assert [p.name for p in ckpt.list_checkpoints(run_dir / "checkpoints")] == ["step-00000005"]


def resumed_losses(run_dir: Path) -> list[float]:
    # A different init seed: the weights must come from the checkpoint.
    result = fit(toy_model(seed=7), toy_loss, toy_data(), TrainConfig(**CONFIG), run_dir, resume="auto")
    assert result.step == CONFIG["max_steps"]
    return train_losses(run_dir)


def test_resume_is_bit_exact(straight, tmp_path):
    interrupted_run(tmp_path)
    assert resumed_losses(tmp_path) == train_losses(straight)
    for name, tensor in final_weights(straight).items():
        assert torch.equal(tensor, final_weights(tmp_path)[name]), name


def test_sigterm_finishes_the_step_saves_and_resumes_exactly(straight, tmp_path):
    calls = {"n": 0}

    def loss_fn(model, batch):
        calls["n"] += 1
        if calls["n"] == 7:  # first micro-batch of step 4
            os.kill(os.getpid(), signal.SIGTERM)
        return toy_loss(model, batch)

    result = fit(toy_model(), loss_fn, toy_data(), TrainConfig(**CONFIG), tmp_path)
    assert (result.stop_reason, result.step) == ("signal", 4)
    assert result.checkpoint.name == "step-00000004"
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # handler removed again
    assert resumed_losses(tmp_path) == train_losses(straight)


def _rewrite(checkpoint: Path, edit) -> None:
    edit(checkpoint)
    (checkpoint / ckpt.MANIFEST).unlink()
    ckpt.write_manifest(checkpoint)


def _drop_optimizer(checkpoint: Path) -> None:
    save_file({}, str(checkpoint / "optimizer.safetensors"))
    meta = ckpt.read_json(checkpoint / "optimizer.json")
    ckpt.write_json(checkpoint / "optimizer.json", {**meta, "scalars": {}})


def _edit_trainer_state(checkpoint: Path, edit) -> None:
    state = ckpt.read_json(checkpoint / "trainer_state.json")
    edit(state)
    ckpt.write_json(checkpoint / "trainer_state.json", state)


def _drop_data_position(checkpoint: Path) -> None:
    _edit_trainer_state(checkpoint, lambda s: s["data"].update(epoch=0, samples_in_epoch=0))


def _drop_rng(checkpoint: Path) -> None:
    seed_everything(1234)
    ckpt.write_json(checkpoint / "rng.json", {"ranks": [ckpt.capture_rng_state()]})


@pytest.mark.parametrize("drop", [_drop_optimizer, _drop_data_position, _drop_rng],
                         ids=["optimizer", "data-position", "rng"])
def test_dropping_any_restored_piece_breaks_equality(straight, tmp_path, drop):
    # (The grad scaler is the fifth piece; it exists only for fp16 on CUDA and is saved the same way.)
    interrupted_run(tmp_path)
    _rewrite(ckpt.list_checkpoints(tmp_path / "checkpoints")[0], drop)
    losses = resumed_losses(tmp_path)
    expected = train_losses(straight)
    assert losses[:5] == expected[:5]
    assert losses[5:] != expected[5:]


def test_checkpoint_holds_no_pickle_and_verifies(straight):
    checkpoint = ckpt.list_checkpoints(straight / "checkpoints")[-1]
    names = sorted(p.name for p in checkpoint.iterdir())
    assert names == ["manifest.json", "model.safetensors", "optimizer.json", "optimizer.safetensors",
                     "rng.json", "trainer_state.json"]
    assert ckpt.verify_checkpoint(checkpoint) is None
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    assert state["state"]["step"] == 10 and state["data"]["epoch"] == 2


def test_fresh_run_refuses_a_directory_with_checkpoints(straight):
    from bertkit.errors import BertkitError

    with pytest.raises(BertkitError, match="--resume auto"):
        fit(toy_model(), toy_loss, toy_data(), TrainConfig(**CONFIG), straight)


def test_a_signal_during_the_final_save_is_not_lost(tmp_path, monkeypatch):
    """The budget is spent, but SIGTERM arrived while the last checkpoint was written: the caller hears it."""
    real_save = ckpt.save_atomically

    def save_and_signal(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        return real_save(*args, **kwargs)

    monkeypatch.setattr(ckpt, "save_atomically", save_and_signal)
    result = fit(toy_model(), toy_loss, toy_data(), TrainConfig(**{**CONFIG, "save_every": None}), tmp_path)
    assert (result.step, result.stop_reason, result.signal) == (CONFIG["max_steps"], "signal", signal.SIGTERM)
