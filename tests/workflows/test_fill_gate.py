"""The fill gate of CPU training attention measured on the run's step (`bertkit.workflows.fill_gate`): the gate read
from the timings, the batches it times, the dispatch obeying it, when nothing is measured, the cache, and the run
receiving, saying and recording it."""

from __future__ import annotations

import types

import pytest
import torch

from bertkit.config import preset
from bertkit.model import BertForMaskedLM
from bertkit.model.attention import MIN_BMM_FILL, BatchedBmm, Dispatch, PerSequence
from bertkit.settings import TrainConfig
from bertkit.train.distributed import DistributedContext
from bertkit.workflows import fill_gate, prepare
from bertkit.workflows.fill_gate import FILLS, FillGate

READY = {"learning_rate": 1e-4, "precision": "fp32", "threads": 1}


class Choices:
    """Measured CPU attention choices whose bmm wins for training at every length but `lose_at`."""

    def __init__(self, lose_at: int | None = None) -> None:
        self.lose_at = lose_at

    def bmm(self, dtype, length):
        return False

    def bmm_anywhere(self, dtype):
        return False

    def bmm_for_training(self, dtype, length, dropout=False):
        return length != self.lose_at


def _model(choices: Choices | None = None) -> BertForMaskedLM:
    torch.manual_seed(0)
    model = BertForMaskedLM(preset("bert-debug", vocab_size=64, hidden_dropout_prob=0.0,
                                   attention_probs_dropout_prob=0.0))
    model.bert.attention = Dispatch(choices or Choices())
    return model


