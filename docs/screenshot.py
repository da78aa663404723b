"""Take docs/screenshot.png from the real window: two tabs with real replies, one in Chinese.

Run under a real X server, e.g. `xvfb-run -a -s "-screen 0 1400x900x24" .venv/bin/python
docs/screenshot.py` (needs a CJK font such as fonts-wqy-microhei for the Chinese tab).
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CHATS = ["What is the capital of France? Answer in two sentences.",
         "你好！请用中文简单介绍一下北京。"]


async def converse(window) -> None:
    from app.store import SamplingSettings

    await window.restore()
    while not window.host.is_ready:
        await asyncio.sleep(0.1)
    window.close_tab(0)  # the empty chat restore() opened
    settings = SamplingSettings(temperature=0.3, max_tokens=120, seed=7)
    tabs = []
    for prompt in CHATS:
        conversation = await window.db.create_conversation(sampling=settings)
        tab = await window.open_conversation(conversation.id)
        tab.composer.send_requested.emit(prompt)
        tabs.append(tab)
    while any(window.controllers[t.conversation_id].is_streaming for t in tabs):
        await asyncio.sleep(0.2)
    await asyncio.sleep(0.5)
    window.tabs.setCurrentWidget(tabs[1])
    await asyncio.sleep(0.5)


def main() -> int:
    import qasync
    from PySide6.QtWidgets import QApplication

    from app.async_store import AsyncStore
    from app.engine_host import EngineHost
    from app.main_window import MainWindow
    from app.store import ConversationStore
    from app.theme import app_icon, apply_theme

    app = QApplication(sys.argv[:1])
    apply_theme(app, "light")
    app.setWindowIcon(app_icon())
    loop = qasync.QEventLoop(app)
    asyncio.set_event_loop(loop)
    out = ROOT / "docs" / "screenshot.png"
    with tempfile.TemporaryDirectory() as tmp:
        window = MainWindow(AsyncStore(ConversationStore.open(Path(tmp) / "shot.db")),
                            EngineHost())
        window.resize(1280, 800)
        window.show()
        window.host.load(None)
        with loop:
            loop.run_until_complete(converse(window))
            window.grab().save(str(out))
            window.close()
            window.db.close()
    print(f"saved {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
