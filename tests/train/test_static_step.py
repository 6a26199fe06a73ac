"""The GPU step of issue 49 on a CPU: a `collate_static` batch gives the same loss, metrics and gradients as the
per-batch collate; the step reads nothing from the device (it runs on the meta device, where any read raises);
the loop's deferred reads log the same steps as reading every step, skip a non-finite step on the device and act
on a stop signal at the next read."""

from __future__ import annotations

import functools
import json
import os
import signal

import pytest
import torch
from static_batches import items, tiny, totals

from bertkit.data import collate_pretraining, collate_static
from bertkit.kernels.cross_entropy import masked_lm_loss
from bertkit.model import BertForMaskedLM, BertForPreTraining
from bertkit.model.attention import PaddedSDPA, RepaddedSDPA
from bertkit.model.fused import fuse_for_training
from bertkit.settings import TrainConfig
from bertkit.tasks.pretraining import PretrainingObjective
from bertkit.train import TrainingData, fit


@pytest.mark.parametrize("cls", [BertForPreTraining, BertForMaskedLM])
@pytest.mark.parametrize("full", [False, True], ids=["padded", "full-rows"])
def test_static_batches_give_the_per_batch_loss_metrics_and_gradients(cls, full):
    batch_items = items(6, full=full)
    objective = PretrainingObjective(nsp=cls is BertForPreTraining)
    results = []
    for batch in (collate_pretraining(batch_items), collate_static(batch_items, 0, 24, 10)):
        model = tiny(cls)
        loss, metrics = objective(model, batch, totals(objective, batch))
        loss.backward()
        results.append((loss, metrics, [p.grad for p in model.parameters() if p.grad is not None]))
    (loss_a, metrics_a, grads_a), (loss_b, metrics_b, grads_b) = results
    torch.testing.assert_close(loss_b, loss_a, atol=1e-6, rtol=1e-6)
    assert metrics_a.keys() == metrics_b.keys()
    for key in metrics_a:
        torch.testing.assert_close(metrics_b[key].double(), metrics_a[key].double(), atol=1e-6, rtol=1e-6)
    assert len(grads_a) == len(grads_b)
    for a, b in zip(grads_a, grads_b):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("fused", [False, True], ids=["plain", "fused-kernels"])
@pytest.mark.parametrize("full", [False, True], ids=["padded", "full-rows"])
def test_the_static_step_reads_nothing_from_the_device(fused, full):
    """On the meta device a tensor has no values: any read (item, a boolean index, nonzero, tolist) raises. The
    per-batch path does not get through; the static step (forward, loss, backward, clipping, the device-side
    guard) does. Attention is a backend that reads nothing (on a GPU: flash attention over the collator's
    cumulative lengths)."""
    model = tiny()
    objective = PretrainingObjective(mlm_loss=masked_lm_loss) if fused else PretrainingObjective()
    if fused:
        fuse_for_training(model)
    model = model.to("meta")
    host = collate_static(items(4, full=full), 0, 24, 10)
    model.bert.attention = PaddedSDPA() if full else RepaddedSDPA()
    batch = {key: value.to("meta") for key, value in host.items()}
    loss, _ = objective(model, batch, {k: v.to("meta") for k, v in totals(objective, host).items()})
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(list(model.parameters()), 1.0)
    found_inf = (~(torch.isfinite(loss) & torch.isfinite(norm))).float()
    assert loss.device.type == norm.device.type == found_inf.device.type == "meta"
    dynamic = {key: value.to("meta") for key, value in collate_pretraining(items(4, full=full)).items()}
    with pytest.raises((RuntimeError, NotImplementedError)):
        objective(model, dynamic, {k: v.to("meta") for k, v in totals(objective, host).items()})


def _fit(tmp_path, name: str, objective, **config) -> tuple[list[dict], dict[str, torch.Tensor], object]:
    model = tiny(dropout=0.1)
    settings = TrainConfig(**{"max_steps": 8, "micro_batch_size": 4, "learning_rate": 1e-3, "precision": "fp32",
                              "save_every": None, "log_every": 1, "seed": 0, **config})
    data = TrainingData(items(48), functools.partial(collate_static, pad_token_id=0, max_seq_length=24,
                                                     max_predictions=10), full_batches_only=True)
    result = fit(model, objective, data, settings, tmp_path / name)
    records = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if r["kind"] == "train"], model.state_dict(), result


def _without_clock(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "elapsed_s"} for r in records]


def test_reading_every_few_steps_logs_the_same_steps_and_weights(tmp_path):
    every, every_1, _ = _fit(tmp_path, "every-step", PretrainingObjective(), read_every=1)
    deferred, deferred_1, _ = _fit(tmp_path, "every-3", PretrainingObjective(), read_every=3)
    assert [r["step"] for r in deferred] == list(range(1, 9))
    assert _without_clock(deferred) == _without_clock(every)
    assert all(torch.equal(every_1[key], deferred_1[key]) for key in every_1)


class _PoisonedAt(PretrainingObjective):
    """The loss of one step is NaN (as an overflow would make it)."""

    def __init__(self, step: int) -> None:
        super().__init__()
        self.calls, self.step = 0, step

    def __call__(self, model, batch, totals):
        self.calls += 1
        loss, metrics = super().__call__(model, batch, totals)
        return (loss * float("nan"), metrics) if self.calls == self.step else (loss, metrics)


def test_a_nonfinite_step_is_skipped_on_the_device_and_counted_at_the_read(tmp_path):
    host, host_state, host_result = _fit(tmp_path, "host", _PoisonedAt(3), read_every=1)
    device, device_state, device_result = _fit(tmp_path, "device", _PoisonedAt(3), read_every=4)
    assert device_result.skipped_steps == host_result.skipped_steps == 1
    assert [r.get("skipped", False) for r in device] == [False, False, True, False, False, False, False, False]
    assert _without_clock(device) == _without_clock(host)
    assert all(torch.equal(host_state[key], device_state[key]) for key in host_state)


class _SignalsAt(PretrainingObjective):
    def __init__(self, step: int) -> None:
        super().__init__()
        self.calls, self.step = 0, step

    def __call__(self, model, batch, totals):
        self.calls += 1
        if self.calls == self.step:
            os.kill(os.getpid(), signal.SIGTERM)
        return super().__call__(model, batch, totals)


def test_a_stop_signal_takes_effect_at_the_next_read(tmp_path):
    records, _, result = _fit(tmp_path, "stopped", _SignalsAt(2), read_every=3)
    assert result.stop_reason == "signal" and result.step == 3 and [r["step"] for r in records] == [1, 2, 3]
    assert result.checkpoint is not None and result.checkpoint.name == "step-00000003"
