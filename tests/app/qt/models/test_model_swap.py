"""Switching models while tabs generate: no tab is handed the engine being shut down, and a reply
on that engine ends (kept, and said so) instead of hanging. Over a fake engine the test drives,
behind the host's LocalBackend."""

import asyncio

import pytest
from fake_engine import WAIT_MS

from pagoda.app.qt.models.engine_host import ModelLoadingError


def _gate_assistant_start(controller) -> asyncio.Event:
    """Hold the tab just after its user message is saved, before its reply starts."""
    go = asyncio.Event()
    start = controller.db.start_assistant_message

    async def held(*args, **kwargs):
        await go.wait()
        return await start(*args, **kwargs)

    controller.db.start_assistant_message = held
    return go


def _wait_streaming_on(qtbot, engine):
    qtbot.waitUntil(lambda: bool(engine.requests), timeout=WAIT_MS)
    return engine.requests[-1]


def _last(controller):
    """The newest message of the tab's branch, as stored."""
    path = controller.db.store.current_path(controller.conversation_id)
    return path[-1] if path else None


def test_a_reply_held_up_while_the_model_switched_streams_on_the_new_model(tab, qtbot):
    first = tab.models.built[None]
    go = _gate_assistant_start(tab)
    tab.spawn(tab.session.send("Hello"))
    qtbot.waitUntil(lambda: _last(tab) is not None and _last(tab).role == "user",
                    timeout=WAIT_MS)
    qtbot.waitUntil(tab.session.source.load("second").done, timeout=WAIT_MS)
    go.set()
    second = tab.models.built["second"]
    request_id = _wait_streaming_on(qtbot, second)
    second.say(request_id, "Hi there", "stop")
    qtbot.waitUntil(lambda: not tab.is_streaming, timeout=WAIT_MS)
    assert first.requests == []
    assert _last(tab).status == "complete" and _last(tab).content == "Hi there"


def test_a_reply_due_to_start_while_a_model_loads_is_refused_and_kept(tab, qtbot):
    first = tab.models.built[None]
    go = _gate_assistant_start(tab)
    tab.spawn(tab.session.send("Hello"))
    qtbot.waitUntil(lambda: _last(tab) is not None and _last(tab).role == "user",
                    timeout=WAIT_MS)
    tab.models.gate.clear()
    loading = tab.session.source.load("second")
    go.set()
    qtbot.waitUntil(lambda: _last(tab).role == "assistant" and _last(tab).status != "streaming",
                    timeout=WAIT_MS)
    tab.models.gate.set()
    qtbot.waitUntil(loading.done, timeout=WAIT_MS)
    assert first.requests == [] and tab.models.built["second"].requests == []
    reply = _last(tab)
    assert reply.status == "error" and "model is loading" in reply.error
    assert "model is loading" in tab.view.notice_text()
    assert [m.content for m in tab.path[:-1]] == ["Hello"]


def test_a_reply_streaming_when_the_model_switches_ends_interrupted_and_says_so(tab, qtbot):
    first = tab.models.built[None]
    tab.spawn(tab.session.send("Tell me a story"))
    request_id = _wait_streaming_on(qtbot, first)
    first.say(request_id, "Once upon")
    qtbot.waitUntil(lambda: tab.reply is not None and tab.reply.text == "Once upon",
                    timeout=WAIT_MS)
    qtbot.waitUntil(tab.session.source.load("second").done, timeout=WAIT_MS)
    qtbot.waitUntil(lambda: not tab.is_streaming, timeout=WAIT_MS)
    reply = _last(tab)
    assert reply.status == "interrupted" and reply.content == "Once upon"
    assert "model was switched" in tab.view.notice_text()
    assert not tab.view.composer._streaming


def test_no_engine_is_handed_out_while_a_model_loads_or_the_old_one_shuts_down(tab, qtbot):
    host, first = tab.session.source, tab.models.built[None]
    assert host.backend_for_new_request().engine is first
    tab.models.gate.clear()
    first.release_shutdown.clear()
    loading = host.load("second")
    with pytest.raises(ModelLoadingError, match="model is loading"):
        host.backend_for_new_request()
    tab.models.gate.set()
    qtbot.waitUntil(first.shutdown_started.is_set, timeout=WAIT_MS)
    with pytest.raises(ModelLoadingError, match="model is loading"):
        host.backend_for_new_request()
    first.release_shutdown.set()
    qtbot.waitUntil(loading.done, timeout=WAIT_MS)
    assert host.backend_for_new_request().engine is tab.models.built["second"]


def test_a_reply_tokenizes_its_chat_once(tab, qtbot):
    first = tab.models.built[None]
    tab.spawn(tab.session.send("Hello"))
    request_id = _wait_streaming_on(qtbot, first)
    assert first.tokenizer.gate.calls == 1  # counted to fit it; the stream reuses the tokens
    first.say(request_id, "Hi there", "stop")
    qtbot.waitUntil(lambda: not tab.is_streaming, timeout=WAIT_MS)
    assert _last(tab).status == "complete"


def test_a_reply_whose_chat_was_being_tokenized_when_the_model_switched_is_kept_and_says_so(
        tab, qtbot, monkeypatch):
    # With no counted chat kept, the stream tokenizes the chat again: the second call.
    monkeypatch.setattr("pagoda.app.backends.chat.local.ENCODED_CHATS_KEPT", 0)
    first = tab.models.built[None]
    first.tokenizer.gate.hold_call = 2  # the chat is counted to fit it, then tokenized to send
    tab.spawn(tab.session.send("Hello"))
    qtbot.waitUntil(first.tokenizer.gate.holding.is_set, timeout=WAIT_MS)
    qtbot.waitUntil(tab.session.source.load("second").done, timeout=WAIT_MS)
    qtbot.waitUntil(lambda: not tab.is_streaming, timeout=WAIT_MS)
    assert first.requests == [] and tab.models.built["second"].requests == []
    assert _last(tab).status == "interrupted"
    assert "model was switched" in tab.view.notice_text()
