"""`bertkit doctor`: the machine, the measured rates and the choices of auto, as text and as JSON that
BERTKIT_PROBE_FILE takes back; --refresh measures again."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from bertkit import hardware
from bertkit.cli import main

PROFILES = Path(__file__).parent / "assets" / "probe"


@pytest.fixture(autouse=True)
def fresh_memory():
    hardware.reset()
    yield
    hardware.reset()


def test_doctor_prints_the_machine_rates_and_choices(capsys, monkeypatch):
    monkeypatch.setenv("BERTKIT_PROBE_FILE", str(PROFILES / "intel-xeon-no-amx.json"))
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("machine: ") and hardware.machine().cpu in out and "cuda: none" in out
    assert "on one thread: training fp32 65, bf16 38; inference fp32 65, bf16 38, int8 130" in out
    assert "auto training: fp32" in out and "auto inference: fp32" in out
    assert "packed oneDNN linear in fp32: not taken" in out and "bmm attention in bf16: not taken" in out


def test_doctor_json_is_a_probe_file(capsys, monkeypatch, tmp_path):
    assert main(["doctor", "--json"]) == 0  # the suite's amd-epyc profile
    report = json.loads(capsys.readouterr().out)
    assert report["choices"]["training"] == "bf16" and report["choices"]["bmm_attention"]["bf16"] == [64, 128]
    assert report["machine"]["cpu"] == hardware.machine().cpu
    saved = tmp_path / "probe.json"
    saved.write_text(json.dumps(report))
    monkeypatch.setenv("BERTKIT_PROBE_FILE", str(saved))
    hardware.reset()
    assert hardware.decide(hardware.measurements()[0]) == hardware.decide(hardware.Measurements.from_json(
        json.loads((PROFILES / "amd-epyc.json").read_text())["measurements"]))


def test_doctor_refresh_measures_again(capsys, monkeypatch, tmp_path):
    monkeypatch.delenv("BERTKIT_PROBE_FILE")
    monkeypatch.setenv("BERTKIT_CACHE_DIR", str(tmp_path))
    widths = []
    amd = hardware.Measurements.from_json(json.loads((PROFILES / "amd-epyc.json").read_text())["measurements"])
    monkeypatch.setattr(hardware, "measure",
                        lambda width: widths.append(width) or dataclasses.replace(amd, width=width))
    assert main(["doctor", "--width", "256"]) == 0 and "measured now" in capsys.readouterr().out
    hardware.reset()  # as in a new process
    assert main(["doctor", "--width", "256"]) == 0
    assert widths == [256] and "cached in" in capsys.readouterr().out
    assert main(["doctor", "--width", "256", "--refresh"]) == 0
    assert widths == [256, 256] and "measured now" in capsys.readouterr().out
