"""A chat whose model thinks aloud and calls tools, without a window: reasoning kept apart from
the answer, the tool loop (ask, run, deny, always, failure, stop, the most calls a turn may
make), what the model is given next, and a restart showing it all again."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from pagoda.app.components.chat.chat_session import ChatSession
from pagoda.app.components.chat.tool_turns import DENIED, STOPPED
from tests.app.components.fake_backend import WAIT_S, eventually
from tests.app.components.fake_tools import FakeTools, answer, call


@pytest.fixture
def tools() -> FakeTools:
    return FakeTools()


@pytest.fixture
def tool_chat(store, db, source, view, tools):
    """`await tool_chat()`: an opened session on a new chat that turned the fake server on."""

    async def open_session(max_calls: int | None = None) -> ChatSession:
        if max_calls is not None:
            tools.max_calls_per_turn = max_calls
        cid = store.create_conversation().id
        session = ChatSession(cid, db, source, view, tools=tools)
        await session.open()
        await session.save_settings(replace(session.settings, tools=("fake",)))
        return session

    return open_session


async def branch(session: ChatSession) -> list[tuple[str, str]]:
    path = await session.db.current_path(session.conversation_id)
    return [(m.role, m.content) for m in path]


async def call_state(session: ChatSession, call_id: str, state: str) -> None:
    def shown() -> bool:
        return any(c.id == call_id and c.state == state for v in session.views
                   for c in v.tool_calls)
    await eventually(shown, f"call {call_id} {state}")


# -- thinking ----------------------------------------------------------------------------------


async def test_reasoning_streams_apart_from_the_answer_and_is_stored_with_its_time(session,
                                                                                   backend, view):
    task = session.spawn(session.send("2 + 3?"))
    request = await backend.next_request()
    await request.think("Two plus")
    await request.think(" three.")
    await request.say("It is 5.", "stop")
    await asyncio.wait_for(task, WAIT_S)

    assert [d for _mid, d in view.called("append_reasoning")] == ["Two plus", " three."]
    assert view.deltas == ["It is 5."]
    reply = (await session.db.current_path(session.conversation_id))[-1]
    assert (reply.reasoning, reply.content) == ("Two plus three.", "It is 5.")
    assert reply.reasoning_s is not None and reply.reasoning_s >= 0
    (ended,) = view.called("end_stream")
    assert (ended[0].reasoning, ended[0].content) == ("Two plus three.", "It is 5.")


async def test_the_next_turn_hands_the_reasoning_to_the_template_beside_the_answer(session,
                                                                                   backend):
    task = session.spawn(session.send("2 + 3?"))
    request = await backend.next_request()
    await request.think("Add them.")
    await request.say("5", "stop")
    await asyncio.wait_for(task, WAIT_S)
    task = session.spawn(session.send("and 4 + 4?"))
    second = await backend.next_request()
    assistant = second.messages[1]
    assert (assistant.content, assistant.reasoning) == ("5", "Add them.")
    assert "reasoning_content" not in assistant.as_dict()  # servers get the answer alone
    await second.finish()
    await asyncio.wait_for(task, WAIT_S)


async def test_a_reply_cut_while_thinking_is_kept_with_its_reasoning(session, backend):
    task = session.spawn(session.send("think hard"))
    request = await backend.next_request()
    await request.think("Hmm")
    session.stop()
    await asyncio.wait_for(task, WAIT_S)
    reply = (await session.db.current_path(session.conversation_id))[-1]
    assert (reply.status, reply.finish_reason, reply.reasoning) == ("interrupted", "stopped", "Hmm")


async def test_the_thinking_switch_reaches_only_a_model_that_has_one(session, backend):
    await session.save_settings(replace(session.settings, enable_thinking=False))
    task = session.spawn(session.send("hi"))
    request = await backend.next_request()
    assert request.options.enable_thinking is None  # this model's template has no switch
    await request.finish()
    await asyncio.wait_for(task, WAIT_S)

    backend.thinking_switch = True
    task = session.spawn(session.send("again"))
    request = await backend.next_request()
    assert request.options.enable_thinking is False
    await request.finish()
    await asyncio.wait_for(task, WAIT_S)


# -- the tool loop -----------------------------------------------------------------------------


async def test_a_call_waits_for_run_then_its_result_goes_back_to_the_model(tool_chat, backend,
                                                                           tools, view):
    session = await tool_chat()
    task = session.spawn(session.send("What is 2 + 3?"))
    first = await backend.next_request()
    assert [spec.name for spec in first.options.tools] == ["add", "hang", "broken"]
    await first.call_tools(call("add", '{"a": 2, "b": 3}'))
    await call_state(session, "call_add", "asking")
    assert tools.calls == [] and session.is_streaming

    answer(session, "call_add", "run")
    second = await backend.next_request()
    assert tools.calls == [("add", '{"a": 2, "b": 3}')]
    assistant, result = second.messages[-2:]
    assert [c.name for c in assistant.tool_calls] == ["add"]
    assert (result.role, result.content, result.tool_call_id) == ("tool", "5", "call_add")
    await second.say("2 + 3 = 5.", "stop")
    await asyncio.wait_for(task, WAIT_S)

    assert await branch(session) == [("user", "What is 2 + 3?"), ("assistant", ""),
                                     ("tool", "5"), ("assistant", "2 + 3 = 5.")]
    assert [c.state for c in session.views[1].tool_calls] == ["done"]
    assert [s for (s,) in view.called("show_streaming")][-1] is False
    assert not session.is_streaming and session.can_regenerate


async def test_a_call_reusing_an_earlier_turns_id_asks_runs_and_goes_back_to_the_model(
        tool_chat, backend, tools):
    session = await tool_chat()
    task = session.spawn(session.send("What is 2 + 3?"))
    await (await backend.next_request()).call_tools(call("add", '{"a": 2, "b": 3}', "call_1"))
    await call_state(session, "call_1", "asking")
    answer(session, "call_1", "run")
    await (await backend.next_request()).say("5.", "stop")
    await asyncio.wait_for(task, WAIT_S)

    task = session.spawn(session.send("And 4 + 4?"))
    await (await backend.next_request()).call_tools(call("add", '{"a": 4, "b": 4}', "call_1"))
    await call_state(session, "call_1", "asking")  # not shown done by the first turn's result
    answer(session, "call_1", "run")
    last = await backend.next_request()
    assert tools.calls == [("add", '{"a": 2, "b": 3}'), ("add", '{"a": 4, "b": 4}')]
    assert [(m.role, m.content) for m in last.messages if m.role == "tool"] == [
        ("tool", "5"), ("tool", "8")]
    await last.say("8.", "stop")
    await asyncio.wait_for(task, WAIT_S)
    assert not session.is_streaming
    assert [[c.state for c in v.tool_calls] for v in session.views if v.tool_calls] == [
        ["done"], ["done"]]


async def test_two_calls_of_one_reply_sharing_an_id_are_each_asked(tool_chat, backend, tools):
    session = await tool_chat()
    task = session.spawn(session.send("add two pairs"))
    await (await backend.next_request()).call_tools(call("add", '{"a": 1, "b": 2}', "c"),
                                                    call("add", '{"a": 3, "b": 4}', "c"))
    await call_state(session, "c", "asking")
    answer(session, "c", "run")
    await eventually(lambda: [c.state for c in session.views[1].tool_calls] == ["done", "asking"],
                     "the second call's question")
    answer(session, "c", "run")
    last = await backend.next_request()
    assert [m.content for m in last.messages if m.role == "tool"] == ["3", "7"]
    await last.say("3 and 7.", "stop")
    await asyncio.wait_for(task, WAIT_S)


async def test_a_stopped_call_reusing_an_answered_id_is_left_out_of_the_next_prompt(
        tool_chat, backend):
    session = await tool_chat()
    task = session.spawn(session.send("add"))
    await (await backend.next_request()).call_tools(call("add", '{"a": 1, "b": 1}', "call_1"))
    await call_state(session, "call_1", "asking")
    answer(session, "call_1", "run")
    await (await backend.next_request()).call_tools(call("add", '{"a": 2, "b": 2}', "call_1"))
    await eventually(lambda: [c.state for v in session.views for c in v.tool_calls]
                     == ["done", "asking"], "the second call's question")
    session.stop()
    await asyncio.wait_for(task, WAIT_S)

    task = session.spawn(session.send("never mind"))
    request = await backend.next_request()
    assert [len(m.tool_calls) for m in request.messages if m.role == "assistant"] == [1]
    await request.finish()
    await asyncio.wait_for(task, WAIT_S)


async def test_a_denied_call_never_runs_and_the_model_is_told(tool_chat, backend, tools):
    session = await tool_chat()
    task = session.spawn(session.send("add"))
    first = await backend.next_request()
    await first.call_tools(call("add", '{"a": 1, "b": 1}'))
    await call_state(session, "call_add", "asking")
    answer(session, "call_add", "deny")
    second = await backend.next_request()
    assert second.messages[-1].content == DENIED
    await second.say("I could not add them.", "stop")
    await asyncio.wait_for(task, WAIT_S)
    assert tools.calls == []
    assert [c.state for c in session.views[1].tool_calls] == ["denied"]


async def test_always_runs_that_tool_without_asking_again(tool_chat, backend, tools, view):
    session = await tool_chat()
    task = session.spawn(session.send("add twice"))
    first = await backend.next_request()
    await first.call_tools(call("add", '{"a": 1, "b": 2}', "c1"))
    await call_state(session, "c1", "asking")
    answer(session, "c1", "always")
    second = await backend.next_request()
    await second.call_tools(call("add", '{"a": 3, "b": 4}', "c2"))
    third = await backend.next_request()
    await third.say("3 and 7.", "stop")
    await asyncio.wait_for(task, WAIT_S)
    assert tools.calls == [("add", '{"a": 1, "b": 2}'), ("add", '{"a": 3, "b": 4}')]
    asked = {c.id for (v,) in view.called("update_message") for c in v.tool_calls
             if c.state == "asking"}
    assert asked == {"c1"}


async def test_a_failing_server_is_shown_in_words_and_the_model_told(tool_chat, backend):
    session = await tool_chat()
    task = session.spawn(session.send("break it"))
    first = await backend.next_request()
    await first.call_tools(call("broken"))
    await call_state(session, "call_broken", "asking")
    answer(session, "call_broken", "run")
    second = await backend.next_request()
    assert second.messages[-1].content == "fake: the server exited (code 1)"
    await second.say("The tool failed.", "stop")
    await asyncio.wait_for(task, WAIT_S)
    tool_message = (await session.db.current_path(session.conversation_id))[2]
    assert (tool_message.finish_reason, tool_message.tool_name) == ("failed", "broken")


async def test_stop_while_asking_ends_the_turn_without_running_the_call(tool_chat, backend,
                                                                        tools):
    session = await tool_chat()
    task = session.spawn(session.send("add"))
    first = await backend.next_request()
    await first.call_tools(call("add", '{"a": 1, "b": 1}'))
    await call_state(session, "call_add", "asking")
    session.stop()
    await asyncio.wait_for(task, WAIT_S)
    assert tools.calls == [] and not session.is_streaming
    assert [c.state for c in session.views[-1].tool_calls] == ["not run"]

    task = session.spawn(session.send("never mind, hello"))
    request = await backend.next_request()
    assert [(m.role, m.content) for m in request.messages] == [
        ("user", "add"), ("user", "never mind, hello")]  # the unanswered call is left out
    await request.finish()
    await asyncio.wait_for(task, WAIT_S)


async def test_stop_while_a_tool_runs_cancels_it_and_keeps_why(tool_chat, backend, tools):
    session = await tool_chat()
    task = session.spawn(session.send("wait"))
    first = await backend.next_request()
    await first.call_tools(call("hang"))
    await call_state(session, "call_hang", "asking")
    answer(session, "call_hang", "run")
    await call_state(session, "call_hang", "running")
    await eventually(lambda: tools.calls, "the call")
    session.stop()
    await asyncio.wait_for(task, WAIT_S)
    assert tools.cancelled == ["hang"]
    assert (await branch(session))[-1] == ("tool", STOPPED)
    assert len(backend.requests) == 1 and not session.is_streaming


async def test_a_turn_stops_calling_at_its_limit_and_the_model_answers_without_tools(
        tool_chat, backend, tools):
    session = await tool_chat(max_calls=1)
    task = session.spawn(session.send("add two pairs"))
    first = await backend.next_request()
    await first.call_tools(call("add", '{"a": 1, "b": 2}', "c1"),
                           call("add", '{"a": 3, "b": 4}', "c2"))
    await call_state(session, "c1", "asking")
    answer(session, "c1", "run")
    second = await backend.next_request()
    assert second.options.tools == ()
    assert "most tool calls a turn may (1)" in second.messages[-1].content
    await second.say("3, and I may not add more.", "stop")
    await asyncio.wait_for(task, WAIT_S)
    assert tools.calls == [("add", '{"a": 1, "b": 2}')]


async def test_a_chat_without_tools_turned_on_offers_none(session, backend, tools):
    session.tools = tools
    task = session.spawn(session.send("hi"))
    request = await backend.next_request()
    assert request.options.tools == () and tools.asked_specs == []
    await request.finish()
    await asyncio.wait_for(task, WAIT_S)


async def test_regenerate_runs_the_turn_again_from_the_users_message(tool_chat, backend):
    session = await tool_chat()
    task = session.spawn(session.send("What is 2 + 3?"))
    first = await backend.next_request()
    await first.call_tools(call("add", '{"a": 2, "b": 3}'))
    await call_state(session, "call_add", "asking")
    answer(session, "call_add", "run")
    await (await backend.next_request()).say("5.", "stop")
    await asyncio.wait_for(task, WAIT_S)
    user_id = session.path[0].id

    task = session.spawn(session.regenerate(session.path[-1].id))
    again = await backend.next_request()
    assert [(m.role, m.content) for m in again.messages] == [("user", "What is 2 + 3?")]
    await again.say("Five.", "stop")
    await asyncio.wait_for(task, WAIT_S)
    assert session.path[1].parent_id == user_id
    assert (session.views[1].sibling_index, session.views[1].sibling_count) == (1, 2)


async def test_calls_and_results_are_shown_again_after_a_restart(tool_chat, backend, db, source,
                                                                 tools):
    session = await tool_chat()
    task = session.spawn(session.send("What is 2 + 3?"))
    first = await backend.next_request()
    await first.think("Use the tool.")
    await first.call_tools(call("add", '{"a": 2, "b": 3}'))
    await call_state(session, "call_add", "asking")
    answer(session, "call_add", "run")
    await (await backend.next_request()).say("5.", "stop")
    await asyncio.wait_for(task, WAIT_S)
    session.close()

    reopened = ChatSession(session.conversation_id, db, source, tools=tools)
    await reopened.open()
    roles = [(v.role, v.tool_name) for v in reopened.views]
    assert roles == [("user", None), ("assistant", None), ("tool", "add"), ("assistant", None)]
    caller = reopened.views[1]
    assert caller.reasoning == "Use the tool."
    assert [(c.name, c.arguments, c.state, c.server) for c in caller.tool_calls] == [
        ("add", '{"a": 2, "b": 3}', "done", "fake")]
    assert (reopened.views[2].content, reopened.views[2].finish_reason) == ("5", "done")


async def test_the_tools_count_in_the_prompt_the_context_is_fitted_to(tool_chat, backend, view):
    session = await tool_chat()
    task = session.spawn(session.send("hi there"))
    request = await backend.next_request()
    await request.finish()
    await asyncio.wait_for(task, WAIT_S)
    # "hi there" (2) + add (1 + 3 words) + hang (1 + 2) + broken (1 + 4) = 14
    assert 14 in [used for used, *_rest in view.called("show_context_usage")]
    await session.refresh_context_meter()
    assert session.context_usage[0] == 14  # the meter counts them too, without a server start
