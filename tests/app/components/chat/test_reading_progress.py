"""A long prompt's reading: the reply says how much of the prompt the backend has read until
its text begins."""

from __future__ import annotations

import asyncio

from pagoda.app.backends import PromptProgress
from pagoda.app.components.chat.reply_stream import reading_text
from tests.app.components.fake_backend import WAIT_S


def test_reading_reads_as_tokens_read_of_all():
    assert reading_text(PromptProgress(1200, 3300)) == "reading your message: 1,200 / 3,300 tokens"
    assert reading_text(PromptProgress(5, 9), continuing=True) == "reading the chat: 5 / 9 tokens"


async def test_the_reply_shows_prompt_progress_until_its_first_text(session, backend, view):
    task = session.spawn(session.send("A long paste"))
    request = await backend.next_request()
    reply_id = session.reply.message.id

    await request.read(512, 3300)
    await request.read(1024, 3300)
    assert session.reply.reading == "reading your message: 1,024 / 3,300 tokens"
    await request.say("Sure")
    assert session.reply.reading is None
    await request.finish()
    await asyncio.wait_for(task, WAIT_S)

    assert view.called("show_reading") == [
        (reply_id, "reading your message: 512 / 3,300 tokens"),
        (reply_id, "reading your message: 1,024 / 3,300 tokens"),
        (reply_id, None)]
    assert view.deltas == ["Sure"]
    assert session.path[-1].content == "Sure"


async def test_a_reply_stopped_while_reading_is_kept_empty_and_stopped(session, backend):
    task = session.spawn(session.send("A long paste"))
    request = await backend.next_request()
    await request.read(512, 3300)

    session.stop()
    request.end_with_abort()
    await asyncio.wait_for(task, WAIT_S)

    reply = (await session.db.current_path(session.conversation_id))[-1]
    assert reply.content == "" and reply.status == "interrupted"


async def test_continuing_a_reply_reads_the_chat(session, backend, view):
    task = session.spawn(session.send("Write a poem"))
    request = await backend.next_request()
    await request.say("Roses are red,", "length", num_output_tokens=4)
    await asyncio.wait_for(task, WAIT_S)

    task = session.spawn(session.continue_reply(session.path[-1].id))
    request = await backend.next_request()
    await request.read(40, 60)
    await request.say(" violets are blue.", "stop")
    await asyncio.wait_for(task, WAIT_S)

    assert [text for _id, text in view.called("show_reading")] == [
        "reading the chat: 40 / 60 tokens", None]


async def test_the_meter_shows_the_prompt_being_read_before_the_reply_ends(session, backend,
                                                                           view):
    paste = "word " * 300
    task = session.spawn(session.send(paste))
    request = await backend.next_request()
    await request.read(100, 301)

    used, max_model_len, _max_tokens = view.called("show_context_usage")[-1][:3]
    assert used == 300 and max_model_len == backend.max_model_len
    await request.finish()
    await asyncio.wait_for(task, WAIT_S)
