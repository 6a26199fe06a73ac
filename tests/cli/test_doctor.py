"""`bertkit doctor`: the machine, the measured rates and the choices of auto, as text and as JSON that
BERTKIT_PROBE_FILE takes back; --refresh measures again."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from bertkit.cli import main
from bertkit.runtime import probe, report

PROFILES = Path(__file__).parent.parent / "assets" / "probe"


@pytest.fixture(autouse=True)
def fresh_memory():
    probe.reset()
    yield
    probe.reset()


def test_doctor_prints_the_machine_rates_and_choices(capsys, monkeypatch):
    monkeypatch.setenv("BERTKIT_PROBE_FILE", str(PROFILES / "intel-xeon-no-amx.json"))
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("machine: ") and probe.machine().cpu in out and "cuda: none" in out
    assert "on one thread: training fp32 65, bf16 38; inference fp32 65, bf16 38, int8 130" in out
    assert "auto training: fp32" in out and "auto inference: fp32" in out
    assert "packed oneDNN linear in fp32: not taken" in out and "bmm attention in bf16: not taken" in out
    from bertkit.kernels import int8  # how --precision int8 quantizes here, with the bits this CPU sums exactly

    if int8.works():
        assert f"activations {int8.activation_bits()}-bit with one scale per token" in out


def test_doctor_json_is_a_probe_file(capsys, monkeypatch, tmp_path):
    assert main(["doctor", "--json"]) == 0  # the suite's amd-epyc profile
    report = json.loads(capsys.readouterr().out)
    assert report["choices"]["training"] == "bf16" and report["choices"]["bmm_attention"]["bf16"] == [64, 128]
    assert report["choices"]["bmm_attention_training"] == {"fp32": [32], "bf16": [32, 64, 128, 256]}
    assert report["machine"]["cpu"] == probe.machine().cpu
    saved = tmp_path / "probe.json"
    saved.write_text(json.dumps(report))
    monkeypatch.setenv("BERTKIT_PROBE_FILE", str(saved))
    probe.reset()
    assert probe.decide(probe.measurements()[0]) == probe.decide(probe.Measurements.from_json(
        json.loads((PROFILES / "amd-epyc.json").read_text())["measurements"]))


def test_doctor_refresh_measures_again(capsys, monkeypatch, tmp_path):
    monkeypatch.delenv("BERTKIT_PROBE_FILE")
    monkeypatch.setenv("BERTKIT_CACHE_DIR", str(tmp_path))
    widths = []
    amd = probe.Measurements.from_json(json.loads((PROFILES / "amd-epyc.json").read_text())["measurements"])
    monkeypatch.setattr(probe, "measure",
                        lambda width: widths.append(width) or dataclasses.replace(amd, width=width))
    assert main(["doctor", "--width", "256"]) == 0 and "measured now" in capsys.readouterr().out
    probe.reset()  # as in a new process
    assert main(["doctor", "--width", "256"]) == 0
    assert widths == [256] and "cached in" in capsys.readouterr().out
    assert main(["doctor", "--width", "256", "--refresh"]) == 0
    assert widths == [256, 256] and "measured now" in capsys.readouterr().out


@pytest.mark.parametrize(("flags", "expected"), [
    (("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8"), "Intel AMX (amx_tile amx_bf16 amx_int8)"),
    (("avx2", "avx512_bf16", "avx512_vnni"), "no AMX; bf16/int8 vector instructions: avx512_bf16 avx512_vnni"),
    (("avx2", "fma"), "no AMX and no bf16/int8 vector instructions"),
])
def test_matrix_extensions_are_named(flags, expected):
    assert report.matrix_extensions(flags).startswith(expected)


def test_doctor_step_prints_the_step_probe(capsys, monkeypatch):
    from bertkit.runtime import step_probe

    monkeypatch.setenv("BERTKIT_PROBE_FILE", str(PROFILES / "intel-xeon-no-amx.json"))
    asked = []

    def fake(encoder, purpose="training", rows=None, length=None, refresh=False):
        asked.append((encoder.config.hidden_size, purpose, rows, length))
        return step_probe.StepTimings(purpose, rows, length, 2, {"fp32": 0.2, "bf16": 0.1}, True), "measured now"

    monkeypatch.setattr(step_probe, "step_timings", fake)
    assert main(["doctor", "--width", "256", "--step"]) == 0
    out = capsys.readouterr().out
    assert "matrix extensions: " in out
    assert "step probe, training: bf16 (the training step of 2 of 12 layers at 4 x 128 tokens: fp32 200.0 ms, " \
           "bf16 100.0 ms, bf16 2.00x" in out
    assert asked == [(256, "training", 4, 128), (256, "inference", 4, 128)]
    assert main(["doctor", "--json", "--step"]) == 0
    assert len(json.loads(capsys.readouterr().out)["step_probe"]) == 2


def test_doctor_prints_the_training_attention_measured(capsys):
    assert main(["doctor"]) == 0  # the suite's amd-epyc profile, with its training attention timings
    out = capsys.readouterr().out
    assert "attention for training in bf16 (forward + backward), us SDPA/bmm by length: 32: 2050/730," in out
    assert "auto bmm attention for training in bf16: taken near 32, 64, 128, 256 tokens" in out
    assert "auto bmm attention for training in fp32: taken near 32 tokens" in out
    assert "attention for training in bf16 (forward + backward, dropout 0.1), us SDPA/bmm by length: 32: 1380/965," \
        in out
    assert "auto bmm attention for training with dropout 0.1 in bf16: taken near 32, 64, 128 tokens" in out
    assert "dropout in bf16 (forward + backward), us torch's/counter-based: 4670/1817" in out
    assert "auto counter-based dropout in bf16: taken (1817 vs torch's 4670 us" in out
