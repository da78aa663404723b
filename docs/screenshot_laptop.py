"""Take docs/screenshot-1366x768.png: the whole screen of a 1366 x 768 laptop, with the window as
it first opens there (a share of the screen, Settings docked), framed by a window manager, after
one question to the bundled model; the message box, Send and the status bar are on screen.

Run under a real X server of that size, with openbox framing the window:
`xvfb-run -a -s "-screen 0 1366x768x24" sh -c 'openbox & .venv/bin/python
docs/screenshot_laptop.py'`.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "docs"))
os.environ.setdefault("QT_QPA_PLATFORM", "xcb")

from screenshot import ask_in_a_new_chat, ready_window, start_app

QUESTION = "In two sentences: why do lighthouses flash instead of shining steadily?"
SETTLE_S = 1.0  # for the window manager to frame the window and Qt to lay it out


async def converse(window) -> None:
    from pagoda.app.store import SamplingSettings

    await ready_window(window)
    await ask_in_a_new_chat(window, "Lighthouses",
                            SamplingSettings(temperature=0.3, max_tokens=120, seed=7), QUESTION)
    await asyncio.sleep(SETTLE_S)


def main() -> int:
    from pagoda.app.components.shared.async_store import AsyncStore
    from pagoda.app.components.shared.connections import ConnectionKeys
    from pagoda.app.qt.main_window import MainWindow
    from pagoda.app.qt.models.engine_host import EngineHost
    from pagoda.app.qt.window_layout import LAYOUT_FILE, WindowLayout
    from pagoda.app.store import ConversationStore

    _app, loop = start_app()
    out = ROOT / "docs" / "screenshot-1366x768.png"
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["PAGODA_CONFIG_DIR"] = tmp  # a first start: no layout kept from before
        os.environ["PAGODA_KV_CACHE_DIR"] = str(Path(tmp) / "kv-blocks")
        host = EngineHost()
        window = MainWindow(AsyncStore(ConversationStore.open(Path(tmp) / "shot.db")), host,
                            connection_keys=ConnectionKeys.in_memory(),
                            window_layout=WindowLayout(Path(tmp) / LAYOUT_FILE))
        window.show()
        host.load(None)
        with loop:
            loop.run_until_complete(converse(window))
            window.screen().grabWindow(0).save(str(out))  # the whole screen, frame included
            window.close()
            window.db.close()
    print(f"saved {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
