"""Students made from a teacher (DistilBERT's every-other-layer copy) and the layer map of hidden-state matching."""

from __future__ import annotations

import pytest
import torch

from bertkit.config import preset
from bertkit.errors import BertkitError
from bertkit.model import BertForQuestionAnswering, BertForSequenceClassification
from bertkit.model.student import student_from_teacher, uniform_layer_map, width_projection
from bertkit.settings import every_other_layer, student_layers


def _teacher(cls=BertForSequenceClassification, layers: int = 4):
    torch.manual_seed(0)
    config = preset("bert-debug", vocab_size=40).replace(num_hidden_layers=layers, num_labels=3)
    return cls(config).eval()


def test_a_student_of_every_teacher_layer_is_the_teacher() -> None:
    teacher = _teacher()
    student = student_from_teacher(teacher, (0, 1, 2, 3)).eval()
    ids = torch.randint(5, 40, (3, 9))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    torch.testing.assert_close(student(ids, None, mask).logits, teacher(ids, None, mask).logits, rtol=0, atol=0)


def test_a_half_depth_student_runs_the_chosen_layers_in_order() -> None:
    teacher = _teacher(BertForQuestionAnswering)
    student = student_from_teacher(teacher, (1, 3)).eval()
    assert student.config.num_hidden_layers == 2 and isinstance(student, BertForQuestionAnswering)
    for mine, theirs in ((0, 1), (1, 3)):
        for a, b in zip(student.bert.layers[mine].parameters(), teacher.bert.layers[theirs].parameters()):
            assert torch.equal(a, b)
    # The same computation by hand: the teacher's embeddings, its layers 1 and 3, its head.
    ids = torch.randint(5, 40, (2, 7))
    x = teacher.bert.embeddings(ids, torch.zeros_like(ids))
    for index in (1, 3):
        x = teacher.bert.layers[index](x, teacher.bert.attention.select(x, False, 0.0), None)
    start, _ = teacher.qa_outputs(x).unbind(-1)
    torch.testing.assert_close(student(ids).start_logits, start, rtol=1e-5, atol=1e-6)
    # The copy is a copy: training the student leaves the teacher as it was.
    student.bert.layers[0].qkv.weight.data.add_(1.0)
    assert not torch.equal(student.bert.layers[0].qkv.weight, teacher.bert.layers[1].qkv.weight)


def test_layer_choices_and_maps() -> None:
    assert every_other_layer(12) == (0, 2, 4, 6, 8, 10) and every_other_layer(3) == (0, 2)
    assert student_layers("layers:0,3,5", 6) == (0, 3, 5)
    for bad in ("layers:3,1", "layers:0,6", "layers:", "layers:a", "layers:1,1"):
        with pytest.raises(BertkitError, match="--student"):
            student_layers(bad, 6)
    assert uniform_layer_map(2, 4) == ((0, 0), (1, 2), (2, 4))
    assert uniform_layer_map(3, 12) == ((0, 0), (1, 4), (2, 8), (3, 12))
    assert isinstance(width_projection(32, 32), torch.nn.Identity)
    assert width_projection(16, 32)(torch.zeros(2, 16)).shape == (2, 32)


def test_a_bare_encoder_has_students_too() -> None:
    from bertkit.model import BertModel

    torch.manual_seed(1)
    teacher = BertModel(preset("bert-debug", vocab_size=40).replace(num_hidden_layers=4)).eval()
    student = student_from_teacher(teacher, (0, 1, 2, 3)).eval()
    ids = torch.randint(5, 40, (2, 6))
    torch.testing.assert_close(student(ids).last_hidden_state, teacher(ids).last_hidden_state, rtol=0, atol=0)
    half = student_from_teacher(teacher, (1, 3))
    assert torch.equal(half.layers[1].ffn_in.weight, teacher.layers[3].ffn_in.weight)
