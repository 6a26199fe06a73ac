"""--head-warmup-steps and --encoder-lr-ratio: during the head warm-up the encoder's weights stay exactly as they
were (its learning rate is 0) while the heads train; after it the encoder trains, at the ratio of the heads'
learning rate; a run killed before the unfreeze resumes across it bit-exactly; and the settings are checked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch import nn
from toy_training import toy_data, toy_loss, train_losses

from bertkit.config import preset
from bertkit.errors import BertkitError
from bertkit.model import BertForPreTraining
from bertkit.train import TrainConfig, fit
from bertkit.train import checkpoint as ckpt
from bertkit.train.optim import parameter_groups


class ToyWithHead(nn.Module):
    """An encoder (`body`, named by base_model_prefix as BERT's task models name `bert`) and a head."""

    base_model_prefix = "body"

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.body = nn.Sequential(nn.Linear(4, 16), nn.Dropout(0.2), nn.Tanh(), nn.LayerNorm(16))
        self.head = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


CONFIG = dict(max_steps=8, micro_batch_size=4, learning_rate=1e-2, precision="fp32", warmup_steps=2, save_every=3,
              keep_last=5, log_every=1, head_warmup_steps=4)


def _weights(run_dir: Path, step: int) -> dict[str, torch.Tensor]:
    return load_file(str(run_dir / "checkpoints" / f"step-{step:08d}" / "model.safetensors"))


def _records(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == "train"]


@pytest.mark.parametrize("optimizer", ["adamw", "lamb"])
def test_encoder_unchanged_during_warmup_then_trained(optimizer, tmp_path):
    initial = {name: tensor.clone() for name, tensor in ToyWithHead().state_dict().items()}
    fit(ToyWithHead(), toy_loss, toy_data(), TrainConfig(**{**CONFIG, "save_every": 4, "optimizer": optimizer}),
        tmp_path)
    at_unfreeze, final = _weights(tmp_path, 4), _weights(tmp_path, 8)
    for name, tensor in initial.items():
        if name.startswith("body."):
            assert torch.equal(at_unfreeze[name], tensor), name  # bit for bit, weight decay included
            assert not torch.equal(final[name], tensor), name
        else:
            assert not torch.equal(at_unfreeze[name], tensor), name
    records = _records(tmp_path)
    assert [r["encoder_lr"] for r in records[:4]] == [0.0] * 4
    # then its own warm-up over as many steps again: 1/4, 2/4, 3/4 of the heads' rate, then all of it
    assert [r["encoder_lr"] for r in records[4:]] == pytest.approx([f * r["lr"] for f, r in
                                                                    zip((0.25, 0.5, 0.75, 1.0), records[4:])])


def test_encoder_lr_ratio_scales_the_encoder_only(tmp_path):
    fit(ToyWithHead(), toy_loss, toy_data(), TrainConfig(**{**CONFIG, "head_warmup_steps": 0,
                                                           "encoder_lr_ratio": 0.25}), tmp_path)
    records = _records(tmp_path)
    assert all(r["encoder_lr"] == pytest.approx(0.25 * r["lr"]) for r in records)
    assert records[-1]["lr"] > 0


class Killed(Exception):
    pass


def test_a_run_killed_before_the_unfreeze_resumes_across_it_exactly(tmp_path):
    straight = tmp_path / "straight"
    fit(ToyWithHead(), toy_loss, toy_data(), TrainConfig(**CONFIG), straight)
    calls = {"n": 0}

    def dies_in_step_5(model, batch):
        calls["n"] += 1
        if calls["n"] == 5:
            raise Killed
        return toy_loss(model, batch)
    interrupted = tmp_path / "interrupted"
    with pytest.raises(Killed):
        fit(ToyWithHead(), dies_in_step_5, toy_data(), TrainConfig(**CONFIG), interrupted)
    assert [p.name for p in ckpt.list_checkpoints(interrupted / "checkpoints")] == ["step-00000003"]
    fit(ToyWithHead(seed=7), toy_loss, toy_data(), TrainConfig(**CONFIG), interrupted, resume="auto")
    assert train_losses(interrupted) == train_losses(straight)
    for name, tensor in _weights(straight, 8).items():
        assert torch.equal(tensor, _weights(interrupted, 8)[name]), name


def test_resuming_without_the_split_is_refused_with_the_flags_named(tmp_path):
    fit(ToyWithHead(), toy_loss, toy_data(), TrainConfig(**{**CONFIG, "max_steps": 3}), tmp_path)
    with pytest.raises(BertkitError, match="--head-warmup-steps above 0 or an --encoder-lr-ratio below 1"):
        fit(ToyWithHead(), toy_loss, toy_data(), TrainConfig(**{**CONFIG, "head_warmup_steps": 0}), tmp_path,
            resume="auto")


def test_bert_groups_put_the_encoder_and_the_tied_decoder_apart_from_the_heads():
    model = BertForPreTraining(preset("bert-debug", vocab_size=40))
    groups = parameter_groups(model, 0.01, split_encoder=True)
    assert [(g["role"], g["weight_decay"]) for g in groups] == [("encoder", 0.01), ("encoder", 0.0),
                                                                ("head", 0.01), ("head", 0.0)]
    names = {id(p): name for name, p in model.named_parameters()}
    encoder = {names[id(p)] for g in groups[:2] for p in g["params"]}
    head = {names[id(p)] for g in groups[2:] for p in g["params"]}
    assert encoder and all(name.startswith("bert.") for name in encoder)
    assert head == {"mlm.transform.weight", "mlm.transform.bias", "mlm.norm.weight", "mlm.norm.bias", "mlm.bias",
                    "nsp.weight", "nsp.bias"}
    assert "bert.embeddings.word.weight" in encoder  # the MLM decoder shares it: held with the encoder
    assert sum(len(g["params"]) for g in groups) == len(list(model.parameters()))


@pytest.mark.parametrize("changes, message", [
    ({"head_warmup_steps": -1}, "--head-warmup-steps must be >= 0"),
    ({"encoder_lr_ratio": 0.0}, r"--encoder-lr-ratio must be in \(0, 1\]"),
    ({"encoder_lr_ratio": float("nan")}, "--encoder-lr-ratio"),
])
def test_bad_settings_are_refused(changes, message):
    with pytest.raises(BertkitError, match=message):
        TrainConfig(**{**CONFIG, **changes})


def test_a_model_without_an_encoder_or_a_head_is_refused(tmp_path):
    plain = nn.Sequential(nn.Linear(4, 1))
    with pytest.raises(BertkitError, match="names no encoder"):
        parameter_groups(plain, 0.01, split_encoder=True)
    headless = ToyWithHead()
    headless.head.requires_grad_(False)
    with pytest.raises(BertkitError, match="no trainable parameters outside its encoder"):
        parameter_groups(headless, 0.01, split_encoder=True)


def test_a_part_of_the_encoder_the_checkpoint_lacked_trains_with_the_heads(tmp_path):
    """A pooler missing from a masked-LM checkpoint is random: held still, a classifier would probe noise."""
    from bertkit.model import BertForMaskedLM, BertForSequenceClassification

    BertForMaskedLM(preset("bert-debug", vocab_size=40)).save_pretrained(tmp_path / "mlm")
    model = BertForSequenceClassification.from_pretrained(tmp_path / "mlm", num_labels=2)
    assert any(name.startswith("bert.pooler.") for name in model.newly_initialized)
    groups = parameter_groups(model, 0.01, split_encoder=True)
    names = {id(p): name for name, p in model.named_parameters()}
    head = {names[id(p)] for g in groups if g["role"] == "head" for p in g["params"]}
    assert head == {"bert.pooler.weight", "bert.pooler.bias", "classifier.weight", "classifier.bias"}


def test_a_checkpoint_whose_groups_hold_other_parameters_is_refused_in_one_line(tmp_path):
    fit(ToyWithHead(), toy_loss, toy_data(), TrainConfig(**{**CONFIG, "max_steps": 3}), tmp_path)
    model = ToyWithHead()
    model.head.bias.requires_grad_(False)  # as a newer version freezing a part (the embedding model's pooler)
    with pytest.raises(BertkitError, match=r"param_groups\[3\] holds 1 parameters where this model trains 0"):
        fit(model, toy_loss, toy_data(), TrainConfig(**CONFIG), tmp_path, resume="auto")
