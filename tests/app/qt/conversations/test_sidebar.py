"""The sidebar: renaming, pinning and searching chats, driven by real key presses."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QFontMetrics
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QLineEdit, QMenu

from pagoda.app.qt.conversations.sidebar import ConversationItem, Sidebar
from pagoda.app.qt.shared.theme import theme_stylesheet

NOW = datetime(2025, 5, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def sidebar(qtbot) -> Sidebar:
    widget = Sidebar()
    widget.setStyleSheet(theme_stylesheet("light"))  # its padding is what squeezed the editor
    qtbot.addWidget(widget)
    widget.resize(260, 400)
    widget.show()
    widget.set_conversations([
        ConversationItem(1, "Trip to Kyoto", NOW, True),
        ConversationItem(2, "Sourdough starter", NOW, False),
    ])
    return widget


def start_renaming(sidebar: Sidebar, conversation_id: int) -> QLineEdit:
    rename = sidebar.build_context_menu(conversation_id).actions()[0]
    assert rename.text() == "Rename"
    rename.trigger()
    editor = sidebar.conversation_list.viewport().findChild(QLineEdit)
    assert editor is not None and editor.isVisible()
    return editor


def test_rename_editor_is_tall_enough_to_read_the_title(sidebar):
    editor = start_renaming(sidebar, 2)

    assert editor.text() == "Sourdough starter"
    assert editor.height() >= QFontMetrics(editor.font()).height()
    assert editor.height() >= editor.sizeHint().height()  # its frame and padding fit too


def test_renaming_a_pinned_chat_sends_the_new_title(sidebar, qtbot):
    editor = start_renaming(sidebar, 1)
    editor.selectAll()
    qtbot.keyClicks(editor, "Kyoto in spring")

    with qtbot.waitSignal(sidebar.rename_requested) as renamed:
        qtbot.keyClick(editor, Qt.Key.Key_Return)

    assert renamed.args == [1, "Kyoto in spring"]


def test_the_same_list_again_leaves_a_rename_in_progress_open(sidebar):
    editor = start_renaming(sidebar, 2)
    editor.setText("Sourdough, day 3")

    sidebar.set_conversations([ConversationItem(1, "Trip to Kyoto", NOW, True),
                               ConversationItem(2, "Sourdough starter", NOW, False)])

    assert editor.isVisible() and editor.text() == "Sourdough, day 3"


def test_pinned_chat_shows_the_pin_icon_instead_of_an_emoji(sidebar):
    pinned, unpinned = (sidebar.conversation_list.item(row) for row in range(2))

    assert pinned.text() == "Trip to Kyoto"
    assert "📌" not in pinned.text()
    assert not pinned.icon().isNull()
    assert "Pinned" in pinned.toolTip()
    assert unpinned.icon().isNull()


def test_esc_clears_the_search_and_returns_to_the_conversation_list(sidebar, qtbot):
    with qtbot.waitSignal(sidebar.search_requested) as searched:
        qtbot.keyClicks(sidebar.search_box, "Kyoto")
    assert searched.args == ["Kyoto"]
    assert sidebar.results_list.isVisible()

    with qtbot.waitSignal(sidebar.search_requested, timeout=50) as cleared:
        qtbot.keyClick(sidebar.search_box, Qt.Key.Key_Escape)

    assert cleared.args == [""]
    assert sidebar.search_box.text() == ""
    assert sidebar.conversation_list.isVisible()
    assert not sidebar.results_list.isVisible()


def test_a_right_click_marks_the_row_its_menu_acts_on_and_keeps_the_current_chat(sidebar,
                                                                                 qtbot):
    sidebar.select_conversation(1)
    chats = sidebar.conversation_list
    second = chats.visualItemRect(chats.item(1)).center()

    with qtbot.waitSignal(chats.customContextMenuRequested):  # through the window, as a user's
        QTest.mouseClick(sidebar.windowHandle(), Qt.MouseButton.RightButton,
                         Qt.KeyboardModifier.NoModifier, chats.viewport().mapTo(sidebar, second))
    menu = next(m for m in sidebar.findChildren(QMenu) if m.isVisible())

    assert sidebar.marked_conversation_id() == 2  # the row the menu is about
    assert sidebar.current_conversation_id() == 1
    menu.close()
    assert sidebar.marked_conversation_id() == 1
    qtbot.mouseClick(chats.viewport(), Qt.MouseButton.LeftButton, pos=second)
    assert sidebar.current_conversation_id() == 2


def test_import_is_a_button_above_the_list(sidebar, qtbot):
    button = sidebar.import_button
    assert button.isVisible() and button.text() == "Import…"

    with qtbot.waitSignal(sidebar.import_requested):
        qtbot.mouseClick(button, Qt.MouseButton.LeftButton)


def test_a_chat_writing_a_reply_is_marked_until_it_ends(sidebar):
    sidebar.show_writing(2, True)
    sidebar.set_conversations([ConversationItem(2, "Sourdough starter", NOW, False),
                               ConversationItem(1, "Trip to Kyoto", NOW, True)])
    writing = sidebar.conversation_list.item(0)

    assert sidebar.is_writing(2) and not writing.icon().isNull()
    assert "Writing a reply" in writing.toolTip()
    sidebar.show_writing(2, False)
    assert not sidebar.is_writing(2) and writing.icon().isNull()
    assert "Writing" not in writing.toolTip()
