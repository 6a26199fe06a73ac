"""Checkpoint loading: safe formats only, clear errors for bad weights, fresh heads reported."""

from __future__ import annotations

import json
import logging
import pickle

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from bertkit import model as bm
from bertkit.config import preset
from bertkit.errors import BertkitError
from bertkit.model import pretrained

from .conftest import tiny_hf_config


def _save_hf(tmp_path, name="BertForPreTraining", **config):
    torch.manual_seed(0)
    reference = getattr(transformers, name)(tiny_hf_config(**config)).eval()
    reference.save_pretrained(tmp_path)
    return reference


def _edit_weights(tmp_path, edit):
    state = load_file(tmp_path / "model.safetensors")
    edit(state)
    save_file(state, tmp_path / "model.safetensors")


def test_pytorch_bin_loads_with_weights_only(tmp_path, batch):
    reference = _save_hf(tmp_path, "BertModel")
    (tmp_path / "model.safetensors").unlink()
    torch.save(reference.state_dict(), tmp_path / "pytorch_model.bin")
    ours = bm.BertModel.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        expected = reference(**batch).pooler_output
        torch.testing.assert_close(ours(**batch).pooler_output, expected, atol=1e-5, rtol=1e-5)


class _Payload:
    def __reduce__(self):
        return (print, ("this must never run",))


def test_pickle_with_code_is_refused_never_executed(tmp_path, capsys):
    _save_hf(tmp_path, "BertModel")
    (tmp_path / "model.safetensors").unlink()
    with open(tmp_path / "pytorch_model.bin", "wb") as handle:
        pickle.dump({"x": _Payload()}, handle)
    with pytest.raises(BertkitError, match="refused to load.*never falls back"):
        bm.BertModel.from_pretrained(tmp_path)
    assert "this must never run" not in capsys.readouterr().out


def test_encoder_checkpoint_without_prefix_gives_fresh_reported_head(tmp_path, caplog):
    _save_hf(tmp_path, "BertModel")
    with caplog.at_level(logging.INFO):
        model = bm.BertForSequenceClassification.from_pretrained(tmp_path, num_labels=4)
    assert sorted(model.newly_initialized) == ["classifier.bias", "classifier.weight"]
    # what fine-tuning does with every pre-trained model: information, not a warning
    [record] = [r for r in caplog.records if "newly initialised" in r.getMessage()]
    assert record.levelno == logging.INFO and "classifier.weight" in record.getMessage()
    assert model.classifier.weight.shape == (4, 32)


def test_masked_lm_checkpoint_has_no_pooler_so_pooler_is_fresh(tmp_path):
    _save_hf(tmp_path, "BertForMaskedLM")
    model = bm.BertForSequenceClassification.from_pretrained(tmp_path)
    assert set(model.newly_initialized) == {"bert.pooler.weight", "bert.pooler.bias",
                                            "classifier.weight", "classifier.bias"}
    assert {"mlm.bias", "mlm.transform.weight"} <= set(model.unused_weights)


def test_pretraining_checkpoint_into_bare_encoder_skips_heads(tmp_path):
    _save_hf(tmp_path)
    model = bm.BertModel.from_pretrained(tmp_path)
    assert model.newly_initialized == []
    assert "nsp.weight" in model.unused_weights


def test_missing_encoder_weight_is_an_error_naming_it(tmp_path):
    _save_hf(tmp_path)
    _edit_weights(tmp_path, lambda s: s.pop("bert.encoder.layer.1.output.dense.weight"))
    with pytest.raises(BertkitError, match=r"missing encoder weights: bert\.layers\.1\.ffn_out\.weight"):
        bm.BertForPreTraining.from_pretrained(tmp_path)


@pytest.mark.parametrize("model_class", ["BertModel", "BertForSequenceClassification"])
def test_encoder_layers_the_config_leaves_out_are_an_error_not_skipped_as_another_heads(tmp_path, model_class):
    """config.json edited to fewer layers than the weights hold: the extra layers were dropped, said at INFO only."""
    _save_hf(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 1}))
    with pytest.raises(BertkitError, match=r"the weights hold encoder layer\(s\) 1, which config.json's "
                                           r"num_hidden_layers 1 leaves out"):
        getattr(bm, model_class).from_pretrained(tmp_path)


