"""The feature-based approach (paper section 5.3): a frozen encoder whose chosen layers' hidden states,
combined (concatenated, summed or averaged), feed one trained linear layer.

A `FeatureHead` (given by the task: `bertkit.tasks.task.Task.feature_head`) says where the linear layer
reads, as the matching fine-tuning head reads the last layer: the [CLS] position for sequence
classification and multiple choice, every token for tagging and question answering (`per_token`); a
question-answering head's two outputs are the start and end logits (`span`). The outputs carry the task
models' names (`logits`, or `start_logits`/`end_logits`), so the tasks' losses, decoders and the
predictors use either model alike.

Design decision: the encoder runs without gradients and in eval mode even while the head trains (frozen
features, no dropout inside), and the model keeps it under `bert` as the task models do, so code that
reaches for the encoder (`model.bert`) works for both. The fine-tuned directory stores the encoder as a
plain checkpoint and the head beside it (`bertkit.tasks.finetuned`). Since the features are an inference
computation, a trainer may have the model compute them with an inference copy of its encoder
(`use_encoder_copy(make_copy)`, e.g. `accelerate_for_inference`: the CPU kernels of prediction, ~1.2x
faster here). The model makes the copy itself at the next forward and again after whatever can change the
encoder's tensors (`load_state_dict`, as a resumed run does; `.to()` and the other casts), so the copy is
never stale while the encoder stays frozen.

Reference: Devlin et al. (2018), section 5.3 and table 7 (concatenating the last four layers).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from bertkit.errors import BertkitError
from bertkit.model.bert import BertModel
from bertkit.model.heads import ClassifierOutput, QuestionAnsweringOutput
from bertkit.settings import FEATURE_COMBINES


@dataclass(frozen=True)
class FeatureHead:
    """What the linear layer of a feature-based model computes."""

    num_outputs: int
    """Scores per position read (labels; 1 per choice; 2 for a span's start and end)."""
    per_token: bool = False
    """Read every token (tagging, question answering) instead of the [CLS] position."""
    span: bool = False
    """Return the two outputs as `start_logits` and `end_logits` (question answering)."""


class FeatureBasedModel(nn.Module):
    """A frozen encoder whose chosen layers' hidden states, combined, feed one linear layer."""

    def __init__(self, bert: BertModel, head: FeatureHead, layers: tuple[int, ...], combine: str,
                 dropout: float) -> None:
        super().__init__()
        if combine not in FEATURE_COMBINES:
            raise BertkitError(f"--feature-combine {combine!r}: use one of {', '.join(FEATURE_COMBINES)}")
        depth = bert.config.num_hidden_layers + 1  # embeddings + every layer
        bad = [i for i in layers if not -depth <= i < depth]
        if bad:
            raise BertkitError(f"--feature-layers {bad[0]} is outside the model's hidden states "
                               f"(-{depth}..{depth - 1}; 0 is the embedding output, -1 the last layer)")
        self.bert: BertModel = bert
        self.config = bert.config
        self.layers, self.combine, self.layout = tuple(layers), combine, head
        for parameter in bert.parameters():
            parameter.requires_grad_(False)
        width = bert.config.hidden_size * (len(layers) if combine == "concat" else 1)
        self.dropout = nn.Dropout(dropout)
        self.head: nn.Linear = nn.Linear(width, head.num_outputs)
        nn.init.normal_(self.head.weight, std=bert.config.initializer_range)
        nn.init.zeros_(self.head.bias)
        self._make_encoder_copy: Callable[[BertModel], nn.Module] | None = None
        self._encoder_copy: nn.Module | None = None
        self.register_load_state_dict_post_hook(FeatureBasedModel._forget_encoder_copy)

    def use_encoder_copy(self, make_copy: Callable[[BertModel], nn.Module] | None) -> None:
        """Compute the features with `make_copy(bert)`, an inference copy of the encoder made at the next
        forward and again after `load_state_dict`, `.to()` or another cast (None: `bert` itself). The copy
        is not a submodule: state_dict, saving and copies of this model see `bert` alone, and a copy
        (deepcopy, pickle) computes with its own `bert`."""
        self._make_encoder_copy = make_copy
        self._forget_encoder_copy()

    @property
    def uses_encoder_copy(self) -> bool:
        """Whether the features are computed by an inference copy of the encoder (`use_encoder_copy`)."""
        return self._make_encoder_copy is not None

    def _forget_encoder_copy(self, *_: Any) -> None:
        self.__dict__["_encoder_copy"] = None  # bypasses nn.Module's registration of submodules

    def _apply(self, fn: Callable[..., Any], recurse: bool = True) -> FeatureBasedModel:
        self._forget_encoder_copy()  # .to(), .float(), ...: the encoder's tensors are replaced
        return super()._apply(fn, recurse)

    def __getstate__(self) -> dict:
        # deepcopy and pickle leave the copy and its maker behind (an evaluation copy is accelerated whole)
        return {**super().__getstate__(), "_encoder_copy": None, "_make_encoder_copy": None}

    def forward(self, input_ids, token_type_ids=None, attention_mask=None,
                ) -> ClassifierOutput | QuestionAnsweringOutput:
        shape = input_ids.shape  # (B, T), or (B, C, T) for multiple choice
        flat = [t.reshape(-1, shape[-1]) if t is not None else None
                for t in (input_ids, token_type_ids, attention_mask)]
        self.bert.eval()  # frozen features: no dropout inside the encoder
        if self._make_encoder_copy is not None and self._encoder_copy is None:
            self.__dict__["_encoder_copy"] = self._make_encoder_copy(self.bert)
        encoder = self.bert if self._encoder_copy is None else self._encoder_copy
        with torch.no_grad():
            states = encoder(*flat, output_hidden_states=True).hidden_states
        chosen = [states[i] for i in self.layers]  # each (B', T, D)
        features = (torch.cat(chosen, dim=-1) if self.combine == "concat"
                    else torch.stack(chosen).sum(0) if self.combine == "sum" else torch.stack(chosen).mean(0))
        if not self.layout.per_token:
            features = features[:, 0]  # the [CLS] position
        scores = self.head(self.dropout(features))  # (B', T, outputs) or (B', outputs)
        if self.layout.span:
            start, end = scores.unbind(-1)
            return QuestionAnsweringOutput(start, end)
        if len(shape) == 3:
            return ClassifierOutput(scores.view(shape[0], shape[1]))  # one score per choice: (B, C)
        return ClassifierOutput(scores)
