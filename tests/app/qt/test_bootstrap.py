"""Both entry points, `pagoda` (pagoda.app.main) and `pagoda --selftest` (pagoda.app.selftest), start the app
through pagoda.app.bootstrap, and neither imports the other."""

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pagoda.app import bootstrap
from pagoda.app.store import ConversationStore

APP_DIR = Path(bootstrap.__file__).parent

LOADED_AFTER_IMPORT = """
import sys
import {module}
print(" ".join(sorted(name for name in sys.modules if name.startswith("pagoda.app."))))
"""

RUN_ON_THE_LOOP = """
import asyncio
from pagoda.app import bootstrap

bootstrap.style_app = lambda app, theme: None
app = bootstrap.create_app("system")
loop = bootstrap.install_event_loop(app)

async def answer():
    await asyncio.sleep(0)
    return 42

print(app.applicationName(), app.desktopFileName(), asyncio.get_event_loop() is loop,
      bootstrap.run_until_done(loop, answer()), loop.is_closed())
"""


def _python(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, check=False,
                          timeout=timeout, env={**os.environ, "QT_QPA_PLATFORM": "offscreen"})


def _modules_imported_by(path: Path) -> set[str]:
    """Every module the file imports, at its top or inside a function."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


@pytest.mark.parametrize(("module", "other"), [("pagoda.app.selftest", "pagoda.app.main"),
                                                ("pagoda.app.main", "pagoda.app.selftest")])
def test_importing_one_entry_point_does_not_import_the_other(module, other):
    done = _python("-c", LOADED_AFTER_IMPORT.format(module=module))
    assert done.returncode == 0, done.stderr
    loaded = done.stdout.split()
    assert module in loaded and other not in loaded


def test_neither_the_self_test_nor_the_bootstrap_imports_the_main_entry_point_anywhere():
    assert "pagoda.app.main" not in _modules_imported_by(APP_DIR / "selftest.py")
    assert not {"pagoda.app.main", "pagoda.app.selftest"} & _modules_imported_by(APP_DIR / "bootstrap.py")
    assert "pagoda.app.bootstrap" in _modules_imported_by(APP_DIR / "main.py")
    assert "pagoda.app.bootstrap" in _modules_imported_by(APP_DIR / "selftest.py")


def test_the_app_is_named_pagoda_and_the_loop_runs_a_coroutine_to_its_result_then_closes():
    done = _python("-c", RUN_ON_THE_LOOP)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["Pagoda", "pagoda", "True", "42", "True"]


def test_the_existing_application_is_reused_and_styled_with_the_chosen_theme(qapp, monkeypatch):
    styled = []
    monkeypatch.setattr(bootstrap, "style_app", lambda app, theme: styled.append((app, theme)))
    name, desktop_name = qapp.applicationName(), qapp.desktopFileName()
    try:
        assert bootstrap.create_app("dark") is qapp
        assert styled == [(qapp, "dark")]
    finally:
        qapp.setApplicationName(name)
        qapp.setDesktopFileName(desktop_name)


def test_the_window_opens_over_the_store_and_says_what_was_recovered(qloop, tmp_path):
    store = ConversationStore.open(tmp_path / "chats.db")
    store.recovered_from = tmp_path / "chats.db.broken"
    window = bootstrap.build_window(store, "cuda")
    try:
        assert window.recovered_from == tmp_path / "chats.db.broken"
        assert window.host.device == "cuda"
    finally:
        window.close()
        window.db.close()


def test_the_self_test_starts_the_window_and_names_the_failed_step(tmp_path):
    done = _python("-m", "pagoda", "--selftest", "--model", str(tmp_path / "missing.gguf"),
                   timeout=300)
    assert done.returncode == 1, done.stderr
    assert "FAILED: SelftestError: the model did not load" in done.stderr
    assert "Traceback" not in done.stderr
