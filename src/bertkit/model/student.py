"""Students of a teacher: a shallower copy of a task model, and the projection between two widths.

    student_from_teacher(teacher, layers) -> model    the same class, the teacher's embeddings, the given
                                                      layers (in order), pooler and head
    uniform_layer_map(student_layers, teacher_layers) -> ((s, t), ...)    hidden states matched in distillation

Design decision: a student made from its teacher is an ordinary task model whose config says its depth, so it
saves, loads and serves like any other; only the weight copy knows where it came from. DistilBERT initialises
from every other teacher layer (Sanh et al. 2019, section 3); the layer map is TinyBERT's uniform one (Jiao et
al. 2020, section 3.2): student layer m matches teacher layer m * L / M, and the embeddings match the embeddings.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import cast

from torch import nn

from bertkit.config import BertConfig


def student_from_teacher(teacher: nn.Module, layers: Sequence[int]) -> nn.Module:
    """A model of the teacher's class (a task model, or a `BertModel`) with `len(layers)` encoder layers, each a
    copy of the teacher layer named in `layers` (0-based), and copies of everything outside the layers
    (embeddings, pooler, head)."""
    config = cast(BertConfig, teacher.config).replace(num_hidden_layers=len(layers))
    student = type(teacher)(config)
    renumbered = {teacher_index: student_index for student_index, teacher_index in enumerate(layers)}
    state = {}
    for key, value in teacher.state_dict().items():
        match = _LAYER_KEY.match(key)
        if match is not None:
            index = int(match["index"])
            if index not in renumbered:
                continue  # a layer the student leaves out
            key = f"{match['prefix']}.{renumbered[index]}.{match['rest']}"
        state[key] = value.detach().clone()
    student.load_state_dict(state, strict=True)
    return student


_LAYER_KEY = re.compile(r"^(?P<prefix>(?:bert\.)?layers)\.(?P<index>\d+)\.(?P<rest>.+)$")
"""An encoder layer's weight: `bert.layers.N.` in a task model, `layers.N.` in a BertModel."""


def uniform_layer_map(student_layers: int, teacher_layers: int) -> tuple[tuple[int, int], ...]:
    """(student hidden state, teacher hidden state) pairs, as indices of `hidden_states` (0 = embeddings, k = the
    output of layer k): the embeddings with the embeddings, student layer m with teacher layer round(m * L / M)."""
    return ((0, 0), *((m, round(m * teacher_layers / student_layers)) for m in range(1, student_layers + 1)))


def width_projection(student_width: int, teacher_width: int) -> nn.Module:
    """What maps student hidden states onto the teacher's width before they are compared: the identity for equal
    widths, else a learned linear map (TinyBERT's W_h), trained with the student and dropped afterwards."""
    if student_width == teacher_width:
        return nn.Identity()
    projection = nn.Linear(student_width, teacher_width)
    nn.init.xavier_uniform_(projection.weight)
    nn.init.zeros_(projection.bias)
    return projection
