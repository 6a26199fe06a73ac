"""BERT models: the encoder (bert.py), the heads and task models (heads.py), the padding-free layout
(padding.py), attention backends (attention.py), the transforms that make a model faster from
outside (accelerate.py: inference kernels, compile) and checkpoint reading/writing
(pretrained.py)."""

from bertkit.model.accelerate import (
    accelerate_for_inference,
    compile_model,
    enable_gradient_checkpointing,
    for_inference,
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

__all__ = [
    "MODEL_CLASSES",
    "BertForMaskedLM",
    "BertForMultipleChoice",
    "BertForPreTraining",
    "BertForQuestionAnswering",
    "BertForSequenceClassification",
    "BertForTokenClassification",
    "BertModel",
    "BertModelOutput",
    "accelerate_for_inference",
    "compile_model",
    "enable_gradient_checkpointing",
    "for_inference",
    "read_state_dict",
]
