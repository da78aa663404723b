"""Esc stops the current chat's reply wherever the focus is in the window, as the Shortcuts
dialog says, and still does what the focused widget uses it for (the search box clears); at
once, right after a switch of tabs too, and before the reply has begun to stream."""

from __future__ import annotations

import threading

from fake_engine import WAIT_MS
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication

from pagoda.app.qt.main_window import MainWindow


def _finished_chat(window: MainWindow, qtbot):
    """The current tab after one finished exchange; its fake engine."""
    controller = window.chat_tabs.current_controller()
    engine = window.host._factory.built[None]
    controller.spawn(controller.session.send("Tell me a story"))
    qtbot.waitUntil(lambda: bool(engine.requests), timeout=WAIT_MS)
    engine.say(engine.requests[-1], "Once upon a time", "stop")
    qtbot.waitUntil(lambda: not controller.is_streaming, timeout=WAIT_MS)
    return controller, engine


def _newest(controller):
    return controller.db.store.current_path(controller.conversation_id)[-1]


def _press(window: MainWindow, qtbot, key: Qt.Key,
           modifiers: Qt.KeyboardModifier = Qt.KeyboardModifier.NoModifier) -> None:
    """A key pressed where the focus is, as the user presses it."""
    qtbot.keyClick(QApplication.focusWidget() or window, key, modifiers)


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


def test_esc_right_after_switching_tabs_stops_that_tabs_reply_at_once(window_on, tmp_path,
                                                                      qtbot, run_async,
                                                                      monkeypatch):
    window = window_on(tmp_path / "chats.db")
    first, engine = _finished_chat(window, qtbot)
    first.spawn(first.session.send("And then?"))
    qtbot.waitUntil(lambda: len(engine.requests) == 2, timeout=WAIT_MS)
    engine.say(engine.requests[-1], "Long ago")
    qtbot.waitUntil(lambda: first.reply is not None and first.reply.text == "Long ago",
                    timeout=WAIT_MS)
    run_async(window.chat_tabs.new_chat())
    second = window.chat_tabs.current_controller()
    second.spawn(second.session.send("Hello"))
    qtbot.waitUntil(lambda: len(engine.requests) == 3, timeout=WAIT_MS)
    heard: list[str] = []
    monkeypatch.setattr(engine, "abort", heard.append)  # the engine hears of it a step later

    _press(window, qtbot, Qt.Key.Key_Tab,
           Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.ShiftModifier)
    assert window.chat_tabs.current_controller() is first
    _press(window, qtbot, Qt.Key.Key_Escape)

    assert heard == [engine.requests[1]]
    assert first.view.transcript.activity_text(first.reply.message.id) == "stopping…"
    engine.say(heard[0], " there lived")  # written before the engine heard of the stop
    engine.say(heard[0], "", "abort")
    qtbot.waitUntil(lambda: not first.is_streaming, timeout=WAIT_MS)
    assert (_newest(first).status, _newest(first).content) == ("interrupted", "Long ago")
    assert "there lived" not in first.view.transcript.plain_text()
    assert second.is_streaming  # the tab switched from writes on


def test_esc_in_the_message_box_stops_a_reply_that_has_not_begun_to_stream(window_on,
                                                                           tmp_path, qtbot):
    window = window_on(tmp_path / "chats.db")
    controller, engine = _finished_chat(window, qtbot)
    store_busy = threading.Event()
    controller.db.submit(lambda _store: store_busy.wait(WAIT_MS / 1000))
    controller.spawn(controller.session.send("And then?"))
    qtbot.waitUntil(lambda: controller.is_streaming, timeout=WAIT_MS)
    controller.view.composer.focus_input()

    _press(window, qtbot, Qt.Key.Key_Escape)
    store_busy.set()

    qtbot.waitUntil(lambda: not controller.is_streaming, timeout=WAIT_MS)
    assert len(engine.requests) == 1  # the reply never reached the engine
    assert (_newest(controller).status, _newest(controller).content) == ("interrupted", "")
