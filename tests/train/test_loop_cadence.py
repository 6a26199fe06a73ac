"""When the loop evaluates, saves and refreshes the progress bar: every N steps, at the end of every epoch
(`eval_every_epoch`, fine-tuning's default), after every evaluation (`save_on_eval`), and a progress bar
refreshed ten times per epoch or evaluation interval when `log_every` is unset."""

from __future__ import annotations

from pathlib import Path

import pytest
from toy_training import toy_data, toy_loss, toy_model

from bertkit.train import Hooks, TrainConfig, fit
from bertkit.train.cadence import Cadence
from bertkit.train.reporting import METRICS_FILE, read_metrics
from bertkit.train.resume import Counters

# 22 examples, batches of 5: 4 full batches and a tail of 2 = 5 optimizer steps per epoch
TOY = {"num_epochs": 2, "micro_batch_size": 5, "learning_rate": 1e-2, "precision": "fp32", "keep_last": 10}


def _run(directory: Path, **settings) -> tuple[list[int], list[int]]:
    """(steps evaluated, steps with a checkpoint on disk)."""
    fit(toy_model(), toy_loss, toy_data(22), TrainConfig(**{**TOY, **settings}), directory,
        hooks=Hooks(evaluate=lambda model: {"score": 0.0}))
    evals = [r["step"] for r in read_metrics(directory / METRICS_FILE) if r["kind"] == "eval"]
    saved = sorted(int(p.name.split("-")[1]) for p in (directory / "checkpoints").glob("step-*"))
    return evals, saved


def test_evaluation_at_the_end_of_every_epoch_and_a_checkpoint_at_each(tmp_path):
    assert _run(tmp_path / "epochs", eval_every_epoch=True, save_every=None, save_on_eval=True) == ([5, 10], [5, 10])
    assert _run(tmp_path / "steps", eval_every=3, save_every=None) == ([3, 6, 9, 10], [10])


def test_every_epoch_and_every_n_steps_together(tmp_path):
    evals, saved = _run(tmp_path, eval_every=3, eval_every_epoch=True, save_every=4, save_on_eval=True)
    assert evals == [3, 5, 6, 9, 10]
    assert saved == [3, 4, 5, 6, 8, 9, 10]


@pytest.mark.parametrize("eval_every, steps_per_epoch, expected", [
    (None, 40, 4), (25, 40, 2), (None, 5, 1), (100, 300, 10)])
def test_unset_log_every_refreshes_ten_times_per_epoch_or_evaluation(eval_every, steps_per_epoch, expected):
    config = TrainConfig(max_steps=10, eval_every=eval_every, log_every=None)
    assert Cadence(config, steps_per_epoch, Counters()).log_every == expected
    assert Cadence(TrainConfig(max_steps=10, log_every=7), steps_per_epoch, Counters()).log_every == 7


def test_a_run_resumed_with_another_split_evaluates_where_each_epoch_ends(tmp_path, caplog):
    """22 examples, global batch 4: split 4 ways (4 processes, or 4 micro-steps) the tail of 2 cannot give every
    part a sample, so an epoch is 5 steps; in one piece it is 6. Resumed from the first split into the second
    (issue 38), end-of-epoch evaluations follow the epochs the data makes, not multiples of the new length."""
    import os
    import signal

    calls = {"n": 0}

    def stop_at_step_7(model, batch):  # 4 micro-batches a step: the 25th call is step 7's first
        calls["n"] += 1
        if calls["n"] == 25:
            os.kill(os.getpid(), signal.SIGTERM)
        return toy_loss(model, batch)

    common = {"num_epochs": 3, "learning_rate": 1e-2, "precision": "fp32", "eval_every_epoch": True,
              "save_every": None, "global_batch_size": 4}
    evaluate = Hooks(evaluate=lambda model: {"score": 0.0})
    first = fit(toy_model(), stop_at_step_7, toy_data(22), TrainConfig(**common, micro_batch_size=1), tmp_path,
                hooks=evaluate)
    assert (first.stop_reason, first.step) == ("signal", 7)
    fit(toy_model(), toy_loss, toy_data(22), TrainConfig(**common, micro_batch_size=4), tmp_path, hooks=evaluate,
        resume="auto")
    evals = [r["step"] for r in read_metrics(tmp_path / METRICS_FILE) if r["kind"] == "eval"]
    assert evals[:3] == [5, 11, 17]  # epoch 0: 5 steps; epoch 1: steps 8-11 after the resume; epoch 2: 6 steps
    assert "an epoch is 6 optimizer steps with 1 process(es) x 1 micro-step(s) and was 5" in caplog.text
