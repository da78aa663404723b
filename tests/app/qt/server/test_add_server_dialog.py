"""The "Add a server" dialog, driven like a user would, against the fake OpenAI server."""

import asyncio

import pytest
from fake_keyring import FakeKeyring, LockedKeyring
from fake_server import MODEL
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QWidget

from pagoda.app.components.shared.async_store import AsyncStore
from pagoda.app.components.shared.connections import (
    AddServerFlow,
    ConnectionKeys,
    SavedConnections,
    ServerProbe,
)
from pagoda.app.qt.server.add_server import open_add_server_dialog
from pagoda.app.store import ConversationStore


@pytest.fixture
def saved(tmp_path):
    db = AsyncStore(ConversationStore.open(tmp_path / "chats.db"))
    yield SavedConnections(db, ConnectionKeys(FakeKeyring()))
    db.close()


@pytest.fixture
def open_dialog(qloop, qtbot):
    """open_dialog(flow) -> (dialog, the connections on_added received)."""
    window = QWidget()
    qtbot.addWidget(window)

    def open_(flow: AddServerFlow):
        added = []
        return open_add_server_dialog(window, flow, added.append), added

    return open_


def connect(qtbot, dialog, url: str, key: str = "") -> None:
    qtbot.keyClicks(dialog.url_edit, url)
    qtbot.keyClicks(dialog.key_edit, key)
    qtbot.mouseClick(dialog.connect_button, Qt.MouseButton.LeftButton)


def test_connect_lists_the_models_and_add_saves_the_chosen_one(qtbot, open_dialog, saved,
                                                                fake_vllm):
    fake, url = fake_vllm
    fake.api_key = "sk-right"
    dialog, added = open_dialog(AddServerFlow(saved))
    assert dialog.objectName() == "addServerDialog" and not dialog.isModal()
    assert dialog.key_edit.echoMode() == dialog.key_edit.EchoMode.Password

    connect(qtbot, dialog, url, "sk-right")
    qtbot.waitUntil(lambda: dialog.model_box.count() == 2, timeout=10_000)
    assert [dialog.model_box.itemText(i) for i in range(2)] == [MODEL, "other-model"]
    assert not dialog.add_button.isEnabled()
    assert not dialog.error_label.isVisible()

    dialog.model_box.setCurrentIndex(1)
    assert dialog.add_button.isEnabled()
    with qtbot.waitSignal(dialog.accepted, timeout=10_000):
        qtbot.mouseClick(dialog.add_button, Qt.MouseButton.LeftButton)
    assert len(added) == 1
    assert (added[0].base_url, added[0].model, added[0].has_key) == (url, "other-model", True)
    assert saved.list() == added
    assert saved.keys.get(added[0].id) == "sk-right"


def test_a_refused_key_is_shown_in_words_and_nothing_can_be_added(qtbot, open_dialog, saved,
                                                                   fake_vllm):
    fake, url = fake_vllm
    fake.api_key = "sk-right"
    dialog, added = open_dialog(AddServerFlow(saved))

    connect(qtbot, dialog, url, "sk-wrong")
    qtbot.waitUntil(dialog.error_label.isVisible, timeout=10_000)
    assert "refused the API key" in dialog.error_label.text()
    assert dialog.model_box.count() == 0
    assert not dialog.add_button.isEnabled()
    assert dialog.connect_button.isEnabled()
    assert added == [] and saved.list() == []


def test_while_connecting_the_buttons_wait_and_editing_the_address_clears_the_models(
        qtbot, open_dialog, saved):
    answer = asyncio.Event()

    async def slow_probe(url, key):
        await answer.wait()
        return ServerProbe("http://gpu-box:8000/v1", ("only-model",), "vllm")

    dialog, _ = open_dialog(AddServerFlow(saved, probe=slow_probe))
    connect(qtbot, dialog, "gpu-box:8000")
    qtbot.waitUntil(lambda: not dialog.connect_button.isEnabled())
    assert dialog.connect_button.text() == "Connecting…"
    assert not dialog.add_button.isEnabled()

    answer.set()
    qtbot.waitUntil(dialog.connect_button.isEnabled)
    assert dialog.model_box.currentText() == "only-model"  # a server's only model is chosen
    assert dialog.add_button.isEnabled()

    qtbot.keyClicks(dialog.url_edit, "1")
    assert dialog.model_box.count() == 0
    assert not dialog.add_button.isEnabled()


def test_the_dialog_says_when_the_key_is_kept_in_memory_only(open_dialog, saved):
    dialog, _ = open_dialog(AddServerFlow(saved))
    assert not dialog.notice_label.isVisible()
    dialog.close()

    no_keyring = SavedConnections(saved.db, ConnectionKeys(LockedKeyring()))
    no_keyring.keys.get("probe")  # the keyring fails on first use
    dialog, _ = open_dialog(AddServerFlow(no_keyring))
    assert dialog.notice_label.isVisible()
    assert "kept in memory until Pagoda closes" in dialog.notice_label.text()
