"""The quickstart's time plan on a busy machine (issue 30: measured under load it planned ~8x too long and refused
`--minutes 2`, which then ran in 137 s on the idle machine): the probe keeps each rate's fastest round, the load
is detected and said, and within the factor the measurement cannot rule out the plan warns instead of
refusing. Simulated: the probe and the load average are monkeypatched, so these tests take a second."""

from __future__ import annotations

import dataclasses
import json

import pytest

from bertkit.errors import BertkitError
from bertkit.quickstart import QuickstartSettings, Rates, plan_time, stages
from bertkit.quickstart import load as load_module
from bertkit.quickstart.load import BUSY_UNCERTAINTY, IDLE_UNCERTAINTY, Load, fastest_rates, machine_load
from bertkit.quickstart.plan import MIN_PRETRAIN_S, REPORT_S, FinetuneWork, TimePlan
from bertkit.tokenizer import WordPieceTokenizer

IDLE = Rates(pretrain_steps_per_s=4.4, finetune_steps_per_s=12.0, eval_examples_per_s=900.0)  # 2 idle cores
LOADED = Rates(*(rate / 8 for rate in dataclasses.astuple(IDLE)))  # what the probe measured under load
WORK = FinetuneWork(runs_per_seed=2, train_examples=1000, batch_size=32, eval_examples=2000)


def _probe(sequence):
    calls = []

    def probe():
        calls.append(1)
        return sequence[min(len(calls), len(sequence)) - 1]
    return probe, calls


def test_each_rate_keeps_its_fastest_round_and_settled_rounds_stop_early():
    probe, calls = _probe([LOADED, IDLE, IDLE])  # busy for the first round only
    assert fastest_rates(probe) == IDLE and len(calls) == 3
    mixed = Rates(5.0, 1.0, 1000.0)
    probe, calls = _probe([IDLE, mixed, IDLE])
    assert fastest_rates(probe) == Rates(5.0, 12.0, 1000.0)  # each rate its own best
    probe, calls = _probe([IDLE, Rates(4.3, 12.5, 880.0)])  # within 10%: no third round
    assert fastest_rates(probe, rounds=5) == Rates(4.4, 12.5, 900.0) and len(calls) == 2


def test_load_is_detected_from_the_load_average_or_the_cpu_the_probe_got(monkeypatch):
    assert not Load(0.8, 2, 0.95).busy and Load(0.8, 2, 0.95).uncertainty == IDLE_UNCERTAINTY
    assert Load(5.0, 2, 0.9).busy and Load(5.0, 2, 0.9).uncertainty == BUSY_UNCERTAINTY
    assert Load(None, 2, 0.3).busy  # starved: other programs had the cores
    monkeypatch.setattr(load_module.os, "getloadavg", lambda: (5.2, 4.0, 3.0))
    busy = machine_load(cpu_s=2.0, wall_s=4.0, threads=2)
    assert busy.busy and busy.load_1min == 5.2 and busy.cpu_share == pytest.approx(2.0 / (4.0 * min(2, busy.cores)))
    assert busy.describe().startswith("busy: load average 5.2 on")


def test_a_busy_machine_gets_a_plan_for_the_budget_with_a_warning_instead_of_a_refusal():
    with pytest.raises(BertkitError, match=r"--minutes 2 is too short here"):  # as before on a trusted measurement
        plan_time(120, 5, LOADED, WORK, epochs=5, seeds=(1, 2, 3))
    busy = Load(5.0, 2, 0.4)
    plan = plan_time(120, 5, LOADED, WORK, epochs=5, seeds=(1, 2, 3), uncertainty=busy.uncertainty,
                     load=busy.describe())
    assert 1 < plan.speedup <= BUSY_UNCERTAINTY and plan.pretrain_s >= MIN_PRETRAIN_S
    assert plan.spent_s + plan.pretrain_s + plan.finetune_s + REPORT_S == pytest.approx(120)  # planned for the budget
    assert (plan.finetune_epochs, plan.seeds) == (2, (1, 2))
    assert "may be up to 8x slow" in plan.warning and "busy: load average 5.0" in plan.warning
    assert "planned at" in plan.describe() and "machine busy" in plan.describe()
    assert TimePlan.from_json(json.loads(json.dumps(plan.to_json()))) == plan  # plan.json keeps it for --resume
    idle = plan_time(120, 5, IDLE, WORK, epochs=5, seeds=(1, 2, 3), uncertainty=IDLE_UNCERTAINTY)
    assert idle.speedup == 1 and idle.warning == ""  # nothing assumed where the measurement fits
    with pytest.raises(BertkitError, match=r"even if the machine is 8x faster than measured"):
        plan_time(30, 5, LOADED, WORK, epochs=5, seeds=(1, 2, 3), uncertainty=BUSY_UNCERTAINTY)


