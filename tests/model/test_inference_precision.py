"""The inference precisions every inference command shares (`bertkit.model.for_inference`): auto is the
measured choice, bf16 casts, int8 quantizes only the encoder layers' dense layers and stays close to
fp32 for every head, and bad requests are clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bertkit import model as bm
from bertkit.config import preset
from bertkit.errors import BertkitError
from bertkit.model.accelerate import Int8Linear
from bertkit.runtime import device as runtime
from bertkit.runtime import probe

PROFILES = Path(__file__).parents[1] / "assets" / "probe"
HEADS = ["BertModel", "BertForPreTraining", "BertForMaskedLM", "BertForSequenceClassification",
         "BertForTokenClassification", "BertForQuestionAnswering", "BertForMultipleChoice"]


def _inputs(name: str) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    shape = (2, 3, 12) if name == "BertForMultipleChoice" else (3, 12)
    ids = torch.randint(5, 99, shape, generator=generator)
    mask = torch.ones_like(ids)
    mask[..., 0, 8:] = 0  # padding in one row: the int8 layers run on the unpadded tokens too
    return {"input_ids": ids, "attention_mask": mask}


def _first_output(output) -> torch.Tensor:
    return next(v for v in vars(output).values() if isinstance(v, torch.Tensor))


@pytest.mark.parametrize("name", HEADS)
def test_int8_quantizes_the_encoder_layers_only_and_stays_close(name):
    torch.manual_seed(0)
    model = bm.MODEL_CLASSES[name](preset("bert-debug")).eval()
    quantized = bm.for_inference(model, "int8")
    int8 = {n for n, m in quantized.named_modules() if isinstance(m, Int8Linear)}
    assert all(".layers." in f".{n}" for n in int8)  # qkv, attn_out, ffn_in, ffn_out of each layer
    assert len(int8) == 4 * model.config.num_hidden_layers and not quantized.training
    assert all(type(m) is torch.nn.Linear for n, m in quantized.named_modules() if ".layers." not in f".{n}."
               and isinstance(m, torch.nn.Linear))  # pooler and task heads stay fp32
    with torch.inference_mode():
        exact, fast = _first_output(model(**_inputs(name))), _first_output(quantized(**_inputs(name)))
    assert fast.dtype == torch.float32
    torch.testing.assert_close(fast, exact, atol=0.05 * exact.abs().max().item(), rtol=0.0)


def test_bf16_casts_a_copy_and_fp32_shares_the_weights():
    model = bm.BertModel(preset("bert-debug"))
    fp32 = bm.for_inference(model, "fp32")
    assert fp32 is not model and not fp32.training and model.training  # the original is untouched
    assert fp32.embeddings.word.weight.data_ptr() == model.embeddings.word.weight.data_ptr()  # shared, not copied
    bf16 = bm.for_inference(model, "bf16")
    assert next(bf16.parameters()).dtype == torch.bfloat16 and next(model.parameters()).dtype == torch.float32


def test_auto_is_the_measured_inference_choice(monkeypatch):
    for name, expected in [("intel-xeon-no-amx", torch.float32), ("amd-epyc", torch.bfloat16)]:
        monkeypatch.setenv("BERTKIT_PROBE_FILE", str(PROFILES / f"{name}.json"))
        probe.reset()
        assert next(bm.for_inference(bm.BertModel(preset("bert-debug")), "auto").parameters()).dtype == expected
    probe.reset()


def test_bad_precisions_are_clear_errors():
    model = bm.BertModel(preset("bert-debug"))
    with pytest.raises(BertkitError, match="--precision 'fp16' is not supported for inference; use one of auto"):
        bm.for_inference(model, "fp16")
    with pytest.raises(BertkitError, match="--precision int8 runs on CPUs only"):
        runtime.inference_precision("int8", model, torch.device("cuda"))

