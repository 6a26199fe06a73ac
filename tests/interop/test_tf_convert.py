"""Google TF checkpoint names -> Hugging Face layout: converted weights give transformers' outputs."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
import transformers

from bertkit.errors import BertkitError
from bertkit.interop.tf import convert_tf_checkpoint, read_tf_checkpoint, tf_name_to_hf

CONFIG = dict(vocab_size=12, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=24,
              max_position_embeddings=32, type_vocab_size=2, hidden_act="gelu", hidden_dropout_prob=0.1,
              attention_probs_dropout_prob=0.1, initializer_range=0.02)
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat", "##s", "."]


def google_names(state: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """Write a transformers state dict the way Google's modeling.py names (and lays out) variables."""
    variables = {}
    for key, tensor in state.items():
        array = tensor.numpy()
        if key.startswith("cls.predictions.decoder") or key.endswith("position_ids"):
            continue
        if key == "cls.predictions.bias":
            variables["cls/predictions/output_bias"] = array
        elif key.startswith("cls.seq_relationship."):
            variables["cls/seq_relationship/output_" + ("weights" if key.endswith("weight") else "bias")] = array
        else:
            name = re.sub(r"layer\.(\d+)", r"layer_\1", key).replace(".", "/")
            if "LayerNorm" in name:
                name = name.replace("/weight", "/gamma").replace("/bias", "/beta")
            elif "_embeddings" in name:
                name = name.removesuffix("/weight")
            elif name.endswith("/weight"):
                name, array = name.removesuffix("/weight") + "/kernel", array.T  # TF kernels are (in, out)
            variables[name] = array
    variables["bert/encoder/layer_0/output/dense/kernel/adam_m"] = np.zeros(3)  # optimizer slots are skipped
    variables["global_step"] = np.array(1000)
    return variables


def test_name_rules():
    assert tf_name_to_hf("bert/encoder/layer_11/attention/self/query/kernel") == (
        "bert.encoder.layer.11.attention.self.query.weight", True)
    assert tf_name_to_hf("bert/embeddings/LayerNorm/beta") == ("bert.embeddings.LayerNorm.bias", False)
    assert tf_name_to_hf("bert/embeddings/word_embeddings") == ("bert.embeddings.word_embeddings.weight", False)
    assert tf_name_to_hf("cls/seq_relationship/output_weights") == ("cls.seq_relationship.weight", False)
    assert tf_name_to_hf("bert/pooler/dense/kernel/adam_v") is None


def test_converted_google_checkpoint_matches_transformers(tmp_path):
    torch.manual_seed(0)
    reference = transformers.BertForPreTraining(transformers.BertConfig(**CONFIG)).eval()
    source = tmp_path / "uncased_L-2_H-16_A-2"
    source.mkdir()
    (source / "bert_config.json").write_text(json.dumps(CONFIG))
    (source / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    output = convert_tf_checkpoint(source, tmp_path / "converted",
                                   variables=google_names(reference.state_dict()))
    converted = transformers.BertForPreTraining.from_pretrained(output).eval()
    ids = torch.tensor([[2, 5, 6, 7, 3, 8, 5, 9, 3, 0]])
    types = torch.tensor([[0, 0, 0, 0, 0, 1, 1, 1, 1, 0]])
    mask = (ids != 0).long()
    with torch.no_grad():
        expected, actual = reference(ids, mask, types), converted(ids, mask, types)
    torch.testing.assert_close(actual.prediction_logits, expected.prediction_logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(actual.seq_relationship_logits, expected.seq_relationship_logits, atol=1e-5, rtol=1e-5)
    assert (output / "vocab.txt").read_text().split() == VOCAB
    assert json.loads((output / "tokenizer_config.json").read_text())["do_lower_case"] is True


def test_classifier_checkpoint_converts_to_sequence_classification(tmp_path):
    torch.manual_seed(1)
    reference = transformers.BertForPreTraining(transformers.BertConfig(**CONFIG))
    variables = google_names(reference.state_dict())
    variables["output_weights"] = np.random.default_rng(0).normal(size=(3, 16)).astype(np.float32)
    variables["output_bias"] = np.zeros(3, dtype=np.float32)
    source = tmp_path / "mrpc_output"
    source.mkdir()
    (source / "bert_config.json").write_text(json.dumps(CONFIG))
    convert_tf_checkpoint(source, tmp_path / "out", variables=variables)
    loaded = transformers.BertForSequenceClassification.from_pretrained(tmp_path / "out")
    np.testing.assert_allclose(loaded.classifier.weight.detach().numpy(), variables["output_weights"])


def test_reading_without_tensorflow_says_how_to_install(tmp_path):
    try:
        import tensorflow  # noqa: F401
    except ImportError:
        with pytest.raises(BertkitError, match=r"needs TensorFlow: pip install"):
            read_tf_checkpoint(tmp_path / "bert_model.ckpt")
    else:
        with pytest.raises(BertkitError, match="not a readable TensorFlow checkpoint"):
            read_tf_checkpoint(tmp_path / "bert_model.ckpt")
