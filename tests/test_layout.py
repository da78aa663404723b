"""The tree's rules, enforced: who imports whom (pyproject's import-linter contracts) and how
many modules a package root may hold before it needs rooms (docs/ARCHITECTURE.md)."""

from __future__ import annotations

import ast
import importlib
import importlib.util
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
    modules = sorted(p.name for p in (ROOT / "pagoda" / package).glob("*.py"))
    assert len(modules) <= most, f"pagoda/{package}/ holds {len(modules)} modules: {modules}"


def _our_imports(path: Path) -> list[tuple[str, list[str]]]:
    """The `from pagoda... import names` statements of a Python-syntax file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return [(node.module, [alias.name for alias in node.names])
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module
            and node.module.split(".")[0] == "pagoda"]


def test_packaging_spec_imports_what_exists():
    """make dist runs packaging/pagoda.spec, which imports our modules by name: a module moved
    without the spec would break only the packaging run, after the whole test suite."""
    imports = _our_imports(ROOT / "packaging" / "pagoda.spec")
    assert imports, "the spec imports none of our modules: this test reads the wrong file"
    for module_name, names in imports:
        module = importlib.import_module(module_name)
        missing = [name for name in names
                   if not hasattr(module, name) and not _is_submodule(f"{module_name}.{name}")]
        assert not missing, f"packaging/pagoda.spec imports {missing} from {module_name}"


def _is_submodule(name: str) -> bool:
    return importlib.util.find_spec(name) is not None
