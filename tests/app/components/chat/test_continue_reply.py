"""Continue: a reply cut at its max tokens, or stopped, goes on where it stopped, in the same
message, on the same branch."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from pagoda.app.backends import ChatMessage
from tests.app.components.fake_backend import WAIT_S


async def _cut_reply(session, backend):
    task = session.spawn(session.send("Write a poem"))
    request = await backend.next_request()
    await request.say("Roses are red,", "length", num_output_tokens=4)
    await asyncio.wait_for(task, WAIT_S)
    return session.path[-1]


async def test_continue_grows_the_same_reply_from_where_it_stopped(session, backend):
    cut = await _cut_reply(session, backend)

    task = session.spawn(session.continue_reply(cut.id))
    request = await backend.next_request()
    assert request.continues
    assert request.messages[-1] == ChatMessage("assistant", "Roses are red,")
    await request.say(" violets are blue.", "stop", num_output_tokens=5)
    await asyncio.wait_for(task, WAIT_S)

    path = await session.db.current_path(session.conversation_id)
    assert [(m.role, m.content) for m in path] == [
        ("user", "Write a poem"), ("assistant", "Roses are red, violets are blue.")]
    reply = path[-1]
    assert (reply.id, reply.status, reply.finish_reason, reply.completion_tokens) == (
        cut.id, "complete", "stop", 9)
    assert len(await session.db.siblings(reply.id)) == 1  # one branch


async def test_only_a_reply_cut_at_max_tokens_can_be_continued(session, backend):
    task = session.spawn(session.send("Hi"))
    request = await backend.next_request()
    await request.finish()
    await asyncio.wait_for(task, WAIT_S)

    await session.continue_reply(session.path[-1].id)
    assert len(backend.requests) == 1


async def test_a_failed_continuation_keeps_what_was_there(session, backend):
    from pagoda.app.backends import ServerError

    cut = await _cut_reply(session, backend)
    backend.fail_next_stream(ServerError("The server answered 500."))
    await session.continue_reply(cut.id)

    reply = (await session.db.current_path(session.conversation_id))[-1]
    assert reply.content == "Roses are red," and reply.status == "interrupted"
    assert "500" in session.notice[0]


async def test_a_stopped_reply_goes_on_where_it_was_stopped(session, backend):
    task = session.spawn(session.send("Write a poem"))
    request = await backend.next_request()
    await request.say("Roses are")
    session.stop()
    await asyncio.wait_for(task, WAIT_S)
    stopped = session.views[-1]
    assert (stopped.status, stopped.finish_reason, stopped.can_continue) == (
        "interrupted", "stopped", True)

    task = session.spawn(session.continue_reply(stopped.id))
    request = await backend.next_request()
    assert request.continues and request.messages[-1] == ChatMessage("assistant", "Roses are")
    await request.say(" red.", "stop")
    await asyncio.wait_for(task, WAIT_S)
    reply = (await session.db.current_path(session.conversation_id))[-1]
    assert (reply.id, reply.content, reply.status) == (stopped.id, "Roses are red.", "complete")


async def test_a_reply_stopped_before_it_wrote_offers_regenerate_not_continue(session, backend):
    task = session.spawn(session.send("Write a poem"))
    await backend.next_request()
    session.stop()
    await asyncio.wait_for(task, WAIT_S)
    assert not session.views[-1].can_continue and session.can_regenerate

    await session.continue_reply(session.views[-1].id)
    assert len(backend.requests) == 1 and "can be continued" in session.notice[0]


async def test_a_continued_reply_knows_the_chats_max_tokens_apart_from_its_length(session,
                                                                                 backend):
    await session.save_settings(replace(session.settings, max_tokens=16))
    task = session.spawn(session.send("Write a poem"))
    await (await backend.next_request()).say("Roses are red,", "length", num_output_tokens=16)
    await asyncio.wait_for(task, WAIT_S)

    task = session.spawn(session.continue_reply(session.views[-1].id))
    await (await backend.next_request()).say(" violets", "length", num_output_tokens=16)
    await asyncio.wait_for(task, WAIT_S)
    cut = session.views[-1]
    assert (cut.completion_tokens, cut.max_tokens, cut.can_continue) == (32, 16, True)
    await session.save_settings(replace(session.settings, max_tokens=64))
    assert session.views[-1].max_tokens == 64
