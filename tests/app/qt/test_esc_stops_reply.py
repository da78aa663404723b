"""Esc stops the current chat's reply wherever the focus is in the window, as the Shortcuts
dialog says, and still does what the focused widget uses it for (the search box clears)."""

from __future__ import annotations

from fake_engine import WAIT_MS
from PySide6.QtCore import Qt

from app.qt.main_window import MainWindow


def _finished_chat(window: MainWindow, qtbot):
    """The current tab after one finished exchange; its fake engine."""
    controller = window.current_controller()
    engine = window.host._factory.built[None]
    controller.spawn(controller.session.send("Tell me a story"))
    qtbot.waitUntil(lambda: bool(engine.requests), timeout=WAIT_MS)
    engine.say(engine.requests[-1], "Once upon a time", "stop")
    qtbot.waitUntil(lambda: not controller.is_streaming, timeout=WAIT_MS)
    return controller, engine


def _newest(controller):
    return controller.db.store.current_path(controller.conversation_id)[-1]


def test_esc_after_clicking_regenerate_stops_the_new_reply(window_on, tmp_path, qtbot):
    window = window_on(tmp_path / "chats.db")
    controller, engine = _finished_chat(window, qtbot)
    button = controller.view.regenerate_button

    qtbot.mouseClick(button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: len(engine.requests) == 2 and controller.reply is not None,
                    timeout=WAIT_MS)
    engine.say(engine.requests[-1], "Long ago")
    qtbot.waitUntil(lambda: controller.reply.text == "Long ago", timeout=WAIT_MS)
    qtbot.keyClick(button, Qt.Key.Key_Escape)

    qtbot.waitUntil(lambda: not controller.is_streaming, timeout=WAIT_MS)
    reply = _newest(controller)
    assert reply.status == "interrupted" and reply.content == "Long ago"


def test_esc_in_the_transcript_stops_the_reply(window_on, tmp_path, qtbot):
    window = window_on(tmp_path / "chats.db")
    controller, engine = _finished_chat(window, qtbot)
    controller.spawn(controller.session.send("And then?"))
    qtbot.waitUntil(lambda: len(engine.requests) == 2, timeout=WAIT_MS)

    qtbot.keyClick(controller.view.transcript, Qt.Key.Key_Escape)

    qtbot.waitUntil(lambda: not controller.is_streaming, timeout=WAIT_MS)
    assert _newest(controller).status in ("interrupted", "error")


def test_esc_in_the_search_box_clears_it_and_leaves_the_reply(window_on, tmp_path, qtbot):
    window = window_on(tmp_path / "chats.db")
    controller, engine = _finished_chat(window, qtbot)
    controller.spawn(controller.session.send("And then?"))
    qtbot.waitUntil(lambda: len(engine.requests) == 2, timeout=WAIT_MS)
    window.sidebar.search_box.setText("story")

    qtbot.keyClick(window.sidebar.search_box, Qt.Key.Key_Escape)

    assert window.sidebar.search_box.text() == ""
    assert controller.is_streaming
    qtbot.keyClick(window.sidebar.search_box, Qt.Key.Key_Escape)  # now empty: Esc stops
    qtbot.waitUntil(lambda: not controller.is_streaming, timeout=WAIT_MS)
