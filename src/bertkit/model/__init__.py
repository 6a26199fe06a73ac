"""BERT models: the encoder (bert.py), the heads and task models (heads.py), unpadding (padding.py),
CPU inference kernels (cpu.py) and checkpoint reading/writing (pretrained.py); here, the inference
precisions every inference command shares (`for_inference`)."""

import torch
from torch import nn

from bertkit import hardware
from bertkit.errors import BertkitError

from bertkit.model.bert import BertLayer, BertModel, BertModelOutput
from bertkit.model.heads import (
    BertForMaskedLM,
    BertForMultipleChoice,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
)
from bertkit.model.pretrained import read_state_dict

MODEL_CLASSES = {cls.__name__: cls for cls in (
    BertModel, BertForPreTraining, BertForMaskedLM, BertForSequenceClassification,
    BertForTokenClassification, BertForQuestionAnswering, BertForMultipleChoice)}

# --precision of the inference commands (predict, evaluate, extract, serve)
INFERENCE_PRECISIONS = ("auto", "fp32", "bf16", "int8")


def check_inference_precision(precision: str) -> str:
    if precision not in INFERENCE_PRECISIONS:
        raise BertkitError(f"--precision {precision!r} is not supported for inference; "
                           f"use one of {', '.join(INFERENCE_PRECISIONS)}")
    return precision


def inference_precision(precision: str, model: nn.Module, device: torch.device) -> str:
    """The precision to run: 'auto' is the faster of fp32 and bf16 as measured on this machine at the
    model's width (bertkit.hardware; bf16 on CUDA where supported). int8 is never chosen by 'auto': it
    changes outputs by more than rounding, so it is asked for by name (accuracy: docs/performance.md)."""
    if check_inference_precision(precision) == "auto":
        return hardware.auto_precision(device, hardware.model_width(model), purpose="inference")
    if precision == "int8" and device.type != "cpu":
        raise BertkitError(f"--precision int8 runs on CPUs only; on {device.type} use bf16 or fp32")
    return precision


def for_inference(model: nn.Module, precision: str, device: torch.device = torch.device("cpu")) -> nn.Module:
    """`model` (already on `device`) in eval mode in the inference precision: fp32 as is, bf16 cast, int8
    with the dense layers of its encoder layers dynamically quantized (int8 weights per output channel,
    activations quantized per call; embeddings, LayerNorms, attention and the task head stay fp32)."""
    precision = inference_precision(precision, model, device)
    model.eval()
    if precision == "bf16":
        return model.to(torch.bfloat16)
    if precision == "int8":
        for layer in [m for m in model.modules() if isinstance(m, BertLayer)]:
            hardware.quantize_dynamic(layer)
    return model


__all__ = ["INFERENCE_PRECISIONS", "check_inference_precision", "inference_precision", "for_inference", "MODEL_CLASSES", "BertModel", "BertModelOutput",
           "BertForPreTraining", "BertForMaskedLM", "BertForSequenceClassification", "BertForTokenClassification",
           "BertForQuestionAnswering", "BertForMultipleChoice", "read_state_dict"]
