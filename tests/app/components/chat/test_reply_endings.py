"""How a reply ended, as stored and as the tab shows it: stopped by the user (with its figures),
interrupted by something else, or cut at the chat's max tokens."""

from __future__ import annotations

import asyncio

from tests.app.components.fake_backend import WAIT_S


async def _reply(session):
    return (await session.db.current_path(session.conversation_id))[-1]


async def test_a_reply_the_user_stopped_is_kept_as_stopped_with_its_figures(session, backend,
                                                                            monkeypatch):
    monkeypatch.setattr(backend, "abort", lambda request_id: backend.aborted.append(request_id))
    task = session.spawn(session.send("Count to ten"))
    request = await backend.next_request()
    await request.say("One, two")

    session.stop()
    await request.say("", "abort", num_prompt_tokens=4, num_output_tokens=2,
                      time_to_first_token=0.25, tokens_per_s=8.0)
    await asyncio.wait_for(task, WAIT_S)

    reply = await _reply(session)
    assert (reply.status, reply.finish_reason, reply.completion_tokens) == (
        "interrupted", "stopped", 2)
    assert reply.stats.ttft_s == 0.25 and reply.stats.tokens_per_s == 8.0
    assert session.views[-1].finish_reason == "stopped" and "8.0 tok/s" in session.views[-1].stats_text


async def test_a_reply_cut_by_closing_the_chat_is_interrupted_not_stopped(session, backend):
    task = session.spawn(session.send("Hi"))
    request = await backend.next_request()
    await request.say("Half")

    session.close()
    await asyncio.wait_for(task, WAIT_S)
    session.db.drain()

    reply = await _reply(session)
    assert (reply.status, reply.finish_reason) == ("interrupted", None)


async def test_a_reply_cut_at_max_tokens_says_so(session, backend):
    task = session.spawn(session.send("Tell me everything"))
    request = await backend.next_request()
    await request.say("Everything is", "length", num_output_tokens=2)
    await asyncio.wait_for(task, WAIT_S)

    view = session.views[-1]
    assert (view.status, view.finish_reason, view.completion_tokens) == ("complete", "length", 2)
