"""One run description (issue 36): a settings object checks itself when it is made, every setting has one name
and one declaration, and fine-tuning's settings hold a TrainConfig instead of re-declaring its fields."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from bertkit import settings
from bertkit.errors import BertkitError
from bertkit.quickstart.config import QuickstartSettings
from bertkit.settings import (
    DeviceChoice,
    FinetuneSettings,
    InferencePrecision,
    InstanceSettings,
    PretrainSettings,
    TorchThreads,
    TrainConfig,
    finetune_training,
)


def _settings_classes() -> list[type]:
    return [value for name in settings.__all__ if isinstance(value := getattr(settings, name), type)
            and dataclasses.is_dataclass(value)]


@pytest.mark.parametrize(("make", "message"), [
    (lambda: InstanceSettings(max_seq_length=3), "--max-seq-length must be in"),  # once checked only by its caller
    (lambda: InstanceSettings(masking="sometimes"), "--masking 'sometimes': use one of static, dynamic"),
    (lambda: TrainConfig(max_steps=1, optimizer="sgd"), "--optimizer 'sgd': use one of adamw, lamb"),
    (lambda: TrainConfig(max_steps=1, threads=0), "--threads must be >= 1"),
    (lambda: PretrainSettings(data="d", model="m", output="o", dropout=1.0), "--dropout must be in"),
    (lambda: FinetuneSettings.of(model="m", output=Path("o"), num_epochs=0), "--epochs must be positive"),
])
def test_a_settings_object_checks_itself_when_made(make, message):
    with pytest.raises(BertkitError, match=message):
        make()


def test_a_list_where_a_tuple_is_declared_is_taken_as_the_tuple():  # as JSON and library callers give them
    config = TrainConfig(max_steps=1, allow_change=["seed", "data"], betas=[0.9, 0.98])
    assert (config.allow_change, config.betas) == (("seed", "data"), (0.9, 0.98))


def test_replace_checks_again():
    with pytest.raises(BertkitError, match="--warmup-ratio"):
        dataclasses.replace(TrainConfig(max_steps=1), warmup_ratio=2.0)


def test_finetune_settings_hold_a_train_config_and_share_no_field_with_it():
    own = {field.name for field in dataclasses.fields(FinetuneSettings)}
    assert own.isdisjoint(field.name for field in dataclasses.fields(TrainConfig))
    assert FinetuneSettings(model="m", output=Path("o")).train == finetune_training()
    defaults = finetune_training()  # the paper's fine-tuning recipe
    assert (defaults.num_epochs, defaults.warmup_ratio, defaults.learning_rate, defaults.adam_epsilon) == (
        3.0, 0.1, None, 1e-8)
    assert (defaults.save_every, defaults.compile) == (None, False)
    flat = FinetuneSettings.of(model="m", output=Path("o"), seeds=(1, 2), num_epochs=1.0, batch_size=4)
    assert flat.seeds == (1, 2) and (flat.train.num_epochs, flat.train.batch_size) == (1.0, 4)
    assert flat.train.warmup_ratio == 0.1  # fine-tuning's default, not the loop's 0.01


@pytest.mark.parametrize(("name", "mixin", "expected"), [
    ("threads", TorchThreads, {"TrainConfig", "ExtractSettings", "PredictSettings", "ServeSettings"}),
    ("device", DeviceChoice, {"TrainConfig", "PredictSettings", "QuickstartSettings"}),
    ("precision", InferencePrecision, {"ExtractSettings", "PredictSettings", "ServeSettings"}),
])
def test_a_setting_several_commands_take_is_declared_once(name, mixin, expected):
    """--threads, --device and the inference --precision are one field each wherever they appear: one
    docstring, one help text (training's --precision is TrainConfig's, which every training command holds)."""
    declared = mixin.__dataclass_fields__[name]
    holders = {cls.__name__: cls for cls in [*_settings_classes(), QuickstartSettings]
               if name in cls.__dataclass_fields__ and not issubclass(cls, mixin)}
    holders.pop("TokenizerTrainSettings", None)  # its threads are the tokenizers library's pool: another setting
    if name == "precision":
        holders.pop("TrainConfig")  # training precisions (fp16 with a scaler), the one training declaration
    assert not holders, f"{name} declared again in {sorted(holders)}"
    users = {cls.__name__ for cls in [*_settings_classes(), QuickstartSettings] if issubclass(cls, mixin)}
    assert users >= expected
    assert all(cls.__dataclass_fields__[name] is declared for cls in [*_settings_classes(), QuickstartSettings]
               if issubclass(cls, mixin))


def test_one_suffix_per_role():
    """*Config: what a model or the loop is built from and saved with (config.json, trainer_state.json);
    *Settings: what a command is generated from."""
    for cls in _settings_classes():
        if cls.__name__ in ("TrainConfig", "Limits"):
            continue
        assert cls.__name__.endswith("Settings") or cls.__name__ in ("BatchSizes", "TorchThreads", "DeviceChoice",
                                                                     "InferencePrecision"), \
            cls.__name__
