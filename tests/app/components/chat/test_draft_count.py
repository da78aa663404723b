"""The message being typed counts in the context meter, so an over-long paste is flagged before
it is sent; counts that come back out of order never show an older figure."""

from __future__ import annotations

import asyncio

from tests.app.components.fake_backend import WAIT_S


async def test_the_draft_counts_in_the_context_meter_and_not_once_sent(session, backend):
    await session.count_draft("one two three four")
    assert session.context_usage[0] == 4
    assert backend.counted[-1][-1].content == "one two three four"

    task = session.spawn(session.send("one two three four"))
    request = await backend.next_request()
    await request.finish()
    await asyncio.wait_for(task, WAIT_S)
    await session.count_draft("")
    assert session.draft == ""
    assert session.context_usage[0] == 4  # the sent message, counted once; no draft


async def test_a_draft_too_long_for_the_context_fills_the_meter_before_sending(session, backend):
    backend.max_model_len = 100
    await session.count_draft("word " * 90)
    used, context, max_tokens = session.context_usage
    assert used == 90 and context == 100 and used + max_tokens > context


async def test_an_older_count_that_returns_late_is_dropped(session, backend):
    gate = backend.hold_next_count()
    slow = asyncio.ensure_future(session.count_draft("a b c d e f"))
    await gate.wait_entered()
    await session.count_draft("a b")
    gate.release()
    await asyncio.wait_for(slow, WAIT_S)
    assert session.context_usage[0] == 2
