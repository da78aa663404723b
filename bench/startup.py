"""How long `pagoda` takes to show its window and to have its model ready, cold and warm.

Starts the real app (`python -m pagoda`, offscreen unless a display is set) on a temporary database
and reads the two times it logs ("window shown", "model ... ready", measured from when its main
module was imported), then closes it with SIGTERM as a logout would. "Cold": the first start
with an empty cache folder (the bundled GGUF's tokenizer is read into it); "warm": the starts
after. The time to import Python itself is counted by the wall clock of the bench, reported
beside. Not a test: results go to docs/BENCHMARKS.md and the README.

    .venv/bin/python bench/startup.py [--warm 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHOWN = re.compile(r"window shown ([\d.]+) s after start")
READY = re.compile(r"model .* ready ([\d.]+) s after start")
START_TIMEOUT_S = 300


def start_once(cache_dir: Path, db_path: Path) -> dict:
    env = {**os.environ, "PAGODA_CACHE_DIR": str(cache_dir),
           "PAGODA_CONFIG_DIR": str(cache_dir / "config")}
    env.setdefault("QT_QPA_PLATFORM", "offscreen")
    began = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-m", "pagoda", "--db", str(db_path)], cwd=ROOT,
                               env=env, stderr=subprocess.PIPE, text=True)
    found: dict = {}
    try:
        for line in process.stderr:
            if (m := SHOWN.search(line)) and "window_s" not in found:
                found["window_s"] = float(m.group(1))
                found["window_wall_s"] = round(time.perf_counter() - began, 2)
            if m := READY.search(line):
                found["model_s"] = float(m.group(1))
                found["model_wall_s"] = round(time.perf_counter() - began, 2)
                break
            if time.perf_counter() - began > START_TIMEOUT_S:
                break
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
    if "model_s" not in found:
        raise RuntimeError(f"the app did not report a ready model: {found}")
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warm", type=int, default=3, help="warm starts after the cold one")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cache, db = Path(tmp) / "cache", Path(tmp) / "chats.db"
        runs = [{"kind": "cold", **start_once(cache, db)}]
        runs += [{"kind": "warm", **start_once(cache, db)} for _ in range(args.warm)]
    for run in runs:
        print(f"{run['kind']}: window {run['window_wall_s']:.2f} s "
              f"({run['window_s']:.2f} s after the app's import), model ready "
              f"{run['model_wall_s']:.2f} s ({run['model_s']:.2f} s)")
    if args.json:
        args.json.write_text(json.dumps(runs, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
