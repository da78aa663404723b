"""A tab whose reply is still reading a long prompt says how far it is, in the reply's header,
until the text begins."""

from fake_engine import WAIT_MS


def test_the_reply_header_shows_the_prompt_being_read_then_writing(tab, qtbot):
    engine = tab.models.built[None]
    tab.spawn(tab.session.send("A very long paste"))
    qtbot.waitUntil(lambda: bool(engine.requests), timeout=WAIT_MS)
    request_id = engine.requests[-1]
    transcript = tab.view.transcript
    reply_id = tab.session.reply.message.id

    engine.read(request_id, 1200, 3300)
    qtbot.waitUntil(lambda: transcript.activity_text(reply_id)
                    == "reading your message: 1,200 / 3,300 tokens", timeout=WAIT_MS)
    assert "reading your message: 1,200 / 3,300 tokens" in transcript.plain_text()

    engine.say(request_id, "Here")
    qtbot.waitUntil(lambda: transcript.activity_text(reply_id) == "writing…", timeout=WAIT_MS)
    engine.say(request_id, " it is.", "stop")
    qtbot.waitUntil(lambda: not tab.is_streaming, timeout=WAIT_MS)
    assert "reading" not in transcript.plain_text()
    assert transcript.message_text(reply_id) == "Here it is."
