"""The layout rules of docs/architecture.md, checked by parsing every import under src/bertkit.

Design decision: the graph is built statically with `ast` (module-level and function-level imports, each import
also importing its parent packages) and checked transitively, so a rule cannot be broken through a detour
(serve -> workflows -> train) or by a lazy import inside a function. The rules are stated over packages: what
each package may reach, and what the top level may hold.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "bertkit"

# package -> the bertkit packages it may reach, directly or through others. Read bottom-up: errors; the
# torch-free settings, config and io; kernels (torch only) and runtime (measured choices); the tokenizer and the
# data readers; the model; inference helpers, interop formats and task kinds; training (model-agnostic);
# workflows (what a command runs); serving and export (never training); the quickstart; the command line.
ALLOWED = {
    "errors": set(),
    "settings": {"errors"},
    "config": {"errors", "io"},
    "io": {"errors"},
    "kernels": {"errors"},
    "runtime": {"errors", "settings", "config", "io", "kernels"},
    "tokenizer": {"errors", "settings", "io"},
    "data": {"errors", "settings", "io", "tokenizer"},
    "model": {"errors", "settings", "config", "io", "kernels", "runtime"},
    "inference": {"errors", "settings", "config", "io", "kernels", "runtime", "model"},
    "interop": {"errors", "settings", "config", "io", "kernels", "runtime", "model", "inference", "tokenizer"},
    "tasks": {"errors", "settings", "config", "io", "kernels", "runtime", "model", "inference", "tokenizer", "data"},
    "train": {"errors", "settings", "config", "io", "runtime", "kernels"},
    "workflows": {"errors", "settings", "config", "io", "kernels", "runtime", "model", "inference", "interop",
                  "tokenizer", "data", "tasks", "train"},
    "serve": {"errors", "settings", "config", "io", "kernels", "runtime", "model", "inference", "interop",
              "tokenizer", "data", "tasks"},
    "export": {"errors", "settings", "config", "io", "kernels", "runtime", "model", "inference", "interop",
               "tokenizer", "data", "tasks"},
    "quickstart": {"errors", "settings", "config", "io", "kernels", "runtime", "model", "inference", "interop",
                   "tokenizer", "data", "tasks", "train", "workflows", "serve", "assets"},
    "cli": {"*"},
    "assets": set(),
}
TOP_LEVEL_MODULES = {"__init__.py", "__main__.py", "errors.py", "config.py"}
"""The only files at the top of src/bertkit; everything else lives in a package named for what it holds."""


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _with_parents(name: str) -> set[str]:
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(2, len(parts) + 1)}  # bertkit.x, bertkit.x.y, ...


def _imports(path: Path, package: str) -> set[str]:
    """Every module an import statement of `path` names (bertkit's and others'), with its parents."""
    imported: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(p for p in (base, node.module or "") if p)
            targets = [module] + [f"{module}.{alias.name}" for alias in node.names]
        else:
            continue
        imported |= {m for t in targets for m in (_with_parents(t) if t.startswith("bertkit.") else {t})}
    return imported


@cache
def _graph() -> dict[str, set[str]]:
    graph = {}
    for path in PACKAGE.rglob("*.py"):
        name = _module_name(path)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        graph[name] = _imports(path, package)
    return graph


def _reachable(start: str) -> set[str]:
    graph, seen, todo = _graph(), set(), [start]
    while todo:
        for target in graph.get(todo.pop(), ()):
            # the root package (bertkit/__init__: the version and the public names) is imported by every module
            if target in graph and target not in seen and target != "bertkit":
                seen.add(target)
                todo.append(target)
    return seen


def _package(module: str) -> str:
    return module.split(".")[1] if module.count(".") else ""


def test_the_graph_sees_every_module_and_known_edges():
    graph = _graph()
    assert "bertkit.model.pretrained" in graph and "bertkit.train.loop" in graph
    assert "bertkit.model.hf_names" in _reachable("bertkit.model.pretrained")
    assert "bertkit.train.loop" in _reachable("bertkit.workflows.finetune")
    assert "bertkit.runtime.device" in _reachable("bertkit.model.accelerate")


def test_the_top_level_holds_only_the_package_files_and_packages():
    loose = sorted(path.name for path in PACKAGE.glob("*.py") if path.name not in TOP_LEVEL_MODULES)
    assert not loose, f"modules at the top of src/bertkit belong in a package: {loose}"
    packages = {path.name for path in PACKAGE.iterdir() if path.is_dir() and (path / "__init__.py").is_file()}
    assert packages == set(ALLOWED) - {"errors", "config"}, "a new package needs its rule in ALLOWED"


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_dependency_directions(package):
    allowed = ALLOWED[package] | {package, ""}
    violations = []
    for module in sorted(m for m in _graph() if _package(m) == package):
        for target in sorted(_reachable(module)):
            if "*" not in allowed and _package(target) not in allowed:
                violations.append(f"{module} -> {target}")
    assert not violations, f"bertkit.{package} may reach only {sorted(ALLOWED[package])}: " + "; ".join(violations)


def test_no_source_file_is_over_600_lines():
    long = {str(path.relative_to(PACKAGE)): n for path in PACKAGE.rglob("*.py")
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > 600}
    assert not long, f"split by what they hold: {long}"
