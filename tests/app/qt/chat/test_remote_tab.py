"""A chat that answers from a saved server, in the window: picked in the model picker, shown in
the tab and the status bar, kept across a restart, and a server that fails mid-reply.
The server is the fake one in vLLM's shape on 127.0.0.1; the local engine is a fake."""

from fake_server import MODEL, REPLY

from pagoda.app.qt.models.models_controller import ADD_SERVER_ITEM, SERVER_ITEM_PREFIX

WAIT_MS = 10_000


def _add_and_pick(window, run_async, url: str):
    connection = run_async(window.sources.saved.add(url, MODEL, None))
    window.models_controller.refresh_picker()
    window.models_controller.picked(window.model_picker.findData(SERVER_ITEM_PREFIX + connection.id))
    return connection


def _send(window, qtbot, text: str):
    controller = window.chat_tabs.current_controller()
    controller.view.composer.send_requested.emit(text)
    qtbot.waitUntil(lambda: controller.is_streaming, timeout=WAIT_MS)
    qtbot.waitUntil(lambda: not controller.is_streaming, timeout=WAIT_MS)
    return controller


def test_a_chat_picked_onto_a_server_answers_from_it_and_says_so(window_on, fake_vllm, qtbot,
                                                                 run_async, tmp_path):
    fake, url = fake_vllm
    window = window_on(tmp_path / "chats.db")
    connection = _add_and_pick(window, run_async, url)

    controller = _send(window, qtbot, "Hello")

    reply = window.db.store.current_path(controller.conversation_id)[-1]
    assert (reply.status, reply.content) == ("complete", REPLY)
    assert fake.requests and fake.requests[-1]["messages"][-1]["content"] == "Hello"
    assert controller.view.source_label.text() == connection.label
    assert window.model_picker.currentData() == SERVER_ITEM_PREFIX + connection.id
    assert window.status.summary_text().startswith(f"Remote · {connection.label}")
    qtbot.waitUntil(lambda: "TTFT" in window.status.summary_text(), timeout=WAIT_MS)
    assert "KV cache" not in window.status.summary_text()  # the server does not say


def test_a_chat_keeps_its_server_after_a_restart_and_new_chats_follow_it(
        window_on, fake_vllm, qtbot, run_async, tmp_path):
    _, url = fake_vllm
    db_path = tmp_path / "chats.db"
    window = window_on(db_path)
    connection = _add_and_pick(window, run_async, url)
    _send(window, qtbot, "Hello")
    window.close()
    window.db.close()  # as the app does at exit: the next start takes the database's lock

    again = window_on(db_path)
    controller = again.chat_tabs.current_controller()
    assert controller.view.source_label.text() == connection.label
    assert again.model_picker.currentData() == SERVER_ITEM_PREFIX + connection.id
    run_async(again.chat_tabs.new_chat())
    assert again.chat_tabs.current_controller() is not controller
    assert again.chat_tabs.current_controller().view.source_label.text() == connection.label


def test_picking_the_local_model_moves_the_chat_back_to_this_computer(
        window_on, fake_vllm, run_async, tmp_path):
    _, url = fake_vllm
    window = window_on(tmp_path / "chats.db")
    _add_and_pick(window, run_async, url)
    window.models_controller.picked(window.model_picker.findData(""))
    assert window.model_picker.currentData() == ""
    controller = window.chat_tabs.current_controller()
    assert controller.session.source is window.host
    assert controller.view.source_label.text().endswith("· this computer")
    assert not window.status.summary_text().startswith("Remote")


def test_a_server_that_drops_mid_reply_keeps_the_text_interrupted_with_the_reason(
        window_on, fake_vllm, qtbot, run_async, tmp_path):
    fake, url = fake_vllm
    window = window_on(tmp_path / "chats.db")
    _add_and_pick(window, run_async, url)
    fake.fault.drop_after = 4

    controller = _send(window, qtbot, "Hello")

    reply = window.db.store.current_path(controller.conversation_id)[-1]
    assert reply.status == "interrupted" and reply.content == "Hello there! I"
    assert "connection" in controller.view.notice_text().lower()


def test_add_a_server_opens_the_dialog(window_on, tmp_path):
    from pagoda.app.qt.server.add_server_dialog import AddServerDialog

    window = window_on(tmp_path / "chats.db")
    window.models_controller.picked(window.model_picker.findData(ADD_SERVER_ITEM))
    dialog = window.findChild(AddServerDialog, "addServerDialog")
    assert dialog is not None and dialog.isVisible()


def test_removing_a_server_forgets_it_and_its_chats_answer_here_again(
        window_on, fake_vllm, qtbot, run_async, tmp_path):
    from PySide6.QtWidgets import QMessageBox

    from pagoda.app.components.chat.chat_sources import CHAT_SOURCES_SETTING
    from pagoda.app.components.shared.connections import CONNECTIONS_SETTING
    from pagoda.app.qt.models.models_controller import REMOVE_SERVER_ITEM

    _, url = fake_vllm
    window = window_on(tmp_path / "chats.db")
    connection = _add_and_pick(window, run_async, url)
    window.models_controller.picked(window.model_picker.findData(REMOVE_SERVER_ITEM))
    box = window.findChild(QMessageBox, "removeServerDialog")
    box.button(QMessageBox.StandardButton.Yes).click()

    controller = window.chat_tabs.current_controller()
    qtbot.waitUntil(lambda: controller.session.source is window.host, timeout=WAIT_MS)
    qtbot.waitUntil(lambda: window.model_picker.findData(SERVER_ITEM_PREFIX + connection.id) < 0,
                    timeout=WAIT_MS)
    assert window.model_picker.findData(REMOVE_SERVER_ITEM) < 0
    store = window.db.store
    assert store.get_setting(CONNECTIONS_SETTING) == []
    assert store.get_setting(CHAT_SOURCES_SETTING) == {}
    assert controller.view.source_label.text().endswith("· this computer")


def test_the_apps_memory_stays_in_the_status_bar_while_a_chat_answers_from_a_server(
        window_on, fake_vllm, qtbot, run_async, tmp_path):
    _, url = fake_vllm
    window = window_on(tmp_path / "chats.db")
    qtbot.waitUntil(lambda: "| Memory " in window.status.summary_text(), timeout=WAIT_MS)
    _add_and_pick(window, run_async, url)
    _send(window, qtbot, "Hello")
    assert window.status.summary_text().startswith("Remote")
    window.host._set_status(resident_bytes=123_000_000)
    assert window.status.summary_text().endswith("| Memory 123 MB")
