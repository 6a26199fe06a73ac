"""A feature-based model computes its frozen features with an inference copy of its encoder when told how
to make one (`use_encoder_copy`): the same features as the plain encoder, a fresh copy after the encoder's
tensors change (load_state_dict, as a resumed run does; .to()), while state_dict, saving and copies still
see the plain encoder alone; the fine-tuning driver gives it the CPU-accelerated copy."""

from __future__ import annotations

import copy
import pickle

import torch

from bertkit.config import preset
from bertkit.model import BertModel, accelerate_for_inference
from bertkit.model.feature_based import FeatureBasedModel, FeatureHead


def _model() -> FeatureBasedModel:
    torch.manual_seed(0)
    return FeatureBasedModel(BertModel(preset("bert-mini", vocab_size=64)), FeatureHead(3, per_token=True),
                             (-1, -2), "concat", 0.0)


class _Counting(torch.nn.Module):
    """An encoder copy that counts its calls."""

    def __init__(self, encoder: torch.nn.Module) -> None:
        super().__init__()
        self.encoder, self.calls = encoder, 0

    def forward(self, *args, **kwargs):
        self.calls += 1
        return self.encoder(*args, **kwargs)


def test_the_copy_computes_the_same_features_and_trains_the_same_head():
    model = _model()
    ids = torch.randint(5, 64, (3, 11))
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    plain = model(ids, None, mask).logits
    made = []
    model.use_encoder_copy(lambda bert: made.append(_Counting(accelerate_for_inference(bert))) or made[-1])
    fast = model(ids, None, mask).logits
    model(ids, None, mask)
    assert len(made) == 1 and made[0].calls == 2  # made once, then reused
    torch.testing.assert_close(fast, plain, atol=1e-5, rtol=1e-5)
    fast.sum().backward()  # the head trains through features computed by the copy
    assert model.head.weight.grad is not None and model.head.weight.grad.abs().sum() > 0
    model.use_encoder_copy(None)
    torch.testing.assert_close(model(ids, None, mask).logits, plain)


def test_the_copy_is_not_part_of_the_model():
    model = _model()
    keys = set(model.state_dict())
    model.use_encoder_copy(accelerate_for_inference)
    model(torch.tensor([[2, 7, 3]]))
    assert model._encoder_copy is not None
    assert set(model.state_dict()) == keys
    assert [name for name, _ in model.named_children()] == ["bert", "dropout", "head"]
    for twin in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert twin._encoder_copy is None and twin._make_encoder_copy is None  # it computes with its own bert
    assert model._encoder_copy is not None


def test_the_copy_is_made_again_when_the_encoder_changes():
    """A resumed run loads its checkpoint into the model after the copy was asked for: the features must
    come from the loaded encoder (packed weights are their own tensors, so an old copy would be stale)."""
    model, other = _model(), _model()
    with torch.no_grad():
        for parameter in other.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.1)
    ids = torch.randint(5, 64, (2, 9))
    model.use_encoder_copy(accelerate_for_inference)
    model(ids)
    model.load_state_dict(other.state_dict())
    torch.testing.assert_close(model(ids).logits, other(ids).logits, atol=1e-5, rtol=1e-5)
    first = model._encoder_copy
    model.to(torch.float32)  # .to() and the other casts replace tensors too
    assert model._encoder_copy is None
    model(ids)
    assert model._encoder_copy is not None and model._encoder_copy is not first


def test_finetuning_on_cpu_gives_the_model_the_accelerated_copy(monkeypatch, tmp_path):
    from bertkit.cli import main
    from bertkit.tokenizer import WordPieceTokenizer

    given = []
    original = FeatureBasedModel.use_encoder_copy
    monkeypatch.setattr(FeatureBasedModel, "use_encoder_copy",
                        lambda self, encoder: given.append(encoder) or original(self, encoder))
    WordPieceTokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "good", "bad"]).save_pretrained(tmp_path / "v")
    data = tmp_path / "train.jsonl"
    data.write_text("".join(f'{{"text": "{t}", "label": "{t}"}}\n' for t in ("good", "bad") * 2))
    assert main(["finetune", "classification", "--model", "bert-debug", "--tokenizer", str(tmp_path / "v"),
                 "--train", str(data), "--dev", str(data), "--output", str(tmp_path / "out"), "--epochs", "1",
                 "--batch-size", "2", "--precision", "fp32", "--device", "cpu", "--feature-layers", "-1"]) == 0
    assert len(given) == 1 and given[0] is not None  # one seed, one maker of the accelerated copy
    assert given[0].func is accelerate_for_inference and given[0].keywords == {"autocast": False}
    # --compile: the compiled encoder computes the features (compilation itself stubbed out: ~30 s)
    from bertkit.workflows import finetune
    monkeypatch.setattr(finetune, "compile_model", lambda model: model)
    given.clear()
    assert main(["finetune", "classification", "--model", "bert-debug", "--tokenizer", str(tmp_path / "v"),
                 "--train", str(data), "--dev", str(data), "--output", str(tmp_path / "out2"), "--epochs", "1",
                 "--batch-size", "2", "--precision", "fp32", "--device", "cpu", "--feature-layers", "-1",
                 "--compile"]) == 0
    assert given == []
