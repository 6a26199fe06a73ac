"""House rules of the source tree that keep the design readable (docs/architecture.md, "House rules"): history
and figures live in docs/, not in src/ - no "issue NN" and no dates in the package's text, whose docstrings state
contracts - and the tests mirror the packages (a test folder per package; the top level holds only cross-cutting
tests)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "src" / "bertkit"
HISTORY = re.compile(r"\b[Ii]ssues? #?\d+|\b20\d\d-\d\d-\d\d\b")
"""An issue number or an ISO date: the history of a decision, which belongs in docs/ and the commit log."""
CROSS_CUTTING = {"conftest.py", "test_config.py", "test_docs_commands.py", "test_gpu_check.py",
                 "test_import_layers.py", "test_model_directories.py", "test_study_scripts.py", "test_house_rules.py"}
"""Top-level test modules: bertkit.config (a module, not a package) and tests that span packages."""
TEST_ONLY_FOLDERS = {"assets", "adversarial", "cuda"}
"""Test folders that mirror no package: fixtures, hostile inputs across commands, the tests that need a GPU."""


def test_no_issue_numbers_or_dates_in_the_source():
    found = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
             for path in sorted(SOURCE.rglob("*.py"))
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
             if HISTORY.search(line)]
    assert not found, "history belongs in docs/ (figures, dates) and the commit log (issues):\n" + "\n".join(found)


def test_the_tests_mirror_the_packages():
    packages = {path.name for path in SOURCE.iterdir() if (path / "__init__.py").is_file()}
    folders = {path.name for path in (ROOT / "tests").iterdir() if path.is_dir() and path.name != "__pycache__"}
    assert folders - TEST_ONLY_FOLDERS <= packages, f"test folders without a package: {folders - packages}"
    loose = {path.name for path in (ROOT / "tests").glob("*.py")} - CROSS_CUTTING
    assert not loose, f"put these tests in the folder of the package they test: {sorted(loose)}"
