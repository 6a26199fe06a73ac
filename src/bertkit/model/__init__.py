"""BERT models: the encoder (bert.py), the heads and task models (heads.py), the padding-free layout
(padding.py), attention backends (attention.py), the transforms that make a model faster from
outside (accelerate.py: inference kernels and precisions, compile) and checkpoint reading/writing
(pretrained.py)."""

from bertkit.model.accelerate import (
    INFERENCE_PRECISIONS,
    accelerate_for_inference,
    check_inference_precision,
    compile_model,
    for_inference,
    inference_precision,
)
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

__all__ = ["INFERENCE_PRECISIONS", "check_inference_precision", "inference_precision", "for_inference",
           "accelerate_for_inference", "compile_model", "MODEL_CLASSES", "BertModel", "BertModelOutput",
           "BertForPreTraining", "BertForMaskedLM", "BertForSequenceClassification", "BertForTokenClassification",
           "BertForQuestionAnswering", "BertForMultipleChoice", "read_state_dict"]