@pytest.mark.parametrize("first_round_only", [True, False])
def test_time_plan_on_a_simulated_busy_machine(first_round_only, tmp_path, monkeypatch):
    """Load only during the first probe: the fastest round plans as on the idle machine. Load throughout: the
    load average says busy, and `--minutes 2` is planned with a warning rather than refused."""
    rounds = [LOADED, IDLE, IDLE] if first_round_only else [LOADED, LOADED, LOADED]
    probe, calls = _probe(rounds)
    monkeypatch.setattr(stages, "probe_rates", lambda *args: probe())
    monkeypatch.setattr(load_module.os, "getloadavg", lambda: (0.5 if first_round_only else 5.5, 1.0, 1.0))
    cfg = QuickstartSettings(output=tmp_path, minutes=2.0)
    echoed: list[str] = []
    tokenizer = WordPieceTokenizer.from_pretrained("tests/assets/vocab/bert-base-uncased")
    clock = stages.StageClock(tmp_path / "timings.json")
    clock.add("vocabulary_and_data_s", 5.0)
    plan = stages.time_plan(cfg, tokenizer, clock, echo=echoed.append)
    assert plan.spent_s >= 5.0 + plan.probe_s and clock.totals["speed_probe_s"] == pytest.approx(plan.probe_s)
    assert len(calls) == (3 if first_round_only else 2)  # two equal rounds settle it
    assert plan.rates == (IDLE if first_round_only else LOADED)
    assert TimePlan.from_json(json.loads((tmp_path / "plan.json").read_text())) == plan
    if first_round_only:
        assert plan.speedup == 1 and not plan.warning and "machine idle" in echoed[0]
    else:
        assert plan.speedup > 1 and "machine busy: load average 5.5" in echoed[0]
        assert echoed[1].startswith("      warning: at the speed measured now")


@pytest.mark.parametrize("edit", [{"pretrain_s": "600"}, {"pretrain_s": float("nan")}, {"finetune_s": -1.0},
                                  {"seeds": [1, "2"]}, {"rates": {"pretrain_steps_per_s": 0.0}}, {"extra": 1.0},
                                  {"speedup": True}])
def test_an_edited_plan_json_is_refused_and_planned_again_never_planned_with(edit, tmp_path, monkeypatch, caplog):
    """A hand-edited plan.json gave a TypeError traceback, or (a negative or NaN share) a plan no run can follow;
    timings.json entries that are not seconds broke the report's sums."""
    plan = plan_time(600, 5, IDLE, WORK, epochs=5, seeds=(1, 2, 3))
    kept = plan.to_json()
    kept.update(edit if "rates" not in edit else {"rates": {**kept["rates"], **edit["rates"]}})
    with pytest.raises(BertkitError, match="not a time plan bertkit writes"):
        TimePlan.from_json(kept)
    (tmp_path / "plan.json").write_text(json.dumps(kept))
    (tmp_path / "timings.json").write_text(json.dumps({"vocabulary_and_data_s": 5.0, "pretraining_s": "soon"}))
    probe, _ = _probe([IDLE, IDLE, IDLE])
    monkeypatch.setattr(stages, "probe_rates", lambda *args: probe())
    with caplog.at_level("WARNING"):
        clock = stages.StageClock(tmp_path / "timings.json")
    assert clock.totals == {"vocabulary_and_data_s": 5.0} and "pretraining_s not seconds" in caplog.text
    echoed: list[str] = []
    tokenizer = WordPieceTokenizer.from_pretrained("tests/assets/vocab/bert-base-uncased")
    again = stages.time_plan(QuickstartSettings(output=tmp_path, minutes=10.0, resume=True), tokenizer, clock,
                             echo=echoed.append)
    assert "not a time plan bertkit writes" in echoed[0] and echoed[0].endswith("planned again")
    assert TimePlan.from_json(json.loads((tmp_path / "plan.json").read_text())) == again
