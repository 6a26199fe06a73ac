"""BERT models: the encoder (bert.py), the heads and task models (heads.py), unpadding (padding.py),
and checkpoint reading/writing (pretrained.py)."""

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

__all__ = ["MODEL_CLASSES", "BertModel", "BertModelOutput", "BertForPreTraining", "BertForMaskedLM",
           "BertForSequenceClassification", "BertForTokenClassification", "BertForQuestionAnswering",
           "BertForMultipleChoice", "read_state_dict"]
