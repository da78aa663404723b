"""`pagoda serve …` is the engine's serve command, so an installed Pagoda can serve without its
window; it builds nothing of Qt."""

import subprocess
import sys

import pagoda.app.main

HELP_PROBE = """
import sys
from pagoda.app.main import main
try:
    main(["serve", "--help"])
except SystemExit as exit:
    print("exit", exit.code, "qt" if "PySide6" in sys.modules else "no-qt")
"""


def test_pagoda_serve_hands_its_arguments_to_the_engines_serve_command(monkeypatch):
    calls = []
    monkeypatch.setattr("pagoda.engine.cli.main.main", lambda argv: calls.append(argv) or 7)
    assert pagoda.app.main.main(["serve", "--port", "9001", "--api-key", "k"]) == 7
    assert calls == [["serve", "--port", "9001", "--api-key", "k"]]


def test_pagoda_serve_help_lists_the_server_options_without_loading_qt():
    done = subprocess.run([sys.executable, "-c", HELP_PROBE], capture_output=True, text=True,
                          check=False, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "--port" in done.stdout and "--api-key" in done.stdout
    assert "--header-timeout" in done.stdout and "--max-connections" in done.stdout
    assert done.stdout.strip().endswith("exit 0 no-qt")
