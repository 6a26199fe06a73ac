"""bertkit.runtime.probe: the decisions from injected timings (an AMD EPYC where bf16 is fast, an Intel Xeon
without AMX where it is slow), the cache (read, write, corrupt, stale, unwritable), the probe file, and
the real probe once."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import pytest
import torch

from bertkit.config import preset
from bertkit.errors import BertkitError
from bertkit.kernels import attention as attention_kernels
from bertkit.model import BertModel
from bertkit.model.accelerate import PackedLinear, accelerate_for_inference, onednn_works
from bertkit.runtime import probe

PROFILES = Path(__file__).parents[1] / "assets" / "probe"


def profile(name: str) -> probe.Measurements:
    return probe.Measurements.from_json(json.loads((PROFILES / f"{name}.json").read_text())["measurements"])


@pytest.fixture
def probed(monkeypatch, tmp_path):
    """No probe file, a fresh cache directory, and `measure` replaced by a counted fake."""
    monkeypatch.delenv("BERTKIT_PROBE_FILE")
    monkeypatch.setenv("BERTKIT_CACHE_DIR", str(tmp_path / "cache"))
    calls = []

    def fake(width):
        calls.append(width)
        return dataclasses.replace(profile("amd-epyc"), width=width)
    monkeypatch.setattr(probe, "measure", fake)
    probe.reset()
    yield calls
    monkeypatch.undo()
    probe.reset()


def with_rates(train=(180.0, 700.0), inference=(400.0, 830.0)) -> probe.Measurements:
    base = profile("amd-epyc")
    rates = dict(zip(("fp32", "bf16"), inference))
    return dataclasses.replace(base, train=dict(zip(("fp32", "bf16"), train)), linear=rates, packed=rates)


# --- decisions ------------------------------------------------------------------------------------

def test_amd_epyc_profile_picks_bf16_and_every_fast_path():
    chosen = probe.decide(profile("amd-epyc"))
    assert (chosen.train_precision, chosen.inference_precision) == ("bf16", "bf16")
    assert chosen.packed(torch.float32) and chosen.packed(torch.bfloat16)
    assert chosen.bmm_attention == {"fp32": (), "bf16": (64, 128)}
    # a length takes the verdict of the nearest probed length on a log scale: 64 covers 46-90, 128 91-181
    assert [n for n in range(1, 600) if chosen.bmm(torch.bfloat16, n)] == list(range(46, 182))
    assert not any(chosen.bmm(torch.float32, n) for n in range(1, 600))


def test_intel_profile_where_bf16_is_slower_picks_fp32_and_no_bf16_fast_path():
    """Issue 14's Intel Xeon (avx512_bf16, no AMX): bf16 ~0.6x fp32, so auto is fp32 for training and
    inference, bf16 bmm attention is not taken, and F.linear beats the packed fp32 weight there."""
    chosen = probe.decide(profile("intel-xeon-no-amx"))
    assert (chosen.train_precision, chosen.inference_precision) == ("fp32", "fp32")
    assert not chosen.packed(torch.float32)
    assert not any(chosen.bmm(dtype, n) for dtype in (torch.float32, torch.bfloat16) for n in (16, 64, 128, 512))
    assert any("0.58x" in reason and reason.startswith("training: fp32") for reason in chosen.reasons)


@pytest.mark.parametrize(("bf16", "expected"), [(1.2, "bf16"), (1.19, "fp32"), (0.6, "fp32"), (0.0, "fp32")])
def test_bf16_only_when_at_least_1_2x_fp32(bf16, expected):
    chosen = probe.decide(with_rates(train=(100.0, 100.0 * bf16), inference=(100.0, 100.0 * bf16)))
    assert chosen.train_precision == expected
    assert chosen.inference_precision == expected


def test_inference_compares_the_faster_kernel_of_each_precision():
    m = dataclasses.replace(profile("amd-epyc"), linear={"fp32": 500.0, "bf16": 100.0},
                            packed={"fp32": 100.0, "bf16": 590.0})
    chosen = probe.decide(m)
    assert chosen.inference_precision == "fp32"  # 590 < 1.2 * 500
    assert chosen.packed_linear == ("bf16",)


@pytest.mark.parametrize(("speedup", "taken"), [(1.1, True), (1.09, False), (0.9, False)])
def test_a_fast_path_needs_1_1x(speedup, taken):
    m = dataclasses.replace(profile("amd-epyc"), linear={"fp32": 100.0, "bf16": 100.0},
                            packed={"fp32": 100.0 * speedup, "bf16": 100.0},
                            attention={p: [(n, 100.0 * speedup, 100.0) for n in probe.ATTENTION_LENGTHS]
                                       for p in ("fp32", "bf16")})
    chosen = probe.decide(m)
    assert chosen.packed(torch.float32) is taken and not chosen.packed(torch.bfloat16)
    assert chosen.bmm(torch.bfloat16, 100) is taken


def test_a_kernel_that_does_not_run_here_is_never_chosen():
    m = dataclasses.replace(profile("amd-epyc"), packed={"fp32": 0.0, "bf16": 0.0},
                            attention={p: [(n, 100.0, 0.0) for n in probe.ATTENTION_LENGTHS]
                                       for p in ("fp32", "bf16")})
    chosen = probe.decide(m)
    assert chosen.packed_linear == () and chosen.bmm_attention == {"fp32": (), "bf16": ()}


def test_training_attention_has_its_own_verdict_at_1_1x():
    """Training's bmm verdict comes from the forward + backward timings alone, at the same 1.1x rule, and says
    so in its own reason line; a probe file without training timings leaves training on SDPA."""
    timings = {"fp32": [(n, 100.0, 100.0) for n in probe.ATTENTION_LENGTHS],
               "bf16": [(32, 300.0, 100.0), (64, 111.0, 100.0), (128, 109.0, 100.0), (256, 100.0, 0.0),
                        (512, 90.0, 100.0)]}
    chosen = probe.decide(dataclasses.replace(profile("amd-epyc"), attention_training=timings))
    assert chosen.bmm_training == {"fp32": (), "bf16": (32, 64)}
    assert chosen.bmm_for_training(torch.bfloat16, 40) and chosen.bmm_for_training(torch.bfloat16, 64)
    assert not chosen.bmm_for_training(torch.bfloat16, 128) and not chosen.bmm_for_training(torch.float32, 32)
    assert chosen.bmm(torch.bfloat16, 64) == probe.decide(profile("amd-epyc")).bmm(torch.bfloat16, 64)  # its own
    assert ("bmm attention for training in bf16: taken near 32, 64 tokens, where its forward + backward beat "
            "SDPA's") in chosen.reasons
    data = profile("amd-epyc").to_json()
    del data["attention_training"], data["attention_training_dropout"], data["dropout"]
    older = probe.Measurements.from_json(data)
    assert older.attention_training == {} and probe.decide(older).bmm_training == {"fp32": (), "bf16": ()}
    assert not any("for training" in reason or "dropout" in reason for reason in probe.decide(older).reasons)
    assert probe.decide(older).counter_dropout == () and not probe.decide(older).bmm_for_training(torch.bfloat16, 64,
                                                                                                  dropout=True)


def test_dropout_and_attention_with_dropout_have_their_own_verdicts_at_1_1x():
    """The counter-based dropout is taken per precision where its forward + backward beat torch's by 1.1x; bmm
    attention with attention dropout has its own verdict per length, apart from the one without; each says so in
    a reason line."""
    without = {"fp32": [(n, 100.0, 100.0) for n in probe.ATTENTION_LENGTHS],
               "bf16": [(n, 300.0, 100.0) for n in probe.ATTENTION_LENGTHS]}
    with_dropout = {"fp32": [(n, 111.0, 100.0) for n in probe.ATTENTION_LENGTHS],
                    "bf16": [(32, 300.0, 100.0)] + [(n, 100.0, 100.0) for n in probe.ATTENTION_LENGTHS[1:]]}
    chosen = probe.decide(dataclasses.replace(profile("amd-epyc"), attention_training=without,
                                              attention_training_dropout=with_dropout,
                                              dropout={"fp32": (111.0, 100.0), "bf16": (109.0, 100.0)}))
    assert chosen.counter_dropout == ("fp32",)
    assert chosen.dropout_by_counter(torch.float32) and not chosen.dropout_by_counter(torch.bfloat16)
    assert chosen.bmm_for_training(torch.bfloat16, 128) and not chosen.bmm_for_training(torch.bfloat16, 128, True)
    assert chosen.bmm_for_training(torch.bfloat16, 32, True) and chosen.bmm_for_training(torch.float32, 64, True)
    assert not chosen.bmm_for_training(torch.float32, 64)
    assert "counter-based dropout in fp32: taken (100 vs torch's 111 us, forward + backward; needs 1.1x)" \
        in chosen.reasons
    assert ("bmm attention for training with dropout 0.1 in bf16: taken near 32 tokens, where its forward + backward "
            "beat SDPA's") in chosen.reasons


# --- auto precision and the kernels under each profile -----------------------------------------

def test_auto_precision_follows_the_measurements(use_profile):
    cpu_device = torch.device("cpu")
    use_profile("amd-epyc")
    assert probe.auto_precision(cpu_device) == "bf16"
    assert probe.auto_precision(cpu_device, purpose="inference") == "bf16"
    use_profile("intel-xeon-no-amx")
    assert probe.auto_precision(cpu_device) == "fp32"
    assert probe.auto_precision(cpu_device, purpose="inference") == "fp32"
    assert probe.matmul_gflops("fp32", threads=1) == 65.0 and probe.matmul_gflops("bf16", threads=1) == 38.0
    assert probe.matmul_gflops("bf16", purpose="inference", threads=2) == 77.0  # F.linear: packed is < 1.1x
    assert probe.matmul_gflops("int8", purpose="inference", threads=1) == 130.0


def test_auto_precision_logs_one_line_with_numbers(use_profile, caplog):
    use_profile("intel-xeon-no-amx")
    with caplog.at_level(logging.INFO, logger="bertkit.runtime.probe"):
        probe.auto_precision(torch.device("cpu"))
        probe.auto_precision(torch.device("cpu"))
    [record] = [r for r in caplog.records if "precision auto" in r.getMessage()]
    assert "fp32" in record.getMessage() and "bf16 38 vs fp32 65 GFLOP/s" in record.getMessage()


def test_gpus_are_not_probed(monkeypatch):
    monkeypatch.setattr(probe, "measurements", lambda *a, **k: pytest.fail("probed for a GPU"))
    for supported, expected in [(True, "bf16"), (False, "fp32")]:
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda supported=supported: supported)
        assert probe.auto_precision(torch.device("cuda")) == expected
    assert probe.auto_precision(torch.device("mps")) == "fp32"


def test_intel_profile_keeps_the_model_on_the_eager_path(use_profile, monkeypatch):
    """Where the packed fp32 weight and bf16 bmm attention lost, the accelerated model does not take them,
    and gives the same outputs."""
    calls = []
    original = attention_kernels.bmm_attention
    monkeypatch.setattr(attention_kernels, "bmm_attention", lambda *qkv: calls.append(1) or original(*qkv))
    torch.manual_seed(0)
    model = BertModel(preset("bert-debug")).eval()
    ids = torch.randint(5, 99, (2, 64))
    outputs, packed, chosen = {}, {}, {}
    for name in ("intel-xeon-no-amx", "amd-epyc"):
        use_profile(name)
        chosen[name] = [probe.choices(32).packed(dtype) for dtype in (torch.float32, torch.bfloat16)]
        fast, half = accelerate_for_inference(model), accelerate_for_inference(model, "bf16")
        packed[name] = sum(isinstance(m, PackedLinear) for m in [*fast.modules(), *half.modules()])
        with torch.inference_mode():
            outputs[name] = fast(ids).last_hidden_state
            half(ids)
    # Intel: no dense layer packed, no bmm attention; AMD: each copy's 8 dense layers, bf16 bmm attention.
    # A profile decides what is faster, but only where this machine's oneDNN runs the dtype at all is a layer
    # packed (an AMD EPYC here has no bf16 oneDNN kernels), so the count depends on the build, not the CPU name.
    assert chosen == {"intel-xeon-no-amx": [False, False], "amd-epyc": [True, True]}
    amd = sum(8 for dtype in (torch.float32, torch.bfloat16) if onednn_works(dtype))
    assert packed == {"intel-xeon-no-amx": 0, "amd-epyc": amd} and len(calls) == 2
    torch.testing.assert_close(outputs["intel-xeon-no-amx"], outputs["amd-epyc"], atol=1e-5, rtol=1e-5)


def test_model_width_is_the_hidden_size():
    assert probe.model_width(BertModel(preset("bert-debug", hidden_size=48, num_attention_heads=4))) == 48
    assert probe.model_width(torch.nn.ReLU()) == probe.DEFAULT_WIDTH


# --- cache ----------------------------------------------------------------------------------------

def test_measures_once_then_reads_the_cache(probed, tmp_path):
    first, source = probe.measurements(256)
    assert probed == [256] and source == "measured now"
    probe.reset()  # a new process
    again, source = probe.measurements(256)
    assert probed == [256] and again == first and source.startswith("cached in")
    [path] = (tmp_path / "cache").glob("probe-*.json")
    assert json.loads(path.read_text())["key"] == probe.cache_key(256)
    probe.measurements(512)
    assert probed == [256, 512]  # another width, another probe
    probe.measurements(256, refresh=True)
    assert probed == [256, 512, 256]


@pytest.mark.parametrize("content", ["{not json", "[]", '{"key": 1}', "\xff\xfe", ""])
def test_a_corrupt_cache_is_ignored_and_rewritten(probed, content, caplog):
    path = probe.cache_file(probe.cache_key(768))
    path.parent.mkdir(parents=True)
    path.write_bytes(content.encode("latin-1"))
    with caplog.at_level(logging.INFO, logger="bertkit.runtime.probe"):
        measured, source = probe.measurements()
    assert probed == [768] and source == "measured now"
    assert probe.read_cache(path, probe.cache_key(768)) == measured


def test_a_cache_with_bad_numbers_is_ignored(probed):
    key = probe.cache_key(768)
    data = profile("amd-epyc").to_json()
    for bad in (float("nan"), -1.0, "fast", None, True):
        probe.cache_file(key).parent.mkdir(parents=True, exist_ok=True)
        probe.cache_file(key).write_text(json.dumps({"key": key, "measurements": {**data, "int8": bad}}))
        assert probe.read_cache(probe.cache_file(key), key) is None


def test_a_stale_cache_is_ignored(probed):
    probe.measurements()
    path = probe.cache_file(probe.cache_key(768))
    stale = json.loads(path.read_text())
    stale["key"]["torch"] = "1.0.0"  # measured under another version, stored under this name
    path.write_text(json.dumps(stale))
    probe.reset()
    assert probe.measurements()[1] == "measured now" and probed == [768, 768]
    other = probe.Machine("Other CPU", 64, 64, (), torch.__version__, "3.0", "0.1.0", None)
    assert probe.cache_key(768, other) != probe.cache_key(768)


def test_an_unsteady_probe_serves_this_run_and_is_not_cached(probed, monkeypatch, caplog):
    """Timings that never settled (a busy machine) must not fix the choices of every later run."""
    unsteady = dataclasses.replace(profile("intel-xeon-no-amx"), steady=False)
    monkeypatch.setattr(probe, "measure", lambda width: probed.append(width) or unsteady)
    with caplog.at_level(logging.WARNING, logger="bertkit.runtime.probe"):
        measured, source = probe.measurements()
    assert measured == unsteady and source == "measured now, unsteady (not cached)"
    assert "did not settle" in caplog.text and "bertkit doctor --refresh" in caplog.text
    assert not list(probe.cache_dir().glob("probe-*.json"))
    probe.reset()  # the next process measures again
    probe.measurements()
    assert probed == [768, 768]


def test_fastest_reports_whether_the_timings_settled(monkeypatch):
    clock = iter(range(1000))
    monkeypatch.setattr(probe.time, "perf_counter", lambda: next(clock) * 1.0)
    _, steady = probe._fastest({"a": lambda: None})  # every run takes exactly 1 "second"
    assert steady
    durations = iter([1.0, 3.0, 9.0, 27.0, 81.0] * 10)
    times = {"t": 0.0}

    def jittery() -> float:
        times["t"] += next(durations) / 2
        return times["t"]
    monkeypatch.setattr(probe.time, "perf_counter", jittery)
    _, steady = probe._fastest({"a": lambda: None})
    assert not steady


def test_an_unwritable_cache_directory_costs_only_a_warning(probed, monkeypatch, tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("BERTKIT_CACHE_DIR", str(blocker / "cache"))  # under a file: cannot be made
    with caplog.at_level(logging.WARNING, logger="bertkit.runtime.probe"):
        assert probe.measurements()[1] == "measured now"
    assert "cannot write the probe cache" in caplog.text


def test_cache_directory_default(monkeypatch, tmp_path):
    monkeypatch.delenv("BERTKIT_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert probe.cache_dir() == tmp_path / "bertkit"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert probe.cache_dir() == tmp_path / "home" / ".cache" / "bertkit"


def test_a_bad_probe_file_is_a_clear_error(monkeypatch, tmp_path):
    bad = tmp_path / "probe.json"
    bad.write_text('{"measurements": {"width": 768}}')
    monkeypatch.setenv("BERTKIT_PROBE_FILE", str(bad))
    probe.reset()
    try:
        with pytest.raises(BertkitError, match="BERTKIT_PROBE_FILE .*probe.json: not a probe result"):
            probe.choices()
        good = {"measurements": {**profile("amd-epyc").to_json(), "dropout": {"fp32": [2.0, 1.0]}}}
        bad.write_text(json.dumps(good))
        probe.reset()
        assert probe.choices().counter_dropout == ("fp32",)  # the well-formed file parses
        for dropout in ({"fp32": [1.0]}, {"fp32": "12"}, "fp32", {"bf16": [1.0, "x"]}, {"fp32": [1.0, 2.0, 3.0]}):
            data = {"measurements": {**profile("amd-epyc").to_json(), "dropout": dropout}}
            bad.write_text(json.dumps(data))
            probe.reset()
            with pytest.raises(BertkitError, match="not a probe result"):
                probe.choices()
    finally:
        monkeypatch.undo()
        probe.reset()


# --- the real probe -------------------------------------------------------------------------------

def test_the_real_probe_measures_every_candidate_and_leaves_no_trace():
    """Once, at a small width: every number present and positive; the global RNG, thread count, grad
    mode and autocast untouched, also when called under inference_mode (as from inside a forward pass)."""
    state, threads = torch.get_rng_state(), torch.get_num_threads()
    with torch.inference_mode():
        measured = probe.measure(64)
        assert torch.is_inference_mode_enabled()
    assert torch.equal(torch.get_rng_state(), state) and torch.is_grad_enabled()
    assert torch.get_num_threads() == threads
    assert measured.width == 64 and measured.seconds < 30  # a second or two on idle cores
    assert min(measured.train.values()) > 0 and min(measured.linear.values()) > 0
    if onednn_works(torch.float32):
        assert measured.packed["fp32"] > 0
    assert [n for n, _, _ in measured.attention["bf16"]] == list(probe.ATTENTION_LENGTHS)
    assert all(s > 0 and b > 0 for p in ("fp32", "bf16") for _, s, b in measured.attention[p])
    assert [n for n, _, _ in measured.attention_training["bf16"]] == list(probe.ATTENTION_LENGTHS)
    assert all(s > 0 and b > 0 for p in ("fp32", "bf16") for _, s, b in measured.attention_training[p])
    assert all(s > 0 and b > 0 for p in ("fp32", "bf16") for _, s, b in measured.attention_training_dropout[p])
    assert all(ours > 0 and theirs > 0 for theirs, ours in measured.dropout.values()) and len(measured.dropout) == 2
    assert probe.Measurements.from_json(json.loads(json.dumps(measured.to_json()))) == measured
    probe.decide(measured)


def test_kernels_missing_here_are_measured_as_zero(monkeypatch):
    """A build or CPU without oneDNN's packed linear or a quantized engine: the probe still answers."""
    def missing(*args, **kwargs):
        raise RuntimeError("not on this build")
    monkeypatch.setattr(torch.ops.mkldnn, "_reorder_linear_weight", missing)
    monkeypatch.setattr(torch.ops.onednn, "qlinear_prepack", missing)
    measured = probe.measure(64)
    assert measured.packed == {"fp32": 0.0, "bf16": 0.0} and measured.int8 == 0.0
    assert min(measured.linear.values()) > 0 and not probe.decide(measured).packed_linear


def test_the_probed_int8_layer_is_quantized():
    generator = torch.Generator().manual_seed(0)
    x, weight = torch.randn(16, 64, generator=generator), torch.randn(256, 64, generator=generator)
    bias = torch.zeros(256)
    with torch.no_grad():
        fast = probe._int8_call(x, weight, bias)()
        exact = torch.nn.functional.gelu(torch.nn.functional.linear(x, weight, bias))
    assert not torch.equal(fast, exact)  # it ran the int8 kernel, not the fp32 layer
    torch.testing.assert_close(fast, exact, atol=0.1 * exact.abs().max().item(), rtol=0.0)


def test_machine_description():
    host = probe.machine()
    assert host.cores >= 1 and host.threads == torch.get_num_threads() and host.torch == torch.__version__
    line = host.line()
    assert host.cpu in line and f"torch {torch.__version__}" in line and "oneDNN" in line
