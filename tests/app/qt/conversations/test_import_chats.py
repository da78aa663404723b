"""Import chats…: a Pagoda export chosen in the window joins the sidebar, and a file that is
not one is refused in words, with nothing written."""

from __future__ import annotations

import json

import pytest
from PySide6.QtWidgets import QFileDialog, QMessageBox

from pagoda.app.store import ConversationStore

WAIT_MS = 10_000


@pytest.fixture
def export_file(tmp_path):
    """An export of two chats, written by another Pagoda's store."""
    other = ConversationStore.open(tmp_path / "other.db")
    for title, question in [("Trip to Kyoto", "Where should I stay?"),
                            ("Sourdough starter", "How often do I feed it?")]:
        cid = other.create_conversation(title=title).id
        other.append_user_message(cid, question)
    path = tmp_path / "chats.json"
    path.write_text(other.export_json(), encoding="utf-8")
    other.close()
    return path


def _titles(window) -> list[str]:
    return [item.title for item in window.sidebar._items.values()]


def _error_box(window) -> QMessageBox | None:
    return window.findChild(QMessageBox, "importErrorDialog")


def test_imported_chats_appear_in_the_sidebar_and_the_count_is_said(window_on, export_file,
                                                                     run_async, tmp_path):
    window = window_on(tmp_path / "chats.db")
    run_async(window.chat_list.import_from(export_file))

    assert {"Trip to Kyoto", "Sourdough starter"} <= set(_titles(window))
    assert window.status.currentMessage() == "Imported 2 chats from chats.json."
    assert _error_box(window) is None


@pytest.mark.parametrize(("content", "words"), [
    ("{this is not json", "is not JSON"),
    (json.dumps({"format": "pagoda-conversations", "version": 2, "conversations": []}),
     "version must be 1"),
    (json.dumps({"format": "something-else", "version": 1}), "format must be"),
])
def test_a_file_that_is_not_an_export_is_refused_in_words_and_nothing_is_imported(
        window_on, run_async, tmp_path, content, words):
    window = window_on(tmp_path / "chats.db")
    before, stored = _titles(window), len(window.db.store.list_conversations())
    bad = tmp_path / "bad.json"
    bad.write_text(content, encoding="utf-8")

    run_async(window.chat_list.import_from(bad))

    box = _error_box(window)
    assert box is not None and box.isVisible()
    assert words in box.text() and "bad.json" in box.text() and "Export…" in box.text()
    assert _titles(window) == before
    assert len(window.db.store.list_conversations()) == stored


def test_a_file_too_large_to_be_an_export_is_refused_before_it_is_read(
        window_on, run_async, tmp_path, monkeypatch, export_file):
    monkeypatch.setattr("pagoda.app.components.conversations.chat_import.MAX_IMPORT_BYTES", 1024)
    window = window_on(tmp_path / "chats.db")
    export_file.write_text(export_file.read_text() + " " * 2048)

    run_async(window.chat_list.import_from(export_file))

    assert "larger than" in _error_box(window).text()
    assert "Trip to Kyoto" not in _titles(window)


def test_a_file_that_is_not_text_is_refused_in_words(window_on, run_async, tmp_path):
    window = window_on(tmp_path / "chats.db")
    binary = tmp_path / "photo.json"
    binary.write_bytes(b"\xff\xd8\xff\xe0" + bytes(range(256)))

    run_async(window.chat_list.import_from(binary))

    assert "is not text" in _error_box(window).text()


def test_import_chats_sits_beside_export_in_a_chats_menu_and_opens_a_file_dialog(
        window_on, run_async, tmp_path, export_file):
    window = window_on(tmp_path / "chats.db")
    run_async(window.chat_list.import_from(export_file))
    cid = next(iter(window.sidebar._items))
    menus = [window.sidebar.build_context_menu(cid), window.sidebar.build_context_menu(None)]
    texts = [action.text() for action in menus[0].actions()]
    assert texts[texts.index("Export…") + 1] == "Import chats…"

    [below_the_chats] = menus[1].actions()
    below_the_chats.trigger()

    dialog = window.findChild(QFileDialog)
    assert dialog is not None and dialog.isVisible()
    assert dialog.fileMode() == QFileDialog.FileMode.ExistingFile
    dialog.reject()
