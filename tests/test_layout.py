"""The tree's rules, enforced: who imports whom (pyproject's import-linter contracts) and how
many modules a package root may hold before it needs rooms (docs/ARCHITECTURE.md)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_import_contracts_hold():
    """lint-imports checks every contract of pyproject.toml's [tool.importlinter]: no circle in
    any package, no Qt below the window, the engine's layers, core without tensors."""
    command = "from importlinter.cli import lint_imports_command; lint_imports_command()"
    result = subprocess.run([sys.executable, "-c", command, "--no-cache"],
                            check=False, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(("package", "most"), [("engine", 10), ("app", 6)])
def test_package_roots_stay_small(package, most):
    modules = sorted(p.name for p in (ROOT / package).glob("*.py"))
    assert len(modules) <= most, f"{package}/ holds {len(modules)} modules: {modules}"
