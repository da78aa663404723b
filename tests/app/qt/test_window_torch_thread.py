"""The window's own loader builds the engine on the engine thread: from the load to a streamed
reply, no other thread of the app (GUI, loader, tokenizer, store) calls into torch."""

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QPlainTextEdit
from tiny_gguf import QType, write_tiny_gguf
from torch_threads import torch_callers

from pagoda.app.components.shared.async_store import AsyncStore
from pagoda.app.qt.main_window import MainWindow
from pagoda.app.qt.models.engine_host import EngineHost
from pagoda.app.store import ConversationStore, SamplingSettings

pytestmark = pytest.mark.slow
WAIT_MS = 60_000


def test_a_reply_in_the_window_runs_torch_on_the_engine_thread_only(qloop, qtbot, run_async,
                                                                     tmp_path):
    model = write_tiny_gguf(tmp_path / "tiny.gguf", matrix_type=QType.Q4_0).path
    window = MainWindow(AsyncStore(ConversationStore.open(tmp_path / "chats.db")), EngineHost())
    qtbot.addWidget(window)
    window.show()
    try:
        with torch_callers() as callers:
            window.models_controller.load_model(str(model))
            qtbot.waitUntil(lambda: window.host.is_ready, timeout=WAIT_MS)
            conversation = window.db.store.create_conversation(
                sampling=SamplingSettings(temperature=0.0, max_tokens=4))
            tab = run_async(window.chat_tabs.open_conversation(conversation.id))
            box = tab.composer.findChild(QPlainTextEdit, "composer")
            qtbot.keyClicks(box, "hello")
            qtbot.keyClick(box, Qt.Key.Key_Return)
            controller = window.controllers[tab.conversation_id]
            qtbot.waitUntil(lambda: len(controller.path) == 2 and not controller.is_streaming
                            and controller.path[-1].status == "complete", timeout=WAIT_MS)
        assert callers.threads == {"pagoda-engine"}, callers.examples
    finally:
        window.close()
        window.db.close()
