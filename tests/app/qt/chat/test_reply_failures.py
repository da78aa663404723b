"""How a tab ends a reply through the backend seam: a finished one keeps the backend's counts
and timings, a failure shows the backend's words, and what arrived before it is kept."""

from fake_engine import WAIT_MS

from pagoda.app.store import GenerationStats


def _start_reply(tab, qtbot, text="Tell me a story"):
    """Send `text`; the fake engine's request id once the reply streams."""
    engine = tab.models.built[None]
    tab.spawn(tab.session.send(text))
    qtbot.waitUntil(lambda: bool(engine.requests), timeout=WAIT_MS)
    return engine, engine.requests[-1]


def _reply(tab):
    return tab.db.store.current_path(tab.conversation_id)[-1]


def test_a_finished_reply_keeps_the_backends_counts_and_timings(tab, qtbot):
    engine, request_id = _start_reply(tab, qtbot)
    engine.say(request_id, "Once upon a time", "stop")
    qtbot.waitUntil(lambda: not tab.is_streaming, timeout=WAIT_MS)
    reply = _reply(tab)
    assert reply.status == "complete" and reply.content == "Once upon a time"
    assert reply.prompt_tokens == 3 and reply.completion_tokens == 4
    assert reply.stats == GenerationStats(model="first", ttft_s=0.0, tokens_per_s=3.0,
                                          cached_tokens=0)


def test_a_reply_the_backend_fails_midway_is_kept_interrupted_and_the_reason_shown(tab, qtbot):
    engine, request_id = _start_reply(tab, qtbot)
    engine.say(request_id, "Once upon")
    qtbot.waitUntil(lambda: tab.reply is not None and tab.reply.text == "Once upon",
                    timeout=WAIT_MS)
    engine.say(request_id, "", "error", error="the device ran out of memory")
    qtbot.waitUntil(lambda: not tab.is_streaming, timeout=WAIT_MS)
    reply = _reply(tab)
    assert reply.status == "interrupted" and reply.content == "Once upon"
    assert "the device ran out of memory" in tab.view.notice_text()
    assert "model was switched" not in tab.view.notice_text()


def test_a_reply_the_backend_fails_before_any_text_is_an_error_with_the_reason(tab, qtbot):
    engine, request_id = _start_reply(tab, qtbot)
    engine.say(request_id, "", "error", error="the device ran out of memory")
    qtbot.waitUntil(lambda: not tab.is_streaming, timeout=WAIT_MS)
    reply = _reply(tab)
    assert reply.status == "error" and "the device ran out of memory" in reply.error
    assert "the device ran out of memory" in tab.view.notice_text()


def test_stop_keeps_the_reply_so_far_without_a_notice(tab, qtbot):
    engine, request_id = _start_reply(tab, qtbot)
    engine.say(request_id, "Once upon")
    qtbot.waitUntil(lambda: tab.reply is not None and tab.reply.text == "Once upon",
                    timeout=WAIT_MS)
    tab.stop()
    qtbot.waitUntil(lambda: not tab.is_streaming, timeout=WAIT_MS)
    reply = _reply(tab)
    assert reply.status == "interrupted" and reply.content == "Once upon"
    assert tab.view.notice_text() == ""
