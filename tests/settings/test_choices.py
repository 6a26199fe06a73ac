"""bertkit.settings holds the choices each setting accepts; the modules that implement a setting must
implement exactly those choices (a choice offered by --help but unknown to the library, or the reverse,
would be a flag that fails at run time)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from bertkit import settings
from bertkit.config import preset
from bertkit.errors import BertkitError
from bertkit.inference import pooling
from bertkit.model import BertModel
from bertkit.model.feature_based import FeatureBasedModel, FeatureHead
from bertkit.runtime import device as runtime
from bertkit.tasks.metrics import entity_scores
from bertkit.train import optim


def test_the_schedules_are_the_implemented_ones():
    assert tuple(optim.SCHEDULES) == settings.LR_SCHEDULES


@pytest.mark.parametrize("name", settings.OPTIMIZERS)
def test_every_optimizer_builds(name):
    model = torch.nn.Linear(4, 2)
    optimizer = optim.build_optimizer(model, name, 1e-3, 0.01, (0.9, 0.999), 1e-6)
    assert isinstance(optimizer, torch.optim.Optimizer)


@pytest.mark.parametrize("combine", settings.FEATURE_COMBINES)
def test_every_feature_combination_runs(combine):
    model = FeatureBasedModel(BertModel(preset("bert-debug")), FeatureHead(3), (-1, -2), combine, 0.0)
    logits = model(input_ids=torch.tensor([[2, 5, 6, 3]])).logits
    assert logits.shape == (1, 3)


@pytest.mark.parametrize("scheme", settings.TAG_SCHEMES)
def test_every_tag_scheme_is_read(scheme):
    tags = {"BIO": ["B-PER", "I-PER", "O"], "IOB1": ["I-PER", "I-PER", "O"], "BIOES": ["B-PER", "E-PER", "O"]}[scheme]
    assert entity_scores([tags], [tags], scheme=scheme)["f1"] == 1.0


def test_the_precisions_and_devices_are_the_runtime_ones():
    assert [runtime.check_inference_precision(p) for p in settings.INFERENCE_PRECISIONS] == list(
        settings.INFERENCE_PRECISIONS)
    with pytest.raises(BertkitError, match="use one of auto, fp32, bf16, int8"):
        runtime.check_inference_precision("fp16")
    assert runtime.resolve_device("cpu") == torch.device("cpu")
    assert runtime.resolve_device("auto").type in ("cpu", "cuda")
    for precision in settings.PRECISIONS:  # every training precision is a valid TrainConfig
        settings.TrainConfig(max_steps=1, precision=precision)


def test_the_poolings_are_auto_and_the_implemented_ones():
    assert ("auto", *pooling.POOLINGS) == settings.POOLINGS


def test_the_settings_module_imports_neither_torch_nor_numpy():
    code = ("import sys, bertkit.settings, bertkit.quickstart.config; "
            "print(sorted({'torch', 'numpy', 'starlette'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
