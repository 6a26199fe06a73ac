"""Part 1, the environment: which modules import (and their versions), the device, driver, torch and
CUDA versions, bf16 support, the commit.

Design decision: what is required is read from pyproject.toml, not kept here: every dependency of the project
(a missing one fails this part: bertkit itself needs it, and tests of the modules that import it could not
run) and the dev packages the check runs (pytest, transformers); every other extra is optional. Each module
is imported on its own with its error kept, so one broken package is named plainly; the parts that need a
missing module are skipped by the runner (`run.py`), the others still run.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import platform
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

PYPROJECT = ROOT / "pyproject.toml"
CHECK_NEEDS = ("pytest", "transformers")
"""Dev dependencies the check itself needs (the CUDA tests; the parity and ladder comparisons)."""
MODULE_NAMES = {"scikit-learn": "sklearn", "pytest-timeout": "pytest_timeout", "pyyaml": "yaml",
                "sentence-transformers": "sentence_transformers", "fastapi-offline": "fastapi_offline",
                "prometheus-client": "prometheus_client", "langchain-openai": "langchain_openai",
                "tensorflow-cpu": "tensorflow"}
"""Distribution names whose import name is not the name with '-' turned into '_'."""


def requirement_name(requirement: str) -> str:
    """'torch==2.13.0' / 'triton==3.6.0; platform_machine == "x86_64"' -> 'torch' / 'triton'."""
    return re.split(r"[\s;\[<>=!~]", requirement.strip(), maxsplit=1)[0].lower()


def module_name(distribution: str) -> str:
    return MODULE_NAMES.get(distribution, distribution.replace("-", "_"))


def declared_modules(pyproject: Path = PYPROJECT) -> tuple[dict[str, str], dict[str, str]]:
    """({module: why required}, {module: why optional}) from pyproject.toml: the project's dependencies and the
    check's own dev needs are required; every other extra is optional (the tests that need one skip)."""
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    required = {module_name(requirement_name(r)): "a dependency of bertkit (pyproject.toml)"
                for r in project["dependencies"]}
    optional: dict[str, str] = {}
    for extra, requirements in project.get("optional-dependencies", {}).items():
        for requirement in requirements:
            name = module_name(requirement_name(requirement))
            if name in CHECK_NEEDS:
                required.setdefault(name, f"the GPU check (the [{extra}] extra)")
            elif name not in required:
                optional.setdefault(name, f"the [{extra}] extra")
    return required, optional


REQUIRED, OPTIONAL = declared_modules()
DISTRIBUTIONS = {module: distribution for distribution, module in MODULE_NAMES.items()}


def module_version(name: str) -> tuple[str | None, str | None]:
    """(version or "?", None) when `name` imports, else (None, the error in one line)."""
    try:
        module = importlib.import_module(name)
    except Exception as exc:  # noqa: BLE001 - any import failure is what this reports
        return None, f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
    try:
        return importlib.metadata.version(DISTRIBUTIONS.get(name, name)), None
    except importlib.metadata.PackageNotFoundError:
        return str(getattr(module, "__version__", "?")), None


def installed_version(name: str) -> str | None:
    """The installed version of an optional module, without importing it (some take seconds)."""
    if importlib.util.find_spec(name) is None:
        return None
    try:
        return importlib.metadata.version(DISTRIBUTIONS.get(name, name))
    except importlib.metadata.PackageNotFoundError:
        return "?"


def check_modules() -> dict[str, Any]:
    """Required modules are imported (a broken install shows here), optional ones only looked up."""
    modules, errors = {}, {}
    for name in REQUIRED:
        modules[name], error = module_version(name)
        if error:
            errors[name] = error
    for name in OPTIONAL:
        modules[name] = installed_version(name)
    return {"modules": modules, "import_errors": errors,
            "missing_required": [name for name in REQUIRED if modules[name] is None],
            "missing_optional": [name for name in OPTIONAL if modules[name] is None]}


def nvidia_smi() -> dict[str, str] | None:
    """name, driver and memory of GPU 0 from nvidia-smi, or None without it."""
    if shutil.which("nvidia-smi") is None:
        return None
    fields = ["name", "driver_version", "memory.total", "clocks.max.sm", "power.limit"]
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        return {"error": str(exc)[:300]}
    values = [v.strip() for v in out.splitlines()[0].split(",")] if out.strip() else []
    return dict(zip(fields, values))


def device_info() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {"torch": torch.__version__, "torch_cuda": torch.version.cuda,
                            "cuda_available": torch.cuda.is_available(), "cpu_threads": torch.get_num_threads()}
    if not info["cuda_available"]:
        return info
    props = torch.cuda.get_device_properties(0)
    info.update(device_count=torch.cuda.device_count(), name=props.name,
                capability=f"{props.major}.{props.minor}", memory_gib=round(props.total_memory / 2**30, 1),
                multiprocessors=props.multi_processor_count, bf16=torch.cuda.is_bf16_supported(),
                cudnn=torch.backends.cudnn.version(), nccl=".".join(map(str, torch.cuda.nccl.version())))
    smi = nvidia_smi()
    if smi:
        info["driver"] = smi.get("driver_version")
        info["nvidia_smi"] = smi
    return info


def git_commit() -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    return done.stdout.strip() or None


def run(options: dict[str, Any]) -> tuple[str, dict[str, Any], str | None]:
    details: dict[str, Any] = {"python": sys.version.split()[0], "executable": sys.executable,
                               "platform": platform.platform(), "cpus": os.cpu_count(), "commit": git_commit()}
    details.update(check_modules())
    missing = details["missing_required"]
    if missing:
        print("MISSING required modules: " + ", ".join(f"{m} ({details['import_errors'][m]})" for m in missing))
    if details["missing_optional"]:
        print("missing optional modules (their tests skip): " + ", ".join(details["missing_optional"]))
    if details["modules"]["torch"] is None:
        return "failed", details, "torch does not import: " + details["import_errors"]["torch"]
    details["device"] = device_info()
    print(f"device: {details['device'].get('name', 'no CUDA device')}; torch {details['device']['torch']}, "
          f"CUDA {details['device']['torch_cuda']}, driver {details['device'].get('driver')}")
    if missing:
        return "failed", details, "missing required modules: " + ", ".join(missing)
    if not details["device"]["cuda_available"] and not options["dry_run"]:
        return "failed", details, "torch.cuda.is_available() is False: no GPU for the CUDA parts"
    return "passed", details, None
