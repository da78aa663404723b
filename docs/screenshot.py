"""Take docs/screenshot.png from the real window: two tabs with real replies, one in Chinese
from the engine in the window, one from a saved server (Pagoda's own, started here in a process
of its own on 127.0.0.1), with the model picker open on both.

Run under a real X server, e.g. `xvfb-run -a -s "-screen 0 1400x900x24" .venv/bin/python
docs/screenshot.py` (needs a CJK font such as fonts-wqy-microhei for the Chinese tab).
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
os.environ.setdefault("QT_QPA_PLATFORM", "xcb")  # a real window, before the bench's default

from gui_responsiveness import RemoteServer

LOCAL_CHAT = "你好！请用中文简单介绍一下北京。"
REMOTE_CHAT = "What is the capital of France? Answer in two sentences."


async def converse(window, server: RemoteServer) -> None:
    from app.store import SamplingSettings

    model = await asyncio.to_thread(server.wait_ready)
    connection = await window.sources.saved.add(f"{server.url}/v1", model, None)
    await window.restore()
    while not window.host.is_ready:
        await asyncio.sleep(0.1)
    window.close_tab(0)  # the empty chat restore() opened
    settings = SamplingSettings(temperature=0.3, max_tokens=120, seed=7)
    tabs = []
    for prompt, source in ((LOCAL_CHAT, None), (REMOTE_CHAT, connection.id)):
        conversation = await window.db.create_conversation(sampling=settings)
        tab = await window.open_conversation(conversation.id)
        if source is not None:
            window.use_source_in_current_chat(source)
        tab.composer.send_requested.emit(prompt)
        tabs.append(tab)
    await asyncio.sleep(1)
    while any(window.controllers[t.conversation_id].is_streaming for t in tabs):
        await asyncio.sleep(0.2)
    await asyncio.sleep(1)  # a status bar poll after the last token
    window.model_picker.showPopup()
    await asyncio.sleep(0.5)


def main() -> int:
    import qasync
    from PySide6.QtWidgets import QApplication

    from app.async_store import AsyncStore
    from app.connections import ConnectionKeys
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
        server = RemoteServer(set(os.sched_getaffinity(0)), Path(tmp) / "server.log")
        window = MainWindow(AsyncStore(ConversationStore.open(Path(tmp) / "shot.db")),
                            EngineHost(), connection_keys=ConnectionKeys.in_memory())
        window.resize(1280, 800)
        window.move(0, 0)
        window.show()
        window.host.load(None)
        try:
            with loop:
                loop.run_until_complete(converse(window, server))
                # The screen, not the window: the picker's open list is a window of its own.
                frame = window.frameGeometry()
                app.primaryScreen().grabWindow(0, frame.x(), frame.y(), frame.width(),
                                               frame.height()).save(str(out))
                window.model_picker.hidePopup()
                window.close()
                window.db.close()
        finally:
            server.stop()
    print(f"saved {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
