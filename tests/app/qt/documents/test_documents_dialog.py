"""Settings → Documents: choosing a saved server's embedding model, kept in the store and read
back by the next window, its state shown, and turning it off."""

from __future__ import annotations

import pytest

from pagoda.app.components.documents.document_embeddings import EMBEDDINGS_SETTING
from pagoda.app.qt.documents.documents_dialog import OFF, DocumentsDialog

WAIT_MS = 10_000


@pytest.fixture
def window(window_on, tmp_path):
    return window_on(tmp_path / "chats.db")


def test_use_and_turn_off_are_offered_only_where_they_change_something(window, qtbot,
                                                                         run_async):
    run_async(window.sources.saved.add("http://embedder:8080/v1", "chat", None))
    dialog = window.open_documents_dialog()
    assert dialog.use_button.text() == "Turn off" and not dialog.use_button.isEnabled()
    assert "off already" in dialog.use_button.toolTip()

    dialog.server.setCurrentIndex(1)
    dialog.model.setText("nomic-embed-text")
    dialog.use_button.click()
    qtbot.waitUntil(lambda: window.embeddings.source is not None, timeout=WAIT_MS)
    qtbot.waitUntil(lambda: not dialog.use_button.isEnabled(), timeout=WAIT_MS)  # in use
    dialog.model.setText("bge-small")
    assert dialog.use_button.isEnabled()
    dialog.server.setCurrentIndex(0)
    assert dialog.use_button.isEnabled()

    dialog.use_button.click()
    qtbot.waitUntil(lambda: window.embeddings.source is None, timeout=WAIT_MS)
    qtbot.waitUntil(lambda: not dialog.use_button.isEnabled(), timeout=WAIT_MS)


def test_an_embedding_server_is_chosen_kept_and_turned_off(window, qtbot, run_async):
    server = run_async(window.sources.saved.add("http://embedder:8080/v1", "chat", None))
    dialog = window.open_documents_dialog()
    assert isinstance(dialog, DocumentsDialog) and not dialog.isModal()
    assert dialog.server.itemText(0) == OFF and dialog.server.count() == 2
    assert "off" in dialog.state_label.text() and not dialog.test_button.isEnabled()
    dialog.server.setCurrentIndex(1)
    assert not dialog.use_button.isEnabled()  # no model named yet
    dialog.model.setText("nomic-embed-text")
    dialog.use_button.click()
    qtbot.waitUntil(lambda: window.embeddings.source is not None, timeout=WAIT_MS)
    assert "nomic-embed-text at" in dialog.state_label.text()
    assert dialog.test_button.isEnabled()
    window.db.drain()
    assert window.db.store.get_setting(EMBEDDINGS_SETTING) == {
        "connection": server.id, "model": "nomic-embed-text"}
    dialog.close()
    assert window.open_documents_dialog() is dialog
    assert dialog.server.currentIndex() == 1 and dialog.model.text() == "nomic-embed-text"
    dialog.server.setCurrentIndex(0)
    assert dialog.use_button.text() == "Turn off"
    dialog.use_button.click()
    qtbot.waitUntil(lambda: window.embeddings.source is None, timeout=WAIT_MS)
    window.db.drain()
    assert window.db.store.get_setting(EMBEDDINGS_SETTING) is None
