"""The whole app on the real default model: tabs stream, stop, branch, restore, search."""

import dataclasses

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMessageBox, QPlainTextEdit

from pagoda.app.qt.chat.chat_tab import ChatTab
from pagoda.app.store import SamplingSettings

pytestmark = pytest.mark.slow

GREEDY_SHORT = SamplingSettings(temperature=0.0, max_tokens=16, repetition_penalty=1.0)


def _chat(window, run_async, settings=GREEDY_SHORT, title=None):
    """A conversation with the given settings, opened in a tab."""
    store = window.db.store
    conversation = store.create_conversation(title=title, sampling=settings)
    return run_async(window.chat_tabs.open_conversation(conversation.id))


def _input(tab):
    return tab.composer.findChild(QPlainTextEdit, "composer")


def _send(qtbot, tab, text):
    tab.last_sent = text
    qtbot.keyClicks(_input(tab), text)
    qtbot.keyClick(_input(tab), Qt.Key.Key_Return)


def _controller(window, tab):
    return window.controllers[tab.conversation_id]


def _wait_reply_done(qtbot, window, tab, timeout=60_000):
    """The reply to the newest user message, once it has ended (complete, stopped or failed)."""
    controller = _controller(window, tab)
    asked = tab.last_sent

    def done() -> bool:
        path = controller.path
        return bool(not controller.is_streaming and len(path) >= 2
                    and path[-2].role == "user" and path[-2].content == asked
                    and path[-1].role == "assistant" and path[-1].status != "streaming")

    qtbot.waitUntil(done, timeout=timeout)
    return controller.path[-1]


def test_reply_streams_into_transcript_and_is_saved(make_window, qtbot, run_async):
    window = make_window()
    tab = _chat(window, run_async)
    _send(qtbot, tab, "What is the capital of France?")
    reply = _wait_reply_done(qtbot, window, tab)
    assert reply.status == "complete"
    assert "Paris" in reply.content
    stored = window.db.store.current_path(tab.conversation_id)
    assert [m.role for m in stored] == ["user", "assistant"]
    assert stored[-1].content == reply.content
    assert tab.transcript.message_text(reply.id) == reply.content
    assert stored[-1].stats is not None and stored[-1].stats.tokens_per_s


def test_two_tabs_generate_at_the_same_time(make_window, qtbot, run_async):
    window = make_window()
    slow = SamplingSettings(temperature=0.0, max_tokens=48, repetition_penalty=1.0)
    first = _chat(window, run_async, slow)
    second = _chat(window, run_async, slow)
    both_streaming = []
    for tab in (first, second):
        _controller(window, tab).streaming_changed.connect(
            lambda _on: both_streaming.append(all(_controller(window, t).is_streaming
                                                  for t in (first, second))))
    window.tabs.setCurrentWidget(first)
    _send(qtbot, first, "What is the capital of France?")
    window.tabs.setCurrentWidget(second)
    _send(qtbot, second, "Name three colors.")
    a = _wait_reply_done(qtbot, window, first)
    b = _wait_reply_done(qtbot, window, second)
    assert any(both_streaming), "the second tab could not start while the first streamed"
    assert a.status == b.status == "complete"
    assert "Paris" in a.content and a.content != b.content


def test_stop_keeps_the_partial_reply_marked_interrupted(make_window, qtbot, run_async):
    window = make_window()
    tab = _chat(window, run_async, SamplingSettings(temperature=0.0, max_tokens=400))
    _send(qtbot, tab, "Write a long story about a dragon.")
    controller = _controller(window, tab)
    qtbot.waitUntil(lambda: controller.reply is not None and len(controller.reply.text) > 20,
                    timeout=60_000)
    qtbot.keyClick(_input(tab), Qt.Key.Key_Escape)
    reply = _wait_reply_done(qtbot, window, tab)
    assert reply.status == "interrupted"
    assert len(reply.content) > 20
    assert window.db.store.current_path(tab.conversation_id)[-1].content == reply.content


