"""Pre-emption that keeps the work (issue 38), in one process: DataLoader workers leave the stop to their
training process, the same stop request sent twice is one request, a stop skips a pending evaluation and saves
at once, and a grad scaler's overflow is the scaler's business, not a non-finite step. The torchrun cases (the
launcher signalled, every rank signalled twice, two trainings in one job) are in test_torchrun_lifecycle.py."""

from __future__ import annotations

import os
import signal
from types import SimpleNamespace

import pytest
import torch
from toy_training import toy_data, toy_loss, toy_model, train_losses

from bertkit.errors import BertkitError, Interrupted
from bertkit.train import Hooks, TrainConfig, fit, loop
from bertkit.train import checkpoint as ckpt
from bertkit.train import stop as stop_module
from bertkit.train.reporting import METRICS_FILE, read_metrics
from bertkit.train.resume import Counters

BASE = dict(micro_batch_size=4, learning_rate=1e-2, precision="fp32", warmup_steps=0, save_every=100, log_every=1)


class _SignalledInWorkers(torch.utils.data.Dataset):
    """Toy examples whose loading, in a DataLoader worker, sends that worker SIGTERM and SIGINT (as torchrun's
    killpg and a terminal's Ctrl-C reach every process of the group)."""

    def __init__(self) -> None:
        self.items = toy_data(16)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if torch.utils.data.get_worker_info() is not None:
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGINT)
        return self.items[index]


def test_dataloader_workers_leave_the_stop_to_their_training_process(tmp_path):
    result = fit(toy_model(), toy_loss, _SignalledInWorkers(), TrainConfig(**BASE, max_steps=3, num_workers=2),
                 tmp_path)
    assert (result.stop_reason, result.step) == ("budget", 3)  # not "DataLoader worker ... killed by signal"


def test_the_same_request_twice_is_one_request_and_a_later_one_aborts(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(stop_module.time, "monotonic", lambda: now[0])
    stop = stop_module.StopSignal()
    stop._handle(signal.SIGTERM, None)
    now[0] += 0.01  # the scheduler's SIGTERM, then torchrun's
    stop._handle(signal.SIGTERM, None)
    assert stop.requested and stop.signum == signal.SIGTERM
    now[0] += stop_module.SIGNAL_WINDOW_S  # a user who insists
    with pytest.raises(Interrupted, match="second SIGTERM"):
        stop._handle(signal.SIGTERM, None)


def test_a_stop_skips_the_pending_evaluation_and_saves_that_step(tmp_path):
    calls = {"n": 0}

    def loss_fn(model, batch):
        calls["n"] += 1
        if calls["n"] == 2:  # the step that evaluates (eval_every 2)
            os.kill(os.getpid(), signal.SIGTERM)
        return toy_loss(model, batch)

    result = fit(toy_model(), loss_fn, toy_data(), TrainConfig(**BASE, max_steps=6, eval_every=2), tmp_path,
                 hooks=Hooks(evaluate=lambda model: {"score": 0.0}))
    assert (result.stop_reason, result.step) == ("signal", 2)
    assert not [r for r in read_metrics(tmp_path / METRICS_FILE) if r["kind"] == "eval"]
    assert [p.name for p in ckpt.list_checkpoints(tmp_path / "checkpoints")] == ["step-00000002"]
    assert len(train_losses(tmp_path)) == 2
    # The resumed run owes that evaluation and makes it first, then goes on as an uninterrupted run would.
    fit(toy_model(), toy_loss, toy_data(), TrainConfig(**BASE, max_steps=6, eval_every=2), tmp_path,
        hooks=Hooks(evaluate=lambda model: {"score": 0.0}), resume="auto")
    records = [r for r in read_metrics(tmp_path / METRICS_FILE) if r["kind"] in ("train", "eval")]
    assert [(r["kind"], r["step"]) for r in records][2:4] == [("eval", 2), ("train", 3)]
    assert [r["step"] for r in records if r["kind"] == "eval"] == [2, 4, 6]


def _overflowed(scaler):
    model = torch.nn.Linear(3, 1)
    before = model.weight.detach().clone()
    for parameter in model.parameters():
        parameter.grad = torch.full_like(parameter, float("inf"))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if scaler is not None:
        scaler.scale(torch.tensor(0.5))  # as the loop's backward does, which starts the scaler's bookkeeping
    parts = SimpleNamespace(model=model, optimizer=optimizer, scaler=scaler)
    grad_norm = loop._optimizer_step(parts, TrainConfig(max_steps=1), loss=torch.tensor(0.5, dtype=torch.float64))
    assert torch.equal(model.weight, before)  # no step either way
    return grad_norm, loop._scaler_overflow(scaler, 0.5, float(grad_norm))


def test_a_grad_scaler_overflow_is_not_a_non_finite_step():
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    _, overflow = _overflowed(scaler)
    assert overflow and scaler.get_scale() == 512.0  # the scaler lowered its scale, as it intends
    counters, record = Counters(consecutive_nonfinite=0), {"loss": 0.5, "grad_norm": float("inf")}
    loop._tally(counters, record, overflow, reporter=None)
    assert counters.consecutive_nonfinite == 0 and counters.skipped_steps == 0 and record["scaler_overflow"]


def test_a_scale_halved_below_one_stops_the_run_as_the_non_finite_guard_would():
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0)
    _overflowed(scaler)
    loop._check_loss_scale(scaler, step=1)  # 1.0: the scaler settling
    _overflowed(scaler)
    with pytest.raises(BertkitError, match="lowered its loss scale below 1 by step 2"):
        loop._check_loss_scale(scaler, step=2)


def test_without_a_scaler_an_infinite_gradient_is_a_non_finite_step():
    _, overflow = _overflowed(None)
    assert not overflow
    counters, record = Counters(), {"loss": 0.5, "grad_norm": float("inf")}
    loop._tally(counters, record, overflow, reporter=SimpleNamespace(message=lambda text: None))
    assert counters.consecutive_nonfinite == 1 and counters.skipped_steps == 1 and record["skipped"]
