"""The chat list in the window: a new chat joins it with its first message (an empty one
leaves nothing behind), a chat writing a reply is marked on its tab and its row whichever chat
is shown, and Import… is above the list."""

from __future__ import annotations

from fake_engine import WAIT_MS
from PySide6.QtWidgets import QFileDialog

from pagoda.app.qt.shared.theme import apply_theme


def _listed(window) -> set[int]:
    return set(window.sidebar._items)


def test_new_chats_join_the_list_with_their_first_message(window_on, run_async, qtbot,
                                                          tmp_path):
    window = window_on(tmp_path / "chats.db")
    first = window.chats.current
    run_async(window.chat_tabs.new_chat())
    run_async(window.chat_tabs.new_chat())
    empty, written = window.chats.ids[1:]
    assert _listed(window) == set()

    controller = window.controllers[written]
    controller.spawn(controller.session.send("Where is Kyoto?"))
    qtbot.waitUntil(lambda: written in _listed(window), timeout=WAIT_MS)
    run_async(window.chat_tabs.close_tab(window.chats.ids.index(empty)))

    assert _listed(window) == {written}
    kept = {c.id for c in window.db.store.list_conversations(include_archived=True)}
    assert empty not in kept and {first, written} <= kept


def test_a_chat_writing_a_reply_is_marked_on_its_tab_and_row(window_on, run_async, qtbot,
                                                             tmp_path):
    window = window_on(tmp_path / "chats.db")
    controller = window.chat_tabs.current_controller()
    cid = controller.conversation_id
    engine = window.host._factory.built[None]
    controller.spawn(controller.session.send("Tell me a story"))
    qtbot.waitUntil(lambda: bool(engine.requests), timeout=WAIT_MS)
    run_async(window.chat_tabs.new_chat())  # another chat is shown meanwhile

    index = window.tabs.indexOf(controller.view)
    qtbot.waitUntil(lambda: window.sidebar.is_writing(cid), timeout=WAIT_MS)
    assert not window.tabs.tabIcon(index).isNull()
    engine.say(engine.requests[-1], "Once upon a time", "stop")

    qtbot.waitUntil(lambda: not controller.is_streaming, timeout=WAIT_MS)
    assert window.tabs.tabIcon(index).isNull() and not window.sidebar.is_writing(cid)


def test_a_theme_change_redraws_the_writing_mark_in_its_colors(window_on, qtbot, app,
                                                                tmp_path):
    window = window_on(tmp_path / "chats.db")
    controller = window.chat_tabs.current_controller()
    engine = window.host._factory.built[None]
    apply_theme(app, "dark")
    controller.spawn(controller.session.send("Tell me a story"))
    qtbot.waitUntil(lambda: bool(engine.requests), timeout=WAIT_MS)
    index = window.tabs.indexOf(controller.view)
    qtbot.waitUntil(lambda: not window.tabs.tabIcon(index).isNull(), timeout=WAIT_MS)
    on_dark = window.tabs.tabIcon(index).cacheKey()

    apply_theme(app, "light")

    assert window.tabs.tabIcon(index).cacheKey() != on_dark
    engine.say(engine.requests[-1], "Once upon a time", "stop")
    qtbot.waitUntil(lambda: not controller.is_streaming, timeout=WAIT_MS)


def test_import_above_the_list_opens_the_file_dialog(window_on, tmp_path):
    window = window_on(tmp_path / "chats.db")

    window.sidebar.import_button.click()

    dialog = window.findChild(QFileDialog)
    assert dialog is not None and dialog.isVisible() and "Import" in dialog.windowTitle()
    dialog.reject()
