"""BertConfig: validation messages, presets and their parameter counts, config.json round trips."""

from __future__ import annotations

import pytest
import torch
import transformers

from bertkit.config import PRESETS, BertConfig, load_config, preset
from bertkit.errors import BertkitError
from bertkit.model import BertModel


@pytest.mark.parametrize("name, expected", [("bert-base", 109_482_240), ("bert-large", 335_141_888)])
def test_paper_sizes_have_the_paper_parameter_counts(name, expected):
    # The paper: Base 110M, Large 340M; the exact counts are those of Google's released checkpoints
    # (BertModel with pooler, 30522-token vocabulary).
    with torch.device("meta"):
        model = BertModel(preset(name))
    assert model.num_parameters() == expected
    assert round(expected / 1e6, -1) == {"bert-base": 110, "bert-large": 340}[name]


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_parameter_count_is_the_models_without_building_it(name):
    config = preset(name, vocab_size=1000, intermediate_size=300)
    with torch.device("meta"):
        assert config.parameter_count() == BertModel(config).num_parameters()


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_match_transformers_parameter_counts(name):
    config = preset(name, vocab_size=1000)
    reference = transformers.BertConfig(**{k: v for k, v in config.to_dict().items() if k != "architectures"})
    with torch.device("meta"):
        ours, theirs = BertModel(config), transformers.BertModel(reference)
    assert ours.num_parameters() == sum(p.numel() for p in theirs.parameters())


@pytest.mark.parametrize("changes, message", [
    ({"hidden_size": 100, "num_attention_heads": 12}, "hidden_size \\(100\\) must be divisible by num_attention_heads"),
    ({"num_hidden_layers": 0}, "num_hidden_layers must be a positive integer"),
    ({"vocab_size": -5}, "vocab_size must be a positive integer"),
    ({"hidden_dropout_prob": 1.5}, "hidden_dropout_prob must be in"),
    ({"hidden_act": "swish"}, "hidden_act 'swish' is not supported"),
    ({"pad_token_id": 40000}, "pad_token_id 40000 is outside the vocabulary"),
])
def test_invalid_configs_say_what_is_wrong(changes, message):
    with pytest.raises(BertkitError, match=message):
        BertConfig(**changes)


def test_config_json_round_trips_through_transformers(tmp_path):
    ours = preset("bert-mini", vocab_size=1234, id2label={0: "a", 1: "b", 2: "c"})
    ours.to_json_file(tmp_path / "config.json")
    theirs = transformers.BertConfig.from_pretrained(tmp_path)
    assert (theirs.hidden_size, theirs.num_hidden_layers, theirs.vocab_size, theirs.num_labels) == (256, 4, 1234, 3)
    theirs.save_pretrained(tmp_path)
    back = BertConfig.from_json_file(tmp_path / "config.json")
    assert back.hidden_size == 256 and back.label_names == ["a", "b", "c"]
    assert back.replace(extra={}, architectures=None) == ours.replace(extra={}, architectures=None)


def test_unknown_config_keys_are_kept(tmp_path):
    config = BertConfig.from_dict({"hidden_size": 64, "num_attention_heads": 4, "use_cache": True,
                                   "torch_dtype": "float32"})
    assert config.to_dict()["use_cache"] is True


def test_a_half_precision_dtype_is_not_written_back_over_float32_weights(tmp_path):
    """A bf16 checkpoint's dtype was kept and written beside bertkit's float32 weights: transformers then loaded the
    saved model in bfloat16 (logits 0.007 away)."""
    for key in ("dtype", "torch_dtype"):
        config = BertConfig.from_dict({"hidden_size": 64, "num_attention_heads": 4, key: "bfloat16"})
        assert key not in config.to_dict()
    model = BertModel(BertConfig.from_dict({"hidden_size": 32, "num_attention_heads": 2, "intermediate_size": 64,
                                            "vocab_size": 50, "num_hidden_layers": 1, "dtype": "bfloat16"}))
    model.save_pretrained(tmp_path)
    assert transformers.BertModel.from_pretrained(tmp_path).embeddings.word_embeddings.weight.dtype == torch.float32


@pytest.mark.parametrize("key", ["is_decoder", "add_cross_attention"])
def test_a_causal_bert_is_refused_not_run_bidirectionally(key):
    with pytest.raises(BertkitError, match="a causal BERT"):
        BertConfig.from_dict({key: True})
    assert BertConfig.from_dict({key: False}).extra[key] is False  # transformers writes false for every encoder


def test_relative_position_embeddings_are_refused():
    with pytest.raises(BertkitError, match="position_embedding_type 'relative_key' is not supported"):
        BertConfig.from_dict({"position_embedding_type": "relative_key"})


def test_load_config_by_preset_path_and_directory(tmp_path):
    assert load_config("bert-small").hidden_size == 512
    preset("bert-tiny").to_json_file(tmp_path / "config.json")
    assert load_config(tmp_path).hidden_size == 128
    assert load_config(tmp_path / "config.json").num_hidden_layers == 2
    with pytest.raises(BertkitError, match="neither a preset"):
        load_config("bert-gigantic")
    with pytest.raises(BertkitError, match="not a valid JSON config"):
        (tmp_path / "bad.json").write_text("{")
        load_config(tmp_path / "bad.json")