def test_a_masked_lm_decoder_of_its_own_is_refused_and_the_encoder_still_loads(tmp_path, batch):
    """tie_word_embeddings false: the decoder was dropped as a tied copy, and the word embeddings scored the words
    (logits 0.5 away from transformers', other top tokens); re-saved, transformers then found no decoder."""
    reference = _save_hf(tmp_path, "BertForMaskedLM", tie_word_embeddings=False)
    assert not torch.equal(reference.cls.predictions.decoder.weight, reference.bert.embeddings.word_embeddings.weight)
    with pytest.raises(BertkitError, match="its masked-LM decoder has its own matrix"):
        bm.BertForMaskedLM.from_pretrained(tmp_path)
    encoder = bm.BertModel.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        ours = encoder(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"]).last_hidden_state
        theirs = reference.bert(**batch).last_hidden_state
    mask = batch["attention_mask"].bool()
    assert torch.allclose(ours[mask], theirs[mask], atol=1e-5)
    _save_hf(tmp_path / "tied", "BertForMaskedLM")  # the usual, tied one loads
    bm.BertForMaskedLM.from_pretrained(tmp_path / "tied")


def test_unknown_tensor_is_an_error_naming_it(tmp_path):
    _save_hf(tmp_path)
    _edit_weights(tmp_path, lambda s: s.update({"gpt.h.0.attn.weight": torch.zeros(2)}))
    with pytest.raises(BertkitError, match=r"unknown tensor names: gpt\.h\.0\.attn\.weight"):
        bm.BertForPreTraining.from_pretrained(tmp_path)


def test_shape_mismatch_is_an_error_naming_it(tmp_path):
    _save_hf(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["vocab_size"] = 100
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(BertkitError, match=r"shape mismatch for .*embeddings\.word\.weight \(checkpoint \(99, 32\)"):
        bm.BertForPreTraining.from_pretrained(tmp_path)


def test_non_finite_weights_are_an_error_naming_them(tmp_path):
    _save_hf(tmp_path)

    def poison(state):
        state["cls.seq_relationship.bias"] = torch.tensor([float("nan"), 0.0])

    _edit_weights(tmp_path, poison)
    with pytest.raises(BertkitError, match=r"non-finite .*nsp\.bias"):
        bm.BertForPreTraining.from_pretrained(tmp_path)


def test_legacy_gamma_beta_layer_norm_names_load(tmp_path, batch):
    reference = _save_hf(tmp_path, "BertModel")

    def rename(state):
        for key in [k for k in state if "LayerNorm" in k]:
            state[key.replace(".weight", ".gamma").replace(".bias", ".beta")] = state.pop(key)

    _edit_weights(tmp_path, rename)
    ours = bm.BertModel.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        torch.testing.assert_close(ours(**batch).pooler_output, reference(**batch).pooler_output,
                                   atol=1e-5, rtol=1e-5)


def test_not_a_checkpoint_directory(tmp_path):
    with pytest.raises(BertkitError, match="config file not found"):
        bm.BertModel.from_pretrained(tmp_path)
    preset("bert-debug").to_json_file(tmp_path / "config.json")
    with pytest.raises(BertkitError, match="no weights found"):
        bm.BertModel.from_pretrained(tmp_path)


def test_save_then_load_round_trip_keeps_weights_and_labels(tmp_path):
    config = preset("bert-debug", vocab_size=99, id2label={0: "neg", 1: "pos"}, num_labels=2)
    model = bm.BertForSequenceClassification(config)
    model.save_pretrained(tmp_path)
    loaded = bm.BertForSequenceClassification.from_pretrained(tmp_path)
    assert loaded.config.label_names == ["neg", "pos"]
    for (name, a), b in zip(model.state_dict().items(), loaded.state_dict().values()):
        assert torch.equal(a, b), name
    assert not list(tmp_path.glob("*.tmp"))  # atomic writes leave no temp files


def test_initialisation_is_truncated_normal_with_layer_norm_one_zero():
    torch.manual_seed(0)
    model = bm.BertModel(preset("bert-mini"))
    weight = model.layers[0].ffn_in.weight
    assert abs(weight.std().item() - 0.02 * 0.88) < 2e-3  # std of a normal truncated at 2 sigma is 0.88 sigma
    assert weight.abs().max().item() <= 0.04 + 1e-6
    assert torch.equal(model.layers[0].ffn_in.bias, torch.zeros_like(model.layers[0].ffn_in.bias))
    assert torch.equal(model.embeddings.norm.weight, torch.ones(256))


def test_a_model_larger_than_memory_is_refused_before_allocating(monkeypatch):
    config = preset("bert-debug", vocab_size=50)
    monkeypatch.setattr(pretrained, "memory_limit_bytes", lambda: 4 * config.parameter_count() - 1)
    with pytest.raises(BertkitError, match=r"parameters.*more than this machine's"):
        bm.BertModel(config)
    with torch.device("meta"):  # allocates nothing: counting the parameters of any size stays possible
        assert bm.BertModel(config).num_parameters() == config.parameter_count()
    monkeypatch.setattr(pretrained, "memory_limit_bytes", lambda: 4 * config.parameter_count())
    bm.BertModel(config)


def test_memory_limit_is_known_on_this_machine():
    assert pretrained.memory_limit_bytes() > 2**27


def test_a_model_of_one_segment_refuses_a_second_text_in_one_line():
    """type_vocab_size 1 (as some models made elsewhere have) with a text pair: an IndexError traceback."""
    model = bm.BertModel(preset("bert-debug", vocab_size=20, type_vocab_size=1)).eval()
    ids = torch.tensor([[2, 5, 3, 6, 3]])
    model(ids, torch.zeros_like(ids), torch.ones_like(ids))  # single texts run
    with pytest.raises(BertkitError, match=r"one segment embedding \(type_vocab_size 1\), so it reads no second text"):
        model(ids, torch.tensor([[0, 0, 0, 1, 1]]), torch.ones_like(ids))
