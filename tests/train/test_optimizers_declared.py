"""The `--optimizer` choices (settings.OPTIMIZERS) and what `build_optimizer` builds are one list: every declared
name builds an optimizer that takes a step, and an undeclared one is a one-line error naming the choices."""

from __future__ import annotations

import pytest
import torch

from bertkit.errors import BertkitError
from bertkit.settings import OPTIMIZERS
from bertkit.train.optim import build_optimizer


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_every_declared_optimizer_builds_and_steps(name):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    before = model.weight.detach().clone()
    optimizer = build_optimizer(model, name, 1e-2, 0.01, (0.9, 0.999), 1e-6)
    model(torch.randn(8, 4)).pow(2).mean().backward()
    optimizer.step()
    assert not torch.equal(model.weight, before)


def test_an_undeclared_optimizer_is_refused_naming_the_choices():
    with pytest.raises(BertkitError, match="use one of " + ", ".join(OPTIMIZERS)):
        build_optimizer(torch.nn.Linear(2, 2), "sgd", 1e-2, 0.0, (0.9, 0.999), 1e-6)
