"""Training applied from outside (issue 36): `fit` runs the model and the TrainConfig it is given; the workflow
resolves the precision and the learning rate, places the model and wraps it for DDP (workflows.prepare), and
fit refuses a run nobody prepared instead of preparing it itself."""

from __future__ import annotations

import inspect

import pytest
import torch
from toy_training import toy_data, toy_loss, toy_model

from bertkit.errors import BertkitError
from bertkit.train import DistributedContext, TrainConfig, fit
from bertkit.workflows.prepare import prepare_training

READY = dict(max_steps=1, micro_batch_size=4, learning_rate=1e-2, precision="fp32")


def test_fit_takes_at_most_eight_parameters():
    assert len(inspect.signature(fit).parameters) <= 8


@pytest.mark.parametrize("unresolved", [{"precision": "auto"}, {"learning_rate": None}])
def test_an_unresolved_config_is_refused(tmp_path, unresolved):
    with pytest.raises(ValueError, match="resolve precision 'auto' and an unset learning rate first"):
        fit(toy_model(), toy_loss, toy_data(), TrainConfig(**{**READY, **unresolved}), tmp_path)


def test_a_model_off_the_training_device_is_refused(tmp_path):
    meta = DistributedContext(device=torch.device("meta"))
    with pytest.raises(ValueError, match="place it"):
        fit(toy_model(), toy_loss, toy_data(), TrainConfig(**READY), tmp_path, ctx=meta)


def test_a_process_group_needs_the_model_wrapped(tmp_path):
    group = DistributedContext(world_size=2)
    with pytest.raises(ValueError, match="wrapped for DDP"):
        fit(toy_model(), toy_loss, toy_data(), TrainConfig(**READY), tmp_path, ctx=group)


def test_early_stopping_without_a_metric_is_refused(tmp_path):
    with pytest.raises(BertkitError, match="--early-stopping-patience needs an evaluation metric"):
        fit(toy_model(), toy_loss, toy_data(), TrainConfig(**READY, early_stopping_patience=2), tmp_path)


def test_prepare_resolves_places_and_fit_runs_it(tmp_path):
    model, config = prepare_training(toy_model(), TrainConfig(**READY), DistributedContext())
    assert config.precision == "fp32" and next(model.parameters()).device.type == "cpu"
    assert fit(model, toy_loss, toy_data(), config, tmp_path).step == 1
    with pytest.raises(ValueError, match="resolve the learning rate first"):
        prepare_training(toy_model(), TrainConfig(**{**READY, "learning_rate": None}), DistributedContext())


def test_rank0_decides_raises_what_rank_0_met():
    from bertkit.train.distributed import rank0_decides

    alone = DistributedContext()
    assert rank0_decides(lambda: {"seed": 1}, alone) == {"seed": 1}
    with pytest.raises(BertkitError, match="no such run"):
        rank0_decides(lambda: (_ for _ in ()).throw(BertkitError("no such run")), alone)
    with pytest.raises(PermissionError):  # not only BertkitError: any error is every rank's
        rank0_decides(lambda: (_ for _ in ()).throw(PermissionError("read-only")), alone)
