"""A chat's folders, as the window shows them: the folder button beside the paperclip opens a
folder dialog, each folder a chip above the composer (its files, where the indexing stands, the
files not read in its tooltip), a ✕ removes it, and a restart brings the folders back."""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFileDialog, QFrame, QLabel, QToolButton, QWidget

from pagoda.app.components.shared.view_models import FolderView
from pagoda.app.qt.chat.chat_tab import ChatTab
from pagoda.app.qt.chat.composer import FOLDER_TIP
from pagoda.app.qt.chat.controller import ChatController

WAIT_MS = 10_000
INDEXING = FolderView(3, "notes", "/home/ana/notes", "indexing", files=120, indexed=40, done=40,
                      to_read=120)
READY = FolderView(4, "papers", "/home/ana/papers", "ready", files=12, indexed=11,
                   failed=(("scans/old.pdf", "old.pdf has no text to read on its 3 pages"),),
                   notes=("Only the first 2,000 files are indexed.",))
GONE = FolderView(5, "usb", "/media/usb", "failed", indexed=7,
                  error="/media/usb is not a folder (any more): its drive is not connected")


@pytest.fixture
def chat_tab(qtbot) -> ChatTab:
    widget = ChatTab(1)
    widget.resize(720, 560)
    qtbot.addWidget(widget)
    widget.show()
    return widget


def folder_chips(tab: ChatTab) -> list[QFrame]:
    return [chip for chip in tab.findChildren(QFrame, "folderChip") if not chip.isHidden()]


def chip_texts(tab: ChatTab) -> list[tuple[str, str]]:
    return [(chip.findChild(QLabel, "folderName").text(),
             chip.findChild(QLabel, "folderStatus").text()) for chip in folder_chips(tab)]


def write_notes(root: Path) -> Path:
    (root / "log").mkdir(parents=True)
    (root / "log" / "lighthouse.md").write_text("# Log\n\nThe keeper lit the lamp at dusk.\n")
    (root / "harbour.txt").write_text("Thirty boats at the old pier.\n")
    (root / "garden.html").write_text("<html><body><p>Tomatoes ripened.</p></body></html>")
    return root


def test_the_folder_button_opens_a_folder_dialog_and_the_folder_chosen_is_asked_for(
        chat_tab, qtbot, tmp_path):
    button = chat_tab.composer.findChild(QToolButton, "folderButton")
    assert button.toolTip() == FOLDER_TIP and button.isVisible()

    qtbot.mouseClick(button, Qt.MouseButton.LeftButton)
    dialog = chat_tab.findChild(QFileDialog, "folderDialog")
    assert dialog is not None and dialog.isVisible()
    assert dialog.fileMode() == QFileDialog.FileMode.Directory

    with qtbot.waitSignal(chat_tab.folder_requested) as requested:
        dialog.fileSelected.emit(str(tmp_path))
    assert requested.args == [str(tmp_path)]
    dialog.reject()


def test_each_folder_is_a_chip_saying_where_its_indexing_stands(chat_tab):
    chat_tab.show_folders([INDEXING, READY, GONE])

    assert chip_texts(chat_tab) == [
        ("notes", "120 files · indexing 40 / 120"),
        ("papers", "12 files · up to date · 1 not read"),
        ("usb", GONE.error),
    ]
    statuses = [chip.findChild(QLabel, "folderStatus") for chip in folder_chips(chat_tab)]
    assert [s.property("error") for s in statuses] == [None, True, True]
    tip = folder_chips(chat_tab)[1].toolTip()
    assert "/home/ana/papers" in tip and "11 files indexed of 12 found." in tip
    assert "scans/old.pdf: old.pdf has no text" in tip and "Only the first 2,000" in tip
    assert "answers from what was indexed before" in folder_chips(chat_tab)[2].toolTip()
    assert chat_tab.findChild(QWidget, "folderChips").isVisible()


def test_the_cross_asks_to_remove_that_folder_and_no_folders_hide_the_row(chat_tab, qtbot):
    chat_tab.show_folders([INDEXING, READY])

    with qtbot.waitSignal(chat_tab.folder_removed) as removed:
        qtbot.mouseClick(folder_chips(chat_tab)[1].findChild(QToolButton, "removeFolder"),
                         Qt.MouseButton.LeftButton)
    assert removed.args == [READY.id]

    chat_tab.show_folders([])
    assert folder_chips(chat_tab) == []
    assert not chat_tab.findChild(QWidget, "folderChips").isVisible()


class RecordingSession:
    """What the controller calls of a ChatSession for folders, recorded."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.files = self  # the session's files (a ChatFiles) are recorded here too

    def spawn(self, call: tuple) -> None:
        self.calls.append(call)

    def add_folder(self, path: str) -> tuple:
        return ("add_folder", path)

    def remove_folder(self, folder_id: int) -> tuple:
        return ("remove_folder", folder_id)

    def stop(self) -> None: ...

    def begin_edit(self, message_id: int) -> None: ...

    def clear_notice(self) -> None: ...


def test_the_controller_forwards_adding_and_removing_a_folder(chat_tab, tmp_path):
    session = RecordingSession()
    ChatController(session, chat_tab)
    chat_tab.show_folders([READY])

    chat_tab.composer.folder_requested.emit(str(tmp_path))
    folder_chips(chat_tab)[0].findChild(QToolButton, "removeFolder").click()

    assert session.calls == [("add_folder", str(tmp_path)), ("remove_folder", READY.id)]


def test_a_folder_added_in_the_window_is_indexed_and_comes_back_after_a_restart(
        window_on, qtbot, run_async, tmp_path):
    db_path = tmp_path / "chats.db"
    root = write_notes(tmp_path / "notes")
    window = window_on(db_path)
    tab = window.chat_tabs.current_controller().view

    tab.composer.folder_requested.emit(str(root))
    qtbot.waitUntil(lambda: chip_texts(tab) == [("notes", "3 files · up to date")],
                    timeout=WAIT_MS)
    window.close()
    window.db.close()  # as the app does at exit: the next start takes the database's lock

    again = window_on(db_path)
    tab = again.chat_tabs.current_controller().view
    qtbot.waitUntil(lambda: chip_texts(tab) == [("notes", "3 files · up to date")],
                    timeout=WAIT_MS)
    session = again.chat_tabs.current_controller().session
    assert [f.source_path for f in run_async(session.files.folders.documents())] == [
        "garden.html", "harbour.txt", "log/lighthouse.md"]