@pytest.fixture
def measuring(monkeypatch, tmp_path):
    """What a user's run has: no fixed probe file, a cache of its own, nothing measured yet in this process."""
    monkeypatch.delenv("BERTKIT_PROBE_FILE", raising=False)
    monkeypatch.setenv("BERTKIT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(fill_gate, "_measured", {})
    return tmp_path


def test_the_gate_is_the_least_fill_bmm_won_at_and_at_every_fuller_one():
    def gate(seconds):
        return FillGate(16, 64, "bf16", seconds, True).gate

    assert gate({0.875: (10, 8), 0.75: (10, 9), 0.625: (10, 11)}) == 0.75
    assert gate({0.875: (10, 8), 0.75: (10, 9), 0.625: (10, 9.5), 0.5: (10, 9.6)}) == 0.5
    assert gate({0.875: (10, 10)}) == 1.0  # a tie is not a win: full batches only
    said = FillGate(16, 64, "bf16", {0.875: (0.010, 0.008), 0.75: (0.010, 0.011)}, True).describe()
    assert said.startswith("bmm attention on batches at least 87.5% real tokens (bf16 step")
    assert "75.0% real: SDPA 10.0 ms, bmm 11.0 ms" in said


@pytest.mark.parametrize("rows, length", [(16, 64), (8, 128), (2, 32)])
def test_a_timed_batch_holds_the_fill_its_first_row_full(rows, length):
    for fill in FILLS:
        mask = fill_gate._mask(rows, length, fill)
        assert mask.shape == (rows, length) and bool(mask[0].all())
        assert abs(float(mask.float().mean()) - fill) <= 1 / length
        assert bool((mask.sum(1) >= 1).all())


def test_the_dispatch_runs_bmm_on_batches_at_least_its_gate():
    x = torch.zeros(4, 64, 32, requires_grad=True)  # a backward will run: training's kernels
    assert isinstance(Dispatch(Choices(), 0.5).select(x, True, 0.0, fill=0.6), BatchedBmm)
    assert isinstance(Dispatch(Choices()).select(x, True, 0.0, fill=0.6), PerSequence)  # the fixed 87.5%
    assert isinstance(Dispatch(Choices(), 1.0).select(x, True, 0.0, fill=0.95), PerSequence)
    assert repr(Dispatch(Choices(), 0.625)) == "Dispatch(measured, bmm from fill 0.625)"
    assert repr(Dispatch(Choices())) == "Dispatch(measured)"


def test_the_measurement_times_both_sides_from_the_fullest_fill_down_and_stops_at_bmms_first_loss(monkeypatch):
    """A fake clock: SDPA costs 1 at every fill, bmm 0.4 + 2 x the padding (it wins by more than 3% down to 75%, not
    at 68.75%)."""
    clock = types.SimpleNamespace(now=0.0)
    timed: list[tuple[str, float]] = []

    def step(cut, attention, ids, mask, precision):
        fill = float(mask.float().mean())
        side = "bmm" if attention.min_bmm_fill == 0.0 else "sdpa"

        def run():
            timed.append((side, round(fill, 3)))
            clock.now += 0.01 * (0.4 + 2 * (1 - fill) if side == "bmm" else 1.0)
        return run

    monkeypatch.setattr(fill_gate, "_step", step)
    monkeypatch.setattr(fill_gate, "time", types.SimpleNamespace(perf_counter=lambda: clock.now))
    model = _model()
    measured = fill_gate.measure(model.bert, model.bert.attention, "fp32", 16, 64)
    assert list(measured.seconds) == [0.875, 0.8125, 0.75, 0.6875]  # no lower fill timed: bmm did not win at 68.75%
    assert measured.gate == 0.75
    assert {side for side, _ in timed} == {"bmm", "sdpa"}
    assert sum(1 for side, fill in timed if abs(fill - 0.6875) < 0.02 and side == "bmm") == 1 + fill_gate.ROUNDS
    assert isinstance(model.bert.attention, Dispatch) and model.bert.attention.min_bmm_fill == MIN_BMM_FILL


def test_a_real_measurement_of_a_tiny_encoder(measuring, monkeypatch):
    from bertkit.kernels import attention as kernels

    ran = []  # one entry per bmm attention call: only the bmm side runs it (the SDPA side attends per sequence)
    real_kernel = kernels.bmm_attention
    monkeypatch.setattr(kernels, "bmm_attention", lambda *a, **k: ran.append(1) or real_kernel(*a, **k))
    model = _model()
    measured = fill_gate.measured_gate(model, "fp32", 4, 32)
    assert measured is not None
    layers, fills = len(model.bert.layers), len(measured.seconds)
    assert fills * (1 + fill_gate.ROUNDS) * layers <= len(ran) <= fills * (1 + fill_gate.MAX_ROUNDS) * layers
    assert measured is not None and (measured.rows, measured.length, measured.precision) == (4, 32, "fp32")
    assert list(measured.seconds) == list(FILLS[:len(measured.seconds)])
    assert all(sdpa > 0 and bmm > 0 for sdpa, bmm in measured.seconds.values())
    assert measured.gate in (1.0, *FILLS)
    assert model.bert.attention.min_bmm_fill == MIN_BMM_FILL  # measuring sets nothing: the caller does


def test_nothing_is_measured_where_the_gate_cannot_matter(measuring, monkeypatch):
    def never(*args):
        raise AssertionError("measured")

    monkeypatch.setattr(fill_gate, "measure", never)
    assert fill_gate.measured_gate(_model(Choices(lose_at=64)), "bf16", 16, 64) is None  # SDPA at this length
    assert fill_gate.measured_gate(_model(), "bf16", 1, 64) is None  # one-row batches are never padded
    plain = _model()
    plain.bert.attention = Dispatch()  # no measured choices
    assert fill_gate.measured_gate(plain, "bf16", 16, 64) is None
    monkeypatch.setenv("BERTKIT_CPU_KERNELS", "0")
    assert fill_gate.measured_gate(_model(), "bf16", 16, 64) is None
    monkeypatch.delenv("BERTKIT_CPU_KERNELS")
    monkeypatch.setenv("BERTKIT_PROBE_FILE", "fixed.json")  # fixed choices (the test suite): the fixed gate
    assert fill_gate.measured_gate(_model(), "bf16", 16, 64) is None


def test_a_steady_measurement_is_cached_and_read_back_an_unsteady_one_is_not(measuring, monkeypatch, caplog):
    calls = []

    def fake(encoder, dispatch, precision, rows, length, steady=True):
        calls.append((rows, length))
        return FillGate(rows, length, precision, {0.875: (2.0, 1.0), 0.75: (2.0, 3.0)}, steady)

    monkeypatch.setattr(fill_gate, "measure", fake)
    with caplog.at_level("INFO", logger="bertkit.workflows.fill_gate"):
        first = fill_gate.measured_gate(_model(), "bf16", 16, 64)
    assert first is not None and first.gate == 0.875 and calls == [(16, 64)]
    assert "[measured now]" in caplog.text
    assert fill_gate.measured_gate(_model(), "bf16", 16, 64) is first  # the same process: measured once
    monkeypatch.setattr(fill_gate, "_measured", {})  # a new process: read from the cache
    again = fill_gate.measured_gate(_model(), "bf16", 16, 64)
    assert again is not None and again.seconds == first.seconds and calls == [(16, 64)]
    [cached] = measuring.glob("fill-*.json")
    cached.write_text("{not json")
    monkeypatch.setattr(fill_gate, "_measured", {})
    with caplog.at_level("WARNING", logger="bertkit.workflows.fill_gate"):
        fill_gate.measured_gate(_model(), "bf16", 16, 64)
    assert "ignoring the unreadable fill-gate cache" in caplog.text and len(calls) == 2
    monkeypatch.setattr(fill_gate, "measure", lambda *a: fake(*a, steady=False))
    monkeypatch.setattr(fill_gate, "_measured", {})
    fill_gate.measured_gate(_model(), "bf16", 8, 64)
    assert len(list(measuring.glob("fill-*.json"))) == 1  # the unsteady one was not written


def test_the_run_receives_says_and_records_its_measured_gate(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("BERTKIT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(fill_gate, "_measured", {})
    monkeypatch.setattr(fill_gate, "_fixed_choices", lambda: False)  # the suite's probe profile, a gate measured
    monkeypatch.setattr(fill_gate, "measure",
                        lambda encoder, dispatch, precision, rows, length:
                        FillGate(rows, length, precision, {0.875: (2.0, 1.0), 0.75: (2.0, 1.5), 0.625: (2.0, 2.5)},
                                 True))
    model = BertForMaskedLM(preset("bert-debug", vocab_size=64, hidden_dropout_prob=0.0,
                                   attention_probs_dropout_prob=0.0))
    with caplog.at_level("INFO"):
        # the suite's AMD profile: bmm attention for training in fp32 near 32 tokens
        prepare.prepare_training(model, TrainConfig(**READY), DistributedContext(), rows=16, length=32)
    assert model.bert.attention.min_bmm_fill == 0.75
    assert "fill gate for training attention on this CPU: bmm attention on batches at least 75.0% real" in caplog.text
    assert prepare.training_kernels(model, torch.device("cpu"), "fp32")["bmm_min_fill"] == 0.75


def test_an_unsteady_side_is_timed_up_to_max_rounds_and_said_unsteady(monkeypatch):
    """SDPA slower each round (its two fastest never within 10%): every fill takes MAX_ROUNDS rounds."""
    clock = types.SimpleNamespace(now=0.0, calls=0, sdpa=0)

    def step(cut, attention, ids, mask, precision):
        def run():
            clock.calls += 1
            if attention.min_bmm_fill == 0.0:
                clock.now += 0.005
            else:
                clock.sdpa += 1
                clock.now += 0.01 * 1.2 ** (clock.sdpa % 8)  # each round 20% slower than the last (at a fill)
        return run

    monkeypatch.setattr(fill_gate, "_step", step)
    monkeypatch.setattr(fill_gate, "time", types.SimpleNamespace(perf_counter=lambda: clock.now))
    model = _model()
    measured = fill_gate.measure(model.bert, model.bert.attention, "fp32", 16, 64)
    assert not measured.steady and measured.gate == FILLS[-1]
    assert clock.calls == len(FILLS) * 2 * (1 + fill_gate.MAX_ROUNDS)


def test_a_frozen_encoder_or_encoders_of_two_shapes_measure_nothing(measuring, monkeypatch):
    monkeypatch.setattr(fill_gate, "measure", lambda *a: pytest.fail("measured"))
    frozen = _model()
    frozen.bert.requires_grad_(False)  # --freeze-encoder: its batches never run training's kernels
    assert fill_gate.measured_gate(frozen, "bf16", 16, 64) is None
    pair = torch.nn.ModuleDict({"a": _model(), "b": BertForMaskedLM(preset("bert-debug", vocab_size=64, hidden_size=64,
                                                                          num_attention_heads=1))})
    assert fill_gate.measured_gate(pair, "bf16", 16, 64) is None


def test_a_measurement_that_fails_leaves_the_fixed_gate_and_says_so(measuring, monkeypatch, caplog):
    def broken(*args):
        raise RuntimeError("no kernel")

    monkeypatch.setattr(fill_gate, "measure", broken)
    with caplog.at_level("WARNING", logger="bertkit.workflows.fill_gate"):
        assert fill_gate.measured_gate(_model(), "bf16", 16, 64) is None
    assert "the fill gate could not be measured (RuntimeError: no kernel); the fixed gate stands" in caplog.text


def test_a_near_tie_is_not_a_win_and_a_long_measurement_stops_early(monkeypatch):
    assert FillGate(16, 64, "bf16", {0.875: (1.02, 1.0)}, True).gate == 1.0  # within MIN_WIN: a tie
    assert FillGate(16, 64, "bf16", {0.875: (1.04, 1.0)}, True).gate == 0.875
    clock = types.SimpleNamespace(now=0.0)

    def step(cut, attention, ids, mask, precision):
        def run():
            clock.now += 0.5 if attention.min_bmm_fill == 0.0 else 1.0  # bmm wins everywhere, each step 0.5-1 s
        return run

    monkeypatch.setattr(fill_gate, "_step", step)
    monkeypatch.setattr(fill_gate, "time", types.SimpleNamespace(perf_counter=lambda: clock.now))
    model = _model()
    measured = fill_gate.measure(model.bert, model.bert.attention, "fp32", 16, 64)
    assert list(measured.seconds) == [0.875]  # 6 s of steps at the first fill: past MAX_SECONDS, no lower fill timed
    assert measured.gate == 0.875


def test_the_planners_rate_is_measured_with_the_gate(monkeypatch):
    from bertkit.workflows import pretrain_plan

    applied = []
    monkeypatch.setattr(pretrain_plan, "apply_fill_gate", lambda model, *step: applied.append(step))
    pretrain_plan._as_run(preset("bert-debug", vocab_size=64), torch.device("cpu"), ("bf16", 16, 64))
    assert applied == [("bf16", 16, 64)]
