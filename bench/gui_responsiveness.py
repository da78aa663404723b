"""How long the GUI's event loop stalls while three tabs stream at once (target: < 50 ms).

Runs the real window (offscreen unless a display is set) on a temporary database with the default
model. A 5 ms QTimer records the gap between its ticks; a gap far over 5 ms is a stall the user
would feel as a frozen window. Not a test: results go to docs/BENCHMARKS.md.

    .venv/bin/python bench/gui_responsiveness.py [--tabs 3] [--max-tokens 128] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROMPTS = ["Write a short story about a lighthouse keeper.",
           "Explain how a bicycle works, step by step.",
           "用中文介绍一下长城。",
           "List ten ideas for a birthday party.",
           "Describe the water cycle for a child."]
TICK_MS = 5


class StallMeter:
    """Records the gaps between ticks of a fast timer on the GUI thread."""

    def __init__(self) -> None:
        from PySide6.QtCore import QTimer

        self.gaps_ms: list[float] = []
        self._last = time.perf_counter()
        self._timer = QTimer(interval=TICK_MS, timeout=self._tick)

    def start(self) -> None:
        self._last = time.perf_counter()
        self._timer.start()

    def stop(self) -> None:
        self._timer.stop()

    def _tick(self) -> None:
        now = time.perf_counter()
        self.gaps_ms.append((now - self._last) * 1000)
        self._last = now


async def measure(window, tabs: int, max_tokens: int) -> dict:
    from app.store import SamplingSettings

    await window.restore()
    while not window.host.is_ready:
        await asyncio.sleep(0.05)
    settings = SamplingSettings(temperature=0.7, max_tokens=max_tokens, seed=1)
    opened = []
    for i in range(tabs):
        conversation = await window.db.create_conversation(sampling=settings)
        opened.append(await window.open_conversation(conversation.id))
        opened[-1].composer.set_text(PROMPTS[i % len(PROMPTS)])
    meter = StallMeter()
    meter.start()
    start = time.perf_counter()
    for tab in opened:
        tab.composer.send_requested.emit(tab.composer.text())
        tab.composer.set_text("")
    controllers = [window.controllers[t.conversation_id] for t in opened]
    await asyncio.sleep(0.5)
    while any(c.is_streaming for c in controllers):
        await asyncio.sleep(0.05)
    elapsed = time.perf_counter() - start
    meter.stop()
    tokens = sum(c.path[-1].completion_tokens or 0 for c in controllers)
    gaps = sorted(meter.gaps_ms)
    return {"tabs": tabs, "max_tokens": max_tokens, "seconds": round(elapsed, 2),
            "output_tokens": tokens, "tokens_per_s": round(tokens / elapsed, 1),
            "ticks": len(gaps), "max_stall_ms": round(gaps[-1], 1),
            "p99_stall_ms": round(gaps[int(len(gaps) * 0.99) - 1], 1),
            "median_tick_ms": round(statistics.median(gaps), 1),
            "stalls_over_50ms": sum(g > 50 for g in gaps)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tabs", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    import qasync
    from PySide6.QtWidgets import QApplication

    from app.async_store import AsyncStore
    from app.engine_host import EngineHost
    from app.main_window import MainWindow
    from app.store import ConversationStore

    app = QApplication(sys.argv[:1])
    loop = qasync.QEventLoop(app)
    asyncio.set_event_loop(loop)
    with tempfile.TemporaryDirectory() as tmp:
        window = MainWindow(AsyncStore(ConversationStore.open(Path(tmp) / "bench.db")),
                            EngineHost())
        window.show()
        window.host.load(None)
        with loop:
            result = loop.run_until_complete(measure(window, args.tabs, args.max_tokens))
            window.close()
            window.db.close()
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
