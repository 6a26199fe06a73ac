"""scripts/gpu_check.sh cannot rot without a GPU: its dry run (the same code paths on CPU, tiny model) writes
results.json and results.md of the documented shape with every required part passed; a hanging or crashing
part is killed and recorded while the check goes on; pytest's results are read back (an optional package
missing at collection is a skip, not a failure); the markdown of a GPU run renders the throughput table."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from gpu_check import cuda_tests, environment, report, run, throughput  # noqa: E402 - scripts/ is not a package root
from gpu_check import ladder as ladder_module  # noqa: E402

PART_KEYS = {"title", "optional", "status", "seconds", "timeout_s", "error", "details"}


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory) -> tuple[Path, float, str]:
    out = tmp_path_factory.mktemp("gpu_check_out")
    started = time.monotonic()
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--dry-run"], cwd=ROOT, timeout=240,
                          capture_output=True, text=True, env={**os.environ, "GPU_CHECK_OUT": str(out)})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out, time.monotonic() - started, done.stdout


def test_dry_run_writes_results_json(dry_run):
    out, seconds, stdout = dry_run
    results = json.loads((out / "results.json").read_text())
    assert results["schema"] == 1 and results["dry_run"] is True and results["ok"] is True and results["complete"]
    assert results["total_s"] <= results["budget_s"] and seconds < 240
    assert list(results["parts"]) == [part.name for part in run.PARTS]
    for name, part in results["parts"].items():  # a dry run runs every part, the optional ones too
        assert set(part) >= PART_KEYS, name
        assert part["status"] == "passed", (name, part["error"])
    environment = results["environment"]
    assert environment["missing_required"] == [] and environment["modules"]["torch"]
    assert {"zstandard", "pysbd", "pytest", "transformers"} <= set(environment["modules"])
    assert environment["device"]["cuda_available"] is False
    tests = results["parts"]["cuda_tests"]["details"]
    assert tests["counts"]["skipped"] >= 40 and tests["counts"]["failed"] == tests["counts"]["error"] == 0
    packages = {t["name"].split("::")[0].rsplit(".", 1)[0] for t in tests["tests"]}  # tests.cuda.test_x -> tests.cuda
    assert {"tests.cuda", "tests.model", "tests.train"} <= packages  # wherever a module marks a test cuda
    group = results["parts"]["process_group"]["details"]
    assert group["group_joined"] and group["backend"] == "gloo" and group["context"]["distributed"]
    assert group["steps"] == 5 and len(group["evaluations"]) == 2 and group["torn_down"]
    assert all(math.isfinite(e["mlm_context_gain"]) for e in group["evaluations"])  # its sums are all-reduced
    assert set(group["checkpoints"].values()) == {"valid"}
    assert group["second_training"]["steps"] == 5 and "compiled objective" in group["second_training"]["step"]
    assert (out / "junit.xml").is_file() and (out / "gpu_check.log").is_file()
    assert "environment: passed" in stdout and "ladder: passed" in stdout


def test_dry_run_ladder_runs_every_lever_then_numerics_profile_and_batch(dry_run):
    results = json.loads((dry_run[0] / "results.json").read_text())
    ladder = results["parts"]["ladder"]["details"]
    ran = set(ladder["results"])
    assert ran == {v.name for v in ladder_module.LADDER if not v.cuda_graphs}  # CUDA graphs: a GPU's
    graphs = next(v.name for v in ladder_module.LADDER if v.cuda_graphs)
    assert "skipped" in ladder["errors"][graphs]
    for name, result in ladder["results"].items():
        assert result["tokens_per_s"] > 0 and result["mfu"] > 0 and result["ms_per_step"] > 0, name
    assert ladder["best"]["name"] in ran and ladder["best_vs_transformers"] > 0
    assert ladder["numerics"]["agree"] and ladder["numerics"]["steps"] == ladder_module.DRY_TIMING["numerics_steps"]
    assert ladder["profile"]["top_kernels"] and ladder["largest_batch"]["largest"] >= ladder["batch"]
    assert "6 x N" in ladder["flop_rule"]
    phase2 = results["parts"]["phase2"]["details"]
    assert len(phase2["results"]) == 2 and 0 < phase2["phase2_data"]["fill"] < 1  # real padding, unpadded
    assert results["parts"]["large"]["details"]["results"]


def test_dry_run_writes_results_md(dry_run):
    text = (dry_run[0] / "results.md").read_text()
    assert text.startswith("# GPU check: CPU (dry run)") and "Overall: **ok**" in text
    for heading in ("## Environment", "## CUDA tests (pytest -m cuda)", "## One-rank process group through fit",
                    "## Lever ladder, bert-base 128 tokens", "## bert-base 512 tokens", "## bert-large 128 tokens"):
        assert heading in text
    assert "| transformers |" in text and "| whole step compiled + all kernels |" in text
    assert "Numerics:" in text and "**agree**" in text and "Profile of" in text


def test_required_modules_are_the_projects_dependencies():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {environment.module_name(environment.requirement_name(r)) for r in project["dependencies"]}
    assert declared <= set(environment.REQUIRED) and {"zstandard", "pysbd"} <= declared
    assert {"pytest", "transformers"} <= set(environment.REQUIRED)
    assert "fastapi" in environment.OPTIONAL and not set(environment.OPTIONAL) & set(environment.REQUIRED)
    assert environment.requirement_name('triton==3.6.0; platform_machine == "x86_64"') == "triton"


def test_cuda_test_modules_are_found_by_reading_them():
    modules = cuda_tests.cuda_test_modules()
    assert "tests/cuda/test_varlen_flash.py" in modules and "tests/model/test_attention.py" in modules
    assert not any(m.startswith("tests/serve/") for m in modules)  # never imported by the check
    command = cuda_tests.command("main", dry_run=False, junit=Path("j.xml"))
    assert cuda_tests.COMPILE_TEST not in command and "tests/" not in command


def _fake_parts(tmp_path: Path, monkeypatch) -> None:
    """A package of parts that hang, crash and pass, importable by the runner's children."""
    package = tmp_path / "fakeparts"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "hang.py").write_text("import time\ndef run(options):\n    print('hanging', flush=True)\n"
                                     "    time.sleep(60)\n")
    (package / "crash.py").write_text("import os\ndef run(options):\n    print('crashing', flush=True)\n"
                                      "    os._exit(3)\n")
    (package / "fine.py").write_text("def run(options):\n    return 'passed', {'dry': options['dry_run']}, None\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))


def test_a_hanging_or_crashing_part_is_recorded_and_the_check_goes_on(tmp_path, monkeypatch):
    _fake_parts(tmp_path, monkeypatch)
    runner = run.Runner(tmp_path / "out", dry_run=True, budget_s=60, selected=None)
    runner.results["environment"] = {"missing_required": []}
    (tmp_path / "out").mkdir()
    with open(tmp_path / "out" / run.LOG, "w") as log:
        started = time.monotonic()
        hung = runner.run_part(run.Part("hang", "hangs", "fakeparts.hang", 600, (), dry_timeout_s=3), tmp_path, log)
        assert time.monotonic() - started < 20
        crashed = runner.run_part(run.Part("crash", "crashes", "fakeparts.crash", 600, ()), tmp_path, log)
        fine = runner.run_part(run.Part("fine", "passes", "fakeparts.fine", 600, ()), tmp_path, log)
    assert hung["status"] == "timeout" and "hanging" in hung["error"]
    assert crashed["status"] == "failed" and crashed["returncode"] == 3 and "crashing" in crashed["error"]
    assert fine["status"] == "passed" and fine["details"] == {"dry": True}


def test_parts_fit_the_budget_and_missing_modules_skip_parts(tmp_path):
    assert all(p.timeout_s <= run.GPU_BUDGET_S for p in run.PARTS) and run.GPU_BUDGET_S <= 570  # one device call
    runner = run.Runner(tmp_path, dry_run=False, budget_s=450, selected=None)
    runner.results["environment"] = {"missing_required": ["transformers"], "device": {"cuda_available": True}}
    by_name = {p.name: p for p in run.PARTS}
    assert "transformers" in runner.skip_reason(by_name["ladder"])
    assert runner.skip_reason(by_name["process_group"]) is None
    runner.results["environment"] = {"missing_required": [], "device": {"cuda_available": False}}
    assert "no CUDA device" in runner.skip_reason(by_name["cuda_tests"])


def test_the_fastest_ladder_variant_is_handed_on(tmp_path):
    runner = run.Runner(tmp_path, dry_run=False, budget_s=450, selected=None)
    by_name = {p.name: p for p in run.PARTS}
    assert runner.handed_on(by_name["large"]) == {}
    runner.given_levers = {"static": True, "compile": True, "norm": False}
    assert runner.handed_on(by_name["phase2"])["best_levers"] == runner.given_levers
    levers = {"static": True, "compile": True, "cuda_graphs": True, "norm": True, "gelu": True, "loss": True}
    runner.results["parts"]["ladder"] = {"details": {"batch": 256, "best": {"name": "+ CUDA graphs", "levers": levers}}}
    assert runner.handed_on(by_name["large"]) == {"best_levers": levers, "best_name": "+ CUDA graphs"}
    assert runner.handed_on(by_name["throughput_tf32"]) == {"max_batch": 256}


JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" errors="2" failures="1"
 skipped="1" tests="5"><testcase classname="" name="tests.serve.test_server_limits" time="0.000"><error
 message="collection failure">ImportError while importing test module
E   ModuleNotFoundError: No module named 'fastapi'</error></testcase><testcase classname="" name="tests.model.broken"
 time="0.000"><error message="collection failure">E   ModuleNotFoundError: No module named 'nothere'</error>
</testcase><testcase classname="tests.cuda.test_a" name="test_ok" time="0.5"/><testcase classname="tests.cuda.test_a"
 name="test_bad[x]" time="0.1"><failure message="AssertionError: 1 != 2">long report</failure></testcase>
<testcase classname="tests.cuda.test_a" name="test_skip" time="0.0"><skipped message="needs a CUDA device"
 type="pytest.skip"/></testcase></testsuite></testsuites>"""


def test_junit_results_are_read_back_and_a_module_that_fails_to_import_fails(tmp_path):
    (tmp_path / "junit.xml").write_text(JUNIT)
    tests = {t["name"]: t for t in cuda_tests.read_junit(tmp_path / "junit.xml")}
    for name, missing in (("tests.serve.test_server_limits", "fastapi"), ("tests.model.broken", "nothere")):
        assert tests[name]["outcome"] == "error", name  # its tests never ran: never a skip
        assert "failed to import" in tests[name]["message"] and missing in tests[name]["message"]
    assert tests["tests.cuda.test_a::test_ok"] == {"name": "tests.cuda.test_a::test_ok", "outcome": "passed",
                                                   "seconds": 0.5, "message": None}
    assert tests["tests.cuda.test_a::test_bad[x]"]["outcome"] == "failed"
    assert "1 != 2" in tests["tests.cuda.test_a::test_bad[x]"]["message"]
    assert tests["tests.cuda.test_a::test_skip"]["outcome"] == "skipped"


def test_verbose_output_is_the_fallback_and_names_the_test_that_hung():
    text = ("tests/cuda/test_a.py::test_one[p-1] PASSED  [ 10%]\n"
            "tests/cuda/test_a.py::test_two FAILED  [ 20%]\n"
            "tests/cuda/test_b.py::test_hangs \n")
    tests = cuda_tests.read_verbose(text)
    assert [(t["name"], t["outcome"]) for t in tests] == [
        ("tests/cuda/test_a.py::test_one[p-1]", "passed"), ("tests/cuda/test_a.py::test_two", "failed"),
        ("tests/cuda/test_b.py::test_hangs", "running")]


def test_peaks_and_phase_one_rows():
    import torch

    assert throughput.datasheet_peak("NVIDIA H100 80GB HBM3", "bf16") == 989.0
    assert throughput.datasheet_peak("NVIDIA H200", "bf16") == 989.0
    assert throughput.datasheet_peak("NVIDIA H100 PCIe", "bf16") == 756.0
    assert throughput.datasheet_peak("NVIDIA H100 80GB HBM3", "tf32") == 494.5
    assert throughput.datasheet_peak("NVIDIA GeForce RTX 4090", "bf16") is None
    rows = throughput.full_rows(3, 128, 30522, torch.Generator().manual_seed(0), "cpu")
    masked = rows["mlm_labels"] != -100
    assert masked.sum(1).tolist() == [19, 19, 19] and rows["attention_mask"].all()
    assert (rows["input_ids"][masked] == throughput.MASK).all()
    assert not masked[:, [0, 64, 127]].any()  # never [CLS] or [SEP]
    assert (rows["input_ids"][:, 0] == throughput.CLS).all()


def test_markdown_of_a_gpu_run():
    result = {"bertkit": {"ms_per_step": 90.0, "tokens_per_s": 700000.0, "model_tflops": 420.0, "mfu": 0.42,
                          "mfu_vs_measured_matmul": 0.53, "peak_memory_gib": 30.1, "round_seconds": [0.7]},
              "transformers": {"ms_per_step": 150.0, "tokens_per_s": 420000.0, "model_tflops": 250.0, "mfu": 0.25,
                               "mfu_vs_measured_matmul": 0.32, "peak_memory_gib": 60.2, "round_seconds": [1.2]}}
    details = {"model": "bert-base", "precision": "bf16", "seq_length": 128, "device_name": "NVIDIA H100 80GB HBM3",
               "torch": "2.11.0+cu130", "transformers": "5.17.0", "transformers_attention": "sdpa", "batch": 512,
               "search": [{"batch": 512, "result": "fits"}], "rounds": 3, "steps_per_round": 8, "results": result,
               "ratio": 700000 / 420000, "peak_tflops": 989.0, "peak_source": "datasheet dense bf16",
               "measured_matmul_tflops": 790.0, "model_tflop_per_step": 37.8, "tokens_per_step": 65536,
               "masked_per_step": 9728, "flop_rule": throughput.FLOP_RULE, "transformers_uncounted_head_fraction": 0.2}
    results = {"dry_run": False, "started_utc": "now", "total_s": 300.0, "budget_s": 450.0, "complete": True,
               "ok": False, "environment": {"device": {"name": "NVIDIA H100 80GB HBM3", "cuda_available": True}},
               "parts": {"throughput": {"title": "Throughput", "optional": False, "status": "passed",
                                        "seconds": 60.0, "error": None, "details": details},
                         "process_group": {"title": "Group", "optional": False, "status": "failed", "seconds": 9.0,
                                           "error": "RuntimeError: No backend type associated with device type cpu",
                                           "details": {"group_joined": True, "backend": "nccl"}}}}
    text = report.markdown(results, run.PARTS)
    assert text.startswith("# GPU check: NVIDIA H100 80GB HBM3") and "Overall: **NOT ok**" in text
    assert "| bertkit | 90.0 | 700,000 | 420 | 42.0% | 53.0% | 30.1 |" in text
    assert "**1.67x**" in text and "989 TFLOP/s (datasheet dense bf16)" in text
    assert "## Errors" in text and "No backend type associated with device type cpu" in text
    assert "| CUDA tests (pytest -m cuda) | not run yet | | |" in text
