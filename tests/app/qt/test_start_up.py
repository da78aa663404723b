"""`pagoda` shows its window before the engine is imported: torch, transformers, fastapi and
huggingface_hub (seconds on a laptop) are imported after the window is up, on the app's worker
threads, never on the GUI thread, which would freeze."""

import json
import os
import subprocess
import sys

HEAVY = ("torch", "transformers", "fastapi", "huggingface_hub")

# Runs `pagoda --db DB --model M` (pagoda.app.main.main) as a user would, noting which modules are
# loaded when the window is shown and which thread first imports each heavy one; closes the
# window once the model is ready (or failed to load). M is a 2-layer model folder: it loads by
# the bundled model's way (EngineHost's worker, torch and transformers imported there), without
# the bundled GGUF's ~25 s start-up (weights repacked, kernels timed) this test is not about.
START_AND_WATCH = """
import json, sys, threading

HEAVY = {heavy!r}
imported_on = {{}}


class WatchHeavyImports:
    def find_spec(self, name, path=None, target=None):
        if name in HEAVY and name not in imported_on:
            imported_on[name] = threading.current_thread().name
        return None


sys.meta_path.insert(0, WatchHeavyImports())

from pagoda.app import bootstrap, main

loaded_at_show, outcome = [], []
build_window = bootstrap.build_window


def build_and_watch(store, device):
    window = build_window(store, device)
    show = window.show

    def note_and_show():
        loaded_at_show.extend(name for name in HEAVY if name in sys.modules)
        show()

    window.show = note_and_show
    window.host.model_loaded.connect(lambda name: (outcome.append("ready"), window.close()))
    window.host.load_failed.connect(lambda why: (outcome.append(why), window.close()))
    return window


bootstrap.build_window = build_and_watch
code = main.main(["--db", sys.argv[1], "--model", sys.argv[2]])
print(json.dumps({{"code": code, "outcome": outcome, "loaded_at_show": loaded_at_show,
                  "imported_on": imported_on}}))
"""


def test_the_window_shows_before_the_engine_and_the_gui_thread_never_imports_it(
        tmp_path, tiny_model_folder):
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen",
           "PAGODA_CONFIG_DIR": str(tmp_path / "config")}
    done = subprocess.run([sys.executable, "-c", START_AND_WATCH.format(heavy=HEAVY),
                           str(tmp_path / "chats.db"), str(tiny_model_folder)],
                          capture_output=True, text=True, check=False, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["code"] == 0 and report["outcome"] == ["ready"], done.stderr
    assert report["loaded_at_show"] == []
    assert "torch" in report["imported_on"]  # the model did load, after the window showed
    assert "MainThread" not in report["imported_on"].values(), report["imported_on"]
