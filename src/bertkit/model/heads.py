"""Output layers on top of the encoder, and the task models that combine them.

Design decision: every task model is `BertModel` + one small head, and heads return logits only
(losses live in `bertkit.tasks`). The masked-LM head can run at masked positions only: given a
(B, T) bool mask, the encoder returns those N hidden states alone (its last layer computed at them alone:
bert.py), so the 30k-way vocabulary projection costs N x V instead of B x T x V (about 1/7 of the positions at
15% masking). The same trick as JonasGeiping/cramming's sparse prediction head. Given a (B, P) index of
positions instead (Google's masked_lm_positions, padded to a fixed P with weight-0 entries), it gathers B x P
states: a static shape, so a GPU step neither reads N from the device nor compiles again for another N.

Names of the concepts follow transformers' modeling_bert.py: the prediction-head transform
(dense + activation + LayerNorm), a decoder tied to the word embeddings with its own bias, the NSP
classifier on the pooled [CLS] vector.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from bertkit.config import BertConfig
from bertkit.model.bert import ACTIVATIONS, BertModel, init_weights
from bertkit.model.padding import Unpadded
from bertkit.model.pretrained import PreTrainedMixin


class MaskedLMHead(nn.Module):
    """transform (dense + act + LayerNorm), then the decoder tied to the word embeddings + own bias."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.transform = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = ACTIVATIONS[config.hidden_act]()
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, hidden: torch.Tensor, word_embeddings: torch.Tensor) -> torch.Tensor:
        hidden = self.norm(self.act(self.transform(hidden)))
        return F.linear(hidden, word_embeddings, self.bias)  # (..., V)


class _TaskModel(PreTrainedMixin, nn.Module):
    """Shared construction: the encoder, dropout before the head, original initialisation."""

    add_pooling_layer = True
    base_model_prefix = "bert"
    """The encoder's attribute (transformers' name for it): what --head-warmup-steps holds still."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        if self.default_num_labels is not None and config.num_labels is None:
            config = config.replace(num_labels=self.default_num_labels)
        self.config = config
        self.bert = BertModel(config, add_pooling_layer=self.add_pooling_layer)
        dropout = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        self.dropout = nn.Dropout(dropout)

    def _num_labels(self) -> int:
        """The head's size: the config's, or the class default `__init__` filled in."""
        assert self.config.num_labels is not None
        return self.config.num_labels

    def _init_heads(self) -> None:
        for name, module in self.named_children():
            if name != "bert":
                module.apply(lambda m: init_weights(m, self.config.initializer_range))


@dataclass
class PreTrainingOutput:
    prediction_logits: torch.Tensor  # (B, T, V), or (N, V) / (B*P, V) at masked positions
    seq_relationship_logits: torch.Tensor  # (B, 2): 0 = B follows A, 1 = random B
    hidden_states: tuple[torch.Tensor, ...] | None = None


class BertForPreTraining(_TaskModel):
    """Masked LM + next sentence prediction."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        self.mlm = MaskedLMHead(config)
        self.nsp = nn.Linear(config.hidden_size, 2)
        self._init_heads()

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, output_hidden_states=False,
                masked_positions: torch.Tensor | None = None, layout: Unpadded | None = None) -> PreTrainingOutput:
        out = self.bert(input_ids, token_type_ids, attention_mask, output_hidden_states, layout, masked_positions)
        mlm_logits = self.mlm(out.last_hidden_state, self.bert.embeddings.word.weight)
        return PreTrainingOutput(mlm_logits, self.nsp(out.pooler_output), out.hidden_states)


@dataclass
class MaskedLMOutput:
    logits: torch.Tensor  # (B, T, V), or (N, V) / (B*P, V) at masked positions
    hidden_states: tuple[torch.Tensor, ...] | None = None


class BertForMaskedLM(_TaskModel):
    """Masked LM only (no pooler, as in transformers)."""

    add_pooling_layer = False

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        self.mlm = MaskedLMHead(config)
        self._init_heads()

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, output_hidden_states=False,
                masked_positions: torch.Tensor | None = None, layout: Unpadded | None = None) -> MaskedLMOutput:
        out = self.bert(input_ids, token_type_ids, attention_mask, output_hidden_states, layout, masked_positions)
        logits = self.mlm(out.last_hidden_state, self.bert.embeddings.word.weight)
        return MaskedLMOutput(logits, out.hidden_states)


@dataclass
class ClassifierOutput:
    logits: torch.Tensor  # (B, num_labels) / (B, T, num_labels) / (B, C)
    hidden_states: tuple[torch.Tensor, ...] | None = None


class BertForSequenceClassification(_TaskModel):
    """[CLS] -> pooler -> dropout -> linear. num_labels = 1 is regression (STS-B)."""

    default_num_labels = 2

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        self.classifier = nn.Linear(config.hidden_size, self._num_labels())
        self._init_heads()

    def forward(self, input_ids, token_type_ids=None, attention_mask=None,
                output_hidden_states=False) -> ClassifierOutput:
        out = self.bert(input_ids, token_type_ids, attention_mask, output_hidden_states)
        return ClassifierOutput(self.classifier(self.dropout(out.pooler_output)), out.hidden_states)


class BertForTokenClassification(_TaskModel):
    """Every token -> dropout -> linear (tagging, e.g. NER)."""

    add_pooling_layer = False
    default_num_labels = 2

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        self.classifier = nn.Linear(config.hidden_size, self._num_labels())
        self._init_heads()

    def forward(self, input_ids, token_type_ids=None, attention_mask=None,
                output_hidden_states=False) -> ClassifierOutput:
        out = self.bert(input_ids, token_type_ids, attention_mask, output_hidden_states)
        return ClassifierOutput(self.classifier(self.dropout(out.last_hidden_state)), out.hidden_states)


@dataclass
class QuestionAnsweringOutput:
    start_logits: torch.Tensor  # (B, T)
    end_logits: torch.Tensor  # (B, T)
    hidden_states: tuple[torch.Tensor, ...] | None = None


class BertForQuestionAnswering(_TaskModel):
    """Every token -> (start, end) scores (extractive QA, SQuAD)."""

    add_pooling_layer = False

    def __init__(self, config: BertConfig) -> None:
        # transformers sizes qa_outputs by num_labels, which must then be 2 (start, end).
        super().__init__(config.replace(num_labels=2, id2label=None))
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        self._init_heads()

    def forward(self, input_ids, token_type_ids=None, attention_mask=None,
                output_hidden_states=False) -> QuestionAnsweringOutput:
        out = self.bert(input_ids, token_type_ids, attention_mask, output_hidden_states)
        start, end = self.qa_outputs(out.last_hidden_state).unbind(-1)  # 2 x (B, T)
        return QuestionAnsweringOutput(start, end, out.hidden_states)


class BertForMultipleChoice(_TaskModel):
    """Each (context, choice) pair -> pooled [CLS] -> one score; softmax over the C choices."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__(config)
        self.classifier = nn.Linear(config.hidden_size, 1)
        self._init_heads()

    def forward(self, input_ids, token_type_ids=None, attention_mask=None,
                output_hidden_states=False) -> ClassifierOutput:
        batch, choices, seq_len = input_ids.shape  # (B, C, T)
        flat = [t.reshape(batch * choices, seq_len) if t is not None else None
                for t in (input_ids, token_type_ids, attention_mask)]
        out = self.bert(*flat, output_hidden_states=output_hidden_states)
        scores = self.classifier(self.dropout(out.pooler_output))  # (B*C, 1)
        return ClassifierOutput(scores.view(batch, choices), out.hidden_states)