def test_switching_the_model_mid_reply_keeps_it_interrupted_and_says_so(make_window, qtbot,
                                                                         run_async):
    window = make_window()
    tab = _chat(window, run_async, SamplingSettings(temperature=0.0, max_tokens=400))
    _send(qtbot, tab, "Write a long story about a dragon.")
    controller = _controller(window, tab)
    qtbot.waitUntil(lambda: controller.reply is not None and len(controller.reply.text) > 20,
                    timeout=60_000)
    old = window.host.backend
    window.models_controller.load_model(None)
    reply = _wait_reply_done(qtbot, window, tab)
    qtbot.waitUntil(lambda: not window.host.is_loading, timeout=60_000)
    assert window.host.backend is not old
    assert reply.status == "interrupted" and len(reply.content) > 20
    assert "model was switched" in tab.notice_text()


def test_regenerate_makes_a_second_branch_and_back_returns_to_the_first(make_window, qtbot,
                                                                        run_async):
    window = make_window()
    sampled = SamplingSettings(temperature=1.0, max_tokens=12, seed=None)
    tab = _chat(window, run_async, sampled)
    _send(qtbot, tab, "Tell me a fun fact.")
    first = _wait_reply_done(qtbot, window, tab)
    qtbot.mouseClick(tab.regenerate_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: _controller(window, tab).path[-1].id != first.id, timeout=30_000)
    second = _wait_reply_done(qtbot, window, tab)
    siblings = window.db.store.siblings(second.id)
    assert [s.id for s in siblings] == [first.id, second.id]
    tab.transcript.branch_requested.emit(second.id, -1)
    qtbot.waitUntil(lambda: _controller(window, tab).path[-1].id == first.id, timeout=10_000)
    assert tab.transcript.message_ids()[-1] == first.id


def test_a_new_window_restores_conversations_and_open_tabs(make_window, qtbot, run_async,
                                                           tmp_path):
    db = tmp_path / "restore.db"
    window = make_window(db)
    a = _chat(window, run_async, title="Alpha")
    _chat(window, run_async, title="Beta")
    _send(qtbot, a, "Hello!")
    _wait_reply_done(qtbot, window, a)
    expected = [t.conversation_id for t in window.chat_tabs.open_tabs()]
    window.tabs.setCurrentWidget(a)
    window.close()
    window.db.close()

    again = make_window(db, load=False)
    run_async(again.restore())
    assert [t.conversation_id for t in again.chat_tabs.open_tabs()] == expected
    assert again.tabs.currentWidget().conversation_id == a.conversation_id
    restored = _controller(again, again.tabs.currentWidget())
    assert [m.role for m in restored.path] == ["user", "assistant"]
    assert "Alpha" in again.sidebar.conversation_titles()


def test_a_bad_model_path_shows_the_loader_error_and_keeps_the_model(make_window, qtbot,
                                                                      tmp_path):
    window = make_window()
    running = window.host.backend
    window.models_controller.load_model(str(tmp_path / "no-such-model"))
    qtbot.waitUntil(lambda: window.findChild(QMessageBox, "modelErrorDialog") is not None,
                    timeout=30_000)
    box = window.findChild(QMessageBox, "modelErrorDialog")
    assert "does not exist" in box.text()
    assert window.host.backend is running and window.host.is_ready


def test_search_finds_a_message_and_opens_its_conversation(make_window, qtbot, run_async):
    window = make_window(load=False)
    store = window.db.store
    target = store.create_conversation(title="Trip planning")
    store.append_user_message(target.id, "Which train goes to Kyoto from Tokyo?")
    run_async(window.restore())
    qtbot.keyClicks(window.sidebar.search_box, "Kyoto")
    qtbot.waitUntil(lambda: window.sidebar.search_result_count() == 1, timeout=5_000)
    item = window.sidebar.results_list.item(0)
    window.sidebar.results_list.itemClicked.emit(item)
    qtbot.waitUntil(lambda: window.tabs.currentWidget().conversation_id == target.id,
                    timeout=5_000)


