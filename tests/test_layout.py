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
    assert _too_many_modules(ROOT / "pagoda" / package, most) == []


# A room of the app holds at most this many modules (its __init__ counted) before it needs rooms
# of its own (docs/ARCHITECTURE.md).
MOST_MODULES_IN_AN_APP_ROOM = 12


def _app_packages() -> list[Path]:
    return sorted(init.parent for init in (ROOT / "pagoda" / "app").rglob("__init__.py"))


def _too_many_modules(package: Path, most: int) -> list[str]:
    """The package, named with its modules, when it holds more than `most`; else nothing."""
    modules = sorted(path.name for path in package.glob("*.py"))
    if len(modules) <= most:
        return []
    name = package.relative_to(ROOT) if package.is_relative_to(ROOT) else package
    return [f"{name}/ holds {len(modules)} modules: {modules}"]


def test_every_room_of_the_app_stays_small():
    packages = _app_packages()
    assert ROOT / "pagoda" / "app" / "components" / "chat" in packages, "found no app package"
    crowded = [line for package in packages if package != ROOT / "pagoda" / "app"
               for line in _too_many_modules(package, MOST_MODULES_IN_AN_APP_ROOM)]
    assert crowded == []


def test_a_room_past_its_limit_is_named(tmp_path):
    for index in range(MOST_MODULES_IN_AN_APP_ROOM):
        (tmp_path / f"module_{index}.py").write_text("")
    assert _too_many_modules(tmp_path, MOST_MODULES_IN_AN_APP_ROOM) == []
    (tmp_path / "one_more.py").write_text("")
    assert _too_many_modules(tmp_path, MOST_MODULES_IN_AN_APP_ROOM) != []


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
