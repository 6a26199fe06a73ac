"""The distillation objective: Hinton's soft targets (checked against torch's KL and against the closed-form
gradient T * (p_student - p_teacher) / B), padding left out of distributions over positions, the gold labels of the
labelled rows only, hidden states through the layer map, and the collated teacher outputs."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from bertkit.config import preset
from bertkit.model import BertForSequenceClassification
from bertkit.model.student import student_from_teacher, uniform_layer_map, width_projection
from bertkit.settings import ClassificationSettings, SquadSettings, TaggingSettings
from bertkit.tasks.classification import ClassificationTask
from bertkit.tasks.distillation import (
    LABELLED_KEY,
    TEACHER_KEY,
    DistillationLoss,
    DistillationModel,
    LossWeights,
    _kl,
    collate_distillation,
    soft_target_loss,
)
from bertkit.tasks.squad import SquadTask
from bertkit.tasks.tagging import TaggingTask

CLASSIFICATION = ClassificationTask(ClassificationSettings(labels=["a", "b", "c"], max_seq_length=16))


class _Out:
    def __init__(self, **values):
        self.__dict__.update(values)


def test_soft_targets_are_hintons_kl_times_t_squared_with_its_gradient() -> None:
    torch.manual_seed(0)
    student, teacher = torch.randn(5, 3, requires_grad=True), torch.randn(5, 3)
    for temperature in (1.0, 2.0, 4.0):
        loss = _kl(student, teacher, temperature)
        reference = F.kl_div(F.log_softmax(student / temperature, -1), F.softmax(teacher / temperature, -1),
                             reduction="batchmean") * temperature ** 2
        torch.testing.assert_close(loss, reference)
        (grad,) = torch.autograd.grad(loss, student)
        expected = temperature * (F.softmax(student / temperature, -1) - F.softmax(teacher / temperature, -1)) / 5
        torch.testing.assert_close(grad, expected.detach())
    assert float(_kl(teacher, teacher, 2.0)) == 0.0


def test_a_distribution_over_positions_leaves_the_padding_out() -> None:
    """SQuAD's start/end: each row's softmax over its real tokens, whatever the batch is padded to."""
    torch.manual_seed(1)
    student, teacher = torch.randn(2, 6), torch.randn(2, 6)
    real = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]]).bool()
    padded = _kl(student, teacher, 2.0, real)
    alone = (_kl(student[:1, :4], teacher[:1, :4], 2.0) + _kl(student[1:], teacher[1:], 2.0)) / 2
    torch.testing.assert_close(padded, alone)
    # Whatever sits at padded positions changes nothing, even at a temperature below 1.
    student[0, 4:], teacher[0, 4:] = 1e30, -1e30
    torch.testing.assert_close(_kl(student, teacher, 0.5, real),
                               (_kl(student[:1, :4], teacher[:1, :4], 0.5) + _kl(student[1:], teacher[1:], 0.5)) / 2)


def test_each_task_kind_reads_its_outputs_as_its_own_distribution() -> None:
    torch.manual_seed(2)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    tagging = TaggingTask(TaggingSettings(labels=["O", "B-X", "I-X"]))
    tokens, targets = torch.randn(2, 4, 3), torch.randn(2, 4, 3)
    real = mask.bool()
    torch.testing.assert_close(soft_target_loss(tagging, _Out(logits=tokens), {"logits": targets}, mask, 2.0),
                               _kl(tokens[real], targets[real], 2.0))  # one distribution per real token
    squad = SquadTask(SquadSettings())
    start, end, t_start, t_end = (torch.randn(2, 4) for _ in range(4))
    loss = soft_target_loss(squad, _Out(start_logits=start, end_logits=end),
                            {"start_logits": t_start, "end_logits": t_end}, mask, 2.0)
    torch.testing.assert_close(loss, (_kl(start, t_start, 2.0, real) + _kl(end, t_end, 2.0, real)) / 2)
    regression = ClassificationTask(ClassificationSettings(labels=None))
    scores, t_scores = torch.randn(2, 1), torch.randn(2, 1)
    torch.testing.assert_close(soft_target_loss(regression, _Out(logits=scores), {"logits": t_scores}, mask, 2.0),
                               F.mse_loss(scores, t_scores))


def _batch(labelled: list[bool]) -> dict:
    features = [{"input_ids": [2, 5 + i, 6, 3], "token_type_ids": [0] * 4, "attention_mask": [1] * 4,
                 "labels": i % 3, LABELLED_KEY: flag, TEACHER_KEY: {"logits": np.array([0.5, -1.0, 2.0 * i])}}
                for i, flag in enumerate(labelled)]
    return collate_distillation(features, 0)


def _model() -> DistillationModel:
    torch.manual_seed(3)
    model = BertForSequenceClassification(preset("bert-debug", vocab_size=12).replace(num_labels=3))
    return DistillationModel(model.eval(), torch.nn.Identity())


def test_the_gold_labels_count_for_labelled_rows_only() -> None:
    model, batch = _model(), _batch([True, False, True, False])
    hard_only = DistillationLoss(CLASSIFICATION, LossWeights(soft=0.0, hard=1.0, hidden=0.0, temperature=2.0))
    loss, _ = hard_only(model, batch)
    logits = model.student(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"]).logits
    expected = F.cross_entropy(logits[[0, 2]], batch["labels"][[0, 2]]) * 2 / 4  # their share of the batch
    torch.testing.assert_close(loss, expected)
    nothing, _ = hard_only(model, _batch([False, False]))
    assert float(nothing) == 0.0  # no labelled row: no term, and no NaN from an empty mean
    both = DistillationLoss(CLASSIFICATION, LossWeights(soft=0.5, hard=2.0, hidden=0.0, temperature=2.0))
    total, parts = both(model, batch)
    torch.testing.assert_close(total, 0.5 * parts["soft_loss"] + 2.0 * parts["hard_loss"])
    torch.testing.assert_close(parts["soft_loss"], _kl(logits, batch[TEACHER_KEY]["logits"], 2.0))


def test_hidden_states_match_through_the_layer_map_and_projection() -> None:
    torch.manual_seed(4)
    teacher = BertForSequenceClassification(preset("bert-debug", vocab_size=12).replace(
        num_hidden_layers=4, num_labels=3)).eval()
    batch = _batch([True, True])
    weights = LossWeights(soft=0.0, hard=0.0, hidden=1.0, temperature=2.0)
    same = DistillationModel(student_from_teacher(teacher, (0, 1, 2, 3)).eval(), torch.nn.Identity())
    loss, _ = DistillationLoss(CLASSIFICATION, weights, teacher, uniform_layer_map(4, 4))(same, batch)
    assert float(loss.detach()) == 0.0  # the teacher's own layers reproduce its hidden states
    half = DistillationModel(student_from_teacher(teacher, (0, 2)).eval(), width_projection(32, 32))
    loss, _ = DistillationLoss(CLASSIFICATION, weights, teacher, uniform_layer_map(2, 4))(half, batch)
    inputs = (batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
    mine = half.student(*inputs, output_hidden_states=True).hidden_states
    theirs = teacher(*inputs, output_hidden_states=True).hidden_states
    expected = torch.stack([F.mse_loss(mine[s], theirs[t]) for s, t in ((0, 0), (1, 2), (2, 4))]).mean()
    torch.testing.assert_close(loss, expected)
    assert float(loss.detach()) > 0 and all(not p.requires_grad for p in teacher.parameters())


def test_collated_teacher_outputs_pad_token_level_arrays() -> None:
    features = [{"input_ids": [2, 5, 3][:n], "token_type_ids": [0] * n, "attention_mask": [1] * n, LABELLED_KEY: True,
                 TEACHER_KEY: {"logits": np.full((n, 2), float(n), dtype=np.float32)}} for n in (3, 2)]
    batch = collate_distillation(features, 0)
    assert batch[TEACHER_KEY]["logits"].shape == (2, 3, 2) and batch[LABELLED_KEY].tolist() == [True, True]
    assert batch[TEACHER_KEY]["logits"][1, 2].tolist() == [0.0, 0.0]
    assert batch["input_ids"].tolist() == [[2, 5, 3], [2, 5, 0]]


def test_attention_probes_attend_as_sdpa_and_keep_each_layers_distributions() -> None:
    from bertkit.model.attention import recording_attention

    torch.manual_seed(5)
    model = BertForSequenceClassification(preset("bert-debug", vocab_size=12).replace(
        num_hidden_layers=3, num_labels=3)).eval()
    ids = torch.randint(4, 12, (2, 7))
    mask = torch.ones_like(ids)
    mask[0, 5:] = 0
    plain = model(ids, None, mask).logits
    backend = model.bert.attention
    with recording_attention(model.bert) as probes:
        recorded = model(ids, None, mask).logits
    assert model.bert.attention is backend  # its own backend again after the block
    torch.testing.assert_close(recorded, plain, rtol=1e-5, atol=1e-6)
    assert len(probes.probabilities) == 3 and probes.probabilities[0].shape == (2, 4, 7, 7)
    for p in probes.probabilities:
        torch.testing.assert_close(p.sum(-1), torch.ones(2, 4, 7))
        assert float(p[0, :, :, 5:].detach().abs().max()) == 0.0  # padded keys get no weight


def test_attention_distributions_match_through_the_layer_map() -> None:
    from bertkit.model.attention import recording_attention

    torch.manual_seed(6)
    teacher = BertForSequenceClassification(preset("bert-debug", vocab_size=12).replace(
        num_hidden_layers=4, num_labels=3)).eval()
    batch = _batch([True, True])
    weights = LossWeights(soft=0.0, hard=0.0, hidden=0.0, temperature=2.0, attention=1.0)
    same = DistillationModel(student_from_teacher(teacher, (0, 1, 2, 3)).eval(), torch.nn.Identity())
    loss, _ = DistillationLoss(CLASSIFICATION, weights, teacher, uniform_layer_map(4, 4))(same, batch)
    assert abs(float(loss.detach())) < 1e-6
    half = DistillationModel(student_from_teacher(teacher, (0, 2)).eval(), torch.nn.Identity())
    loss, parts = DistillationLoss(CLASSIFICATION, weights, teacher, uniform_layer_map(2, 4))(half, batch)
    inputs = (batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
    with recording_attention(half.student.bert) as mine, recording_attention(teacher.bert) as theirs:
        half.student(*inputs)
        teacher(*inputs)
    expected = torch.stack([F.kl_div(mine.probabilities[s - 1].log(), theirs.probabilities[t - 1],
                                     reduction="none").sum(-1).mean() for s, t in ((1, 2), (2, 4))]).mean()
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-6)
    assert float(parts["attention_loss"]) > 0


def test_a_taggers_soft_targets_are_read_at_its_first_sub_tokens_only() -> None:
    from bertkit.model import BertForTokenClassification
    from bertkit.tasks.distillation import SOFT_MASK_KEY

    torch.manual_seed(7)
    tagging = TaggingTask(TaggingSettings(labels=["O", "B-X", "I-X"]))
    model = DistillationModel(BertForTokenClassification(preset("bert-debug", vocab_size=12).replace(
        num_labels=3)).eval(), torch.nn.Identity())
    features = [{"input_ids": [2, 5, 6, 7, 3], "token_type_ids": [0] * 5, "attention_mask": [1] * 5,
                 "labels": [-100] * 5, LABELLED_KEY: False, SOFT_MASK_KEY: [0, 1, 0, 1, 0],
                 TEACHER_KEY: {"logits": np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32)}}]
    batch = collate_distillation(features, 0)
    loss, _ = DistillationLoss(tagging, LossWeights(soft=1.0, hard=0.0, hidden=0.0, temperature=2.0))(model, batch)
    logits = model.student(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"]).logits
    first = torch.tensor([[False, True, False, True, False]])
    torch.testing.assert_close(loss, _kl(logits[first], batch[TEACHER_KEY]["logits"][first], 2.0))
