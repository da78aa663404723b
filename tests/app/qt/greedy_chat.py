"""A window over the app's own engine loader, and a greedy chat turn typed into one of its
tabs, noting what the tab was shown as the reply streamed (its thinking and its answer)."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QPlainTextEdit

from pagoda.app.components.shared.async_store import AsyncStore
from pagoda.app.qt.main_window import MainWindow
from pagoda.app.qt.models.engine_host import EngineHost
from pagoda.app.store import ConversationStore, SamplingSettings

WAIT_MS = 60_000


def real_window(qtbot, db_path: Path) -> MainWindow:
    """Shown, on the chats at db_path; its models load as the app loads them."""
    window = MainWindow(AsyncStore(ConversationStore.open(db_path)), EngineHost())
    qtbot.addWidget(window)
    window.show()
    return window


def close_window(window: MainWindow) -> None:
    window.close()  # the open tabs are remembered, the engine stopped
    window.db.close()


def greedy_turn(window: MainWindow, qtbot, run_async, text: str, max_tokens: int):
    """(the tab, its reply as stored, [("thinking" | "answer", delta) as the tab was shown
    them]) once the reply to `text`, typed into a new chat and sent with Return, has ended.
    Greedy and unpenalised, so the reply is the model's own argmax."""
    conversation = window.db.store.create_conversation(sampling=SamplingSettings(
        temperature=0.0, repetition_penalty=1.0, max_tokens=max_tokens))
    tab = run_async(window.chat_tabs.open_conversation(conversation.id))
    shown: list[tuple[str, str]] = []
    for method, kind in (("append_reasoning", "thinking"), ("append_delta", "answer")):
        _note_calls(tab, method, kind, shown)
    box = tab.composer.findChild(QPlainTextEdit, "composer")
    qtbot.keyClicks(box, text)
    qtbot.keyClick(box, Qt.Key.Key_Return)
    controller = window.controllers[conversation.id]
    qtbot.waitUntil(lambda: len(controller.path) == 2 and not controller.is_streaming,
                    timeout=WAIT_MS)
    return tab, controller.path[-1], shown


def _note_calls(tab, method: str, kind: str, shown: list[tuple[str, str]]) -> None:
    show = getattr(tab, method)

    def noted(message_id: int, delta: str) -> None:
        shown.append((kind, delta))
        show(message_id, delta)

    setattr(tab, method, noted)
