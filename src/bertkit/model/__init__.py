"""BERT models: the encoder (bert.py), the heads and task models (heads.py), unpadding (padding.py),
CPU inference kernels (cpu.py) and checkpoint reading/writing (pretrained.py)."""

import torch

from bertkit.errors import BertkitError

from bertkit.model.bert import BertModel, BertModelOutput
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

# --precision of the inference commands (predictors, serve, extract) -> the dtype the weights are cast to
INFERENCE_PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16}


def inference_dtype(precision: str) -> torch.dtype:
    """The dtype for an inference --precision (fp32: exact; bf16: ~2x faster on CPUs with avx512_bf16/AMX)."""
    if precision not in INFERENCE_PRECISIONS:
        raise BertkitError(f"--precision {precision!r} is not supported for inference; "
                           f"use one of {', '.join(INFERENCE_PRECISIONS)}")
    return INFERENCE_PRECISIONS[precision]


__all__ = ["INFERENCE_PRECISIONS", "inference_dtype", "MODEL_CLASSES", "BertModel", "BertModelOutput",
           "BertForPreTraining", "BertForMaskedLM", "BertForSequenceClassification", "BertForTokenClassification",
           "BertForQuestionAnswering", "BertForMultipleChoice", "read_state_dict"]