def test_closing_while_streaming_saves_the_partial_reply(make_window, qtbot, run_async,
                                                         tmp_path):
    db = tmp_path / "close.db"
    window = make_window(db)
    tab = _chat(window, run_async, SamplingSettings(temperature=0.0, max_tokens=400))
    _send(qtbot, tab, "Write a long story about a dragon.")
    controller = _controller(window, tab)
    qtbot.waitUntil(lambda: controller.reply is not None and len(controller.reply.text) > 10,
                    timeout=60_000)
    window.close()
    last = window.db.store.current_path(tab.conversation_id)[-1]
    assert last.role == "assistant" and last.status == "interrupted"
    assert last.content and controller.reply.text.startswith(last.content)


def test_every_automation_name_is_present(make_window):
    from PySide6.QtWidgets import QWidget

    window = make_window(load=False)
    names = ["conversationList", "searchBox", "newChatButton", "chatTabs", "settingsPanel",
             "statusBar", "modelPicker"]
    for name in names:
        assert window.findChild(QWidget, name) is not None, name
    tab = ChatTab(0)
    for name in ["composer", "sendButton", "stopButton", "regenerateButton", "transcript",
                 "contextMeter"]:
        assert tab.findChild(QWidget, name) is not None, name
    tab.deleteLater()


def test_the_settings_panel_edits_the_current_conversation(make_window, qtbot, run_async):
    window = make_window(load=False)
    tab = _chat(window, run_async, SamplingSettings(temperature=0.3, max_tokens=77))
    assert window.settings_panel.settings().max_tokens == 77
    edited = dataclasses.replace(window.settings_panel.settings(), temperature=1.2,
                                 system_prompt="You are terse.")
    window.settings_panel.settings_changed.emit(edited)
    store = window.db.store
    qtbot.waitUntil(lambda: store.get_conversation(tab.conversation_id).sampling.temperature
                    == 1.2, timeout=5_000)
    assert store.get_conversation(tab.conversation_id).system_prompt == "You are terse."


def test_a_long_chat_leaves_out_its_oldest_turns_and_says_so(make_window, qtbot, run_async):
    # A short context: what is left out is the point, the prompt's prefill only costs time.
    window = make_window(max_model_len=512)
    store = window.db.store
    conversation = store.create_conversation(sampling=GREEDY_SHORT)
    filler = "The quick brown fox jumps over the lazy dog. " * 15  # ~150 tokens per turn
    for i in range(8):
        store.append_user_message(conversation.id, f"Note {i}: {filler}")
        reply = store.start_assistant_message(conversation.id)
        store.finish_message(reply.id, "Noted.", "stop")
    tab = run_async(window.chat_tabs.open_conversation(conversation.id))
    _send(qtbot, tab, "What is the capital of France?")
    reply = _wait_reply_done(qtbot, window, tab, timeout=120_000)
    assert reply.status == "complete"
    assert "oldest messages were left out" in tab.notice_text()
    assert len(store.current_path(conversation.id)) == 18  # nothing was deleted


def test_a_search_hit_on_an_older_branch_opens_that_branch(make_window, qtbot, run_async):
    window = make_window(load=False)
    store = window.db.store
    conversation = store.create_conversation(title="Edited")
    original = store.append_user_message(conversation.id, "Tell me about Kyoto temples")
    store.edit_user_message(original.id, "Tell me about Osaka castles")
    run_async(window.restore())
    qtbot.keyClicks(window.sidebar.search_box, "Kyoto")
    qtbot.waitUntil(lambda: window.sidebar.search_result_count() == 1, timeout=5_000)
    window.sidebar.results_list.itemClicked.emit(window.sidebar.results_list.item(0))
    qtbot.waitUntil(lambda: conversation.id in window.controllers and [
        m.id for m in window.controllers[conversation.id].path] == [original.id], timeout=5_000)
    assert original.id in window.controllers[conversation.id].view.transcript.message_ids()
