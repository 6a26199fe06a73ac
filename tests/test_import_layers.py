"""The dependency directions of ../shared/DESIGN.md, checked by parsing every import under src/bertkit.

Design decision: the graph is built statically with `ast` (module-level and function-level imports,
each import also importing its parent packages) and checked transitively, so a rule cannot be broken
through a detour (serve -> tasks -> train) or by a lazy import inside a function.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "bertkit"

# layer (bertkit.<layer>) -> layers it must never reach, directly or through others.
FORBIDDEN = {
    "errors": {"*"},
    "atomic": {"*"},
    "hardware": {"*"},
    "runtime": {"*"},
    "step_probe": {"*"},
    "config": {"*"},
    "settings": {"*"},
    "textlines": {"*"},
    "columnar": {"*"},
    "int8": {"*"},
    "allocator": {"*"},
    "tokenizer": {"data", "model", "tasks", "train", "serve", "interop", "cli"},
    "model": {"data", "train", "tasks", "serve", "cli", "interop", "inference"},
    "inference": {"data", "train", "tasks", "serve", "cli", "interop"},
    "train": {"config", "tokenizer", "model", "interop", "data", "tasks", "serve", "cli"},
    "data": {"model", "train", "tasks", "serve", "cli"},
    "serve": {"train", "cli"},
}
# hardware: the measured precision/kernel choices; runtime: device, precision and seeding helpers;
# step_probe: --precision auto checked on the model's own step (it finds the encoder by its shape);
# settings: the run settings and their choices (torch-free); columnar: Parquet/Arrow tables (pyarrow only)
# int8: oneDNN's int8 kernel (torch only); allocator: glibc's malloc thresholds (no torch)
ALLOWED_ANYWHERE = {"errors", "atomic", "hardware", "runtime", "step_probe", "settings", "columnar", "int8",
                    "allocator"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _with_parents(name: str) -> set[str]:
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(2, len(parts) + 1)}  # bertkit.x, bertkit.x.y, ...


@cache
def _graph() -> dict[str, set[str]]:
    graph = {}
    for path in PACKAGE.rglob("*.py"):
        name = _module_name(path)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
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
            imported |= {m for t in targets if t.startswith("bertkit.") for m in _with_parents(t)}
        graph[name] = imported
    return graph


def _reachable(start: str) -> set[str]:
    graph, seen, todo = _graph(), set(), [start]
    while todo:
        for target in graph.get(todo.pop(), ()):
            if target in graph and target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def _layer(module: str) -> str:
    return module.split(".")[1] if module.count(".") else ""


def test_the_graph_sees_every_module_and_known_edges():
    graph = _graph()
    assert "bertkit.model.pretrained" in graph and "bertkit.train.loop" in graph
    assert "bertkit.model.hf_names" in _reachable("bertkit.model.pretrained")
    assert "bertkit.train.loop" in _reachable("bertkit.tasks.finetune")
    assert "bertkit.runtime" in _reachable("bertkit.model.accelerate")


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_dependency_directions(layer):
    banned = FORBIDDEN[layer]
    violations = []
    for module in sorted(m for m in _graph() if _layer(m) == layer):
        for target in sorted(_reachable(module)):
            target_layer = _layer(target)
            if target_layer in (layer, "") or target_layer in ALLOWED_ANYWHERE - {layer}:
                continue
            if "*" in banned or target_layer in banned:
                violations.append(f"{module} -> {target}")
    assert not violations, f"bertkit.{layer} must not depend on: " + "; ".join(violations)


def test_config_does_not_import_torch():
    tree = ast.parse((PACKAGE / "config.py").read_text(encoding="utf-8"))
    roots = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
             for alias in node.names}
    roots |= {node.module.split(".")[0] for node in ast.walk(tree)
              if isinstance(node, ast.ImportFrom) and node.module}
    assert "torch" not in roots
