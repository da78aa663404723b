"""Take docs/screenshot.png from the real window, with the engine in it: one chat whose reply was
cut at its max tokens (so it offers Continue), and the current chat reading a long paste, its
reply saying how far it has read; the settings open beside it (which chat they edit, defaults for
new chats, the model's quantization and disk cache).

Run under a real X server, e.g. `xvfb-run -a -s "-screen 0 1400x900x24" .venv/bin/python
docs/screenshot.py`.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("QT_QPA_PLATFORM", "xcb")  # a real window

CUT_CHAT = "Write a short poem about a lighthouse keeper."
WINDS = ("north-west", "south", "east", "west by south-west", "calm", "north")
SHIPS = ("two trawlers", "a tanker bound for the strait", "the mail boat", "a yacht under sail",
         "no ships", "a container ship and its pilot")
PASTE = "\n".join(
    f"Day {day}: wind {WINDS[day % 6]}, sea {('calm', 'moderate', 'rough')[day % 3]}; saw "
    f"{SHIPS[(day * 5) % 6]}. Lamp lit at 18:{(day * 7) % 60:02d}, oil {40 - day % 9} litres."
    for day in range(1, 91))
LONG_CHAT = f"My notes from the season. Summarize them in three lines.\n\n{PASTE}"
READ_AT_LEAST = 1024  # tokens of the paste read when the picture is taken
READING = re.compile(r"reading your message: ([\d,]+) / ")


async def ready_window(window) -> None:
    """The window restored with its model loaded, and no tab open."""
    await window.restore()
    while not window.host.is_ready:
        await asyncio.sleep(0.1)
    window.chat_tabs.close_tab(0)  # the empty chat restore() opened


async def ask_in_a_new_chat(window, title: str, sampling, question: str) -> None:
    """A new chat `title` asked `question`, its reply waited for."""
    chat = await window.db.create_conversation(title=title, sampling=sampling)
    tab = await window.chat_tabs.open_conversation(chat.id)
    tab.composer.send_requested.emit(question)
    await asyncio.sleep(0.5)
    while window.controllers[chat.id].is_streaming:
        await asyncio.sleep(0.2)


async def converse(window) -> None:
    from pagoda.app.store import SamplingSettings

    await ready_window(window)
    await ask_in_a_new_chat(window, "A lighthouse poem",
                            SamplingSettings(temperature=0.7, max_tokens=40, seed=3), CUT_CHAT)
    notes = await window.db.create_conversation(
        title="Season notes", sampling=SamplingSettings(temperature=0.3, max_tokens=80))
    tab = await window.chat_tabs.open_conversation(notes.id)
    window.settings_dock.setVisible(True)
    tab.composer.send_requested.emit(LONG_CHAT)
    while _tokens_read(window, notes.id) < READ_AT_LEAST:
        await asyncio.sleep(0.05)


def _tokens_read(window, conversation_id: int) -> int:
    controller = window.controllers[conversation_id]
    reply = controller.session.reply
    if reply is None or reply.reading is None:
        return 0
    match = READING.match(reply.reading)
    return int(match.group(1).replace(",", "")) if match else 0


def start_app():
    """The application in the light theme with its icon, and its qasync event loop."""
    import qasync
    from PySide6.QtWidgets import QApplication

    from pagoda.app.qt.shared.theme import app_icon, apply_theme

    app = QApplication(sys.argv[:1])
    apply_theme(app, "light")
    app.setWindowIcon(app_icon())
    loop = qasync.QEventLoop(app)
    asyncio.set_event_loop(loop)
    return app, loop


def main() -> int:
    from pagoda.app.components.shared.async_store import AsyncStore
    from pagoda.app.components.shared.connections import ConnectionKeys
    from pagoda.app.qt.main_window import MainWindow
    from pagoda.app.qt.models.engine_host import EngineHost
    from pagoda.app.store import ConversationStore

    _app, loop = start_app()
    out = ROOT / "docs" / "screenshot.png"
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["PAGODA_KV_CACHE_DIR"] = str(Path(tmp) / "kv-blocks")
        host = EngineHost()
        window = MainWindow(AsyncStore(ConversationStore.open(Path(tmp) / "shot.db")), host,
                            connection_keys=ConnectionKeys.in_memory())
        window.resize(1360, 840)
        window.move(0, 0)
        window.show()
        host.load(None)
        with loop:
            loop.run_until_complete(converse(window))
            window.grab().save(str(out))
            window.close()
            window.db.close()
    print(f"saved {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
