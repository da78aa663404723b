"""ChatSession without a window: what a user would see in a chat tab and find in the store,
driven through a scripted backend over a real ConversationStore."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from pagoda.app.backends import ServerError
from pagoda.app.components.chat.chat_session import WAIT_TO_SWITCH, ChatSession
from pagoda.app.components.chat.reply_stream import MODEL_SWITCHED
from pagoda.app.components.shared.view_models import SamplingView
from pagoda.app.store import GenerationStats
from tests.app.components.fake_backend import (
    LOADING,
    NO_MODEL,
    WAIT_S,
    FakeSource,
    ScriptedBackend,
    eventually,
)

REPO = Path(__file__).resolve().parents[4]
HISTORY = [("user", "What is a pagoda?"), ("assistant", "A tiered tower."),
           ("user", "Where are they found?"), ("assistant", "Mostly in Asia.")]


async def finished(task: asyncio.Task) -> None:
    await asyncio.wait_for(task, WAIT_S)


async def stored_branch(session: ChatSession) -> list[tuple[str, str, str]]:
    path = await session.db.current_path(session.conversation_id)
    return [(m.role, m.content, m.status) for m in path]


async def stored_reply(session: ChatSession):
    return (await session.db.current_path(session.conversation_id))[-1]


async def chat_turn(session: ChatSession, backend: ScriptedBackend, text: str,
                    reply: str) -> None:
    """The user sends `text` and the model answers `reply` in full."""
    task = session.spawn(session.send(text))
    request = await backend.next_request()
    await request.say(reply, "stop")
    await finished(task)


# -- sending ---------------------------------------------------------------------------------------


async def test_send_stores_the_message_and_the_complete_reply_with_its_stats(session, backend):
    task = session.spawn(session.send("Hello there"))
    request = await backend.next_request()
    await request.say("Hi")
    await request.say(" you", "stop", num_prompt_tokens=7, num_cached_tokens=3,
                      num_output_tokens=2, time_to_first_token=0.25, tokens_per_s=40.0)
    await finished(task)

    user, reply = await session.db.current_path(session.conversation_id)
    assert (user.role, user.content, user.status) == ("user", "Hello there", "complete")
    assert (reply.role, reply.content, reply.status) == ("assistant", "Hi you", "complete")
    assert reply.finish_reason == "stop"
    assert (reply.prompt_tokens, reply.completion_tokens) == (7, 2)
    assert reply.stats == GenerationStats(model="fake-model", ttft_s=0.25, tokens_per_s=40.0,
                                          cached_tokens=3)
    assert "40.0 tok/s" in session.views[-1].stats_text


async def test_deltas_reach_the_view_in_order_between_begin_and_end_of_stream(session, backend,
                                                                               view):
    task = session.spawn(session.send("Tell me a story"))
    request = await backend.next_request()
    for delta in ["Once", " upon", " a", " time"]:
        await request.say(delta)
    await request.finish()
    await finished(task)

    reply_id = session.views[-1].id
    assert view.deltas == ["Once", " upon", " a", " time"]
    assert {mid for mid, _delta in view.called("append_delta")} == {reply_id}
    names = [name for name, _args in view.calls]
    first_delta, last_delta = names.index("append_delta"), len(names) - 1 - names[::-1].index(
        "append_delta")
    assert names.index("begin_stream") < first_delta
    assert names.index("end_stream") > last_delta
    (ended,) = view.called("end_stream")
    assert (ended[0].id, ended[0].content, ended[0].status) == (reply_id, "Once upon a time",
                                                                "complete")


async def test_is_streaming_while_the_reply_is_written_and_not_after(session, backend, view):
    changes = []
    session.on_streaming_changed = changes.append
    task = session.spawn(session.send("Hi"))
    request = await backend.next_request()
    await request.say("Hel")
    assert session.is_streaming
    assert not session.can_regenerate

    await request.say("lo", "stop")
    await finished(task)
    assert not session.is_streaming
    assert session.can_regenerate
    assert changes == [True, False]
    assert [s for (s,) in view.called("show_streaming")] == [True, False]
    assert view.called("show_can_regenerate")[-1] == (True,)


async def test_the_first_token_is_on_disk_before_the_reply_ends(session, backend):
    task = session.spawn(session.send("Hi"))
    request = await backend.next_request()
    await request.say("First")
    await session.db.run(lambda _store: None)  # the queued write has run

    assert await stored_branch(session) == [("user", "Hi", "complete"),
                                            ("assistant", "First", "streaming")]
    await request.finish()
    await finished(task)


async def test_the_model_sees_the_system_prompt_and_the_whole_branch(open_chat, backend):
    session = await open_chat(HISTORY, system_prompt="Answer briefly.")
    task = session.spawn(session.send("How tall are they?"))
    request = await backend.next_request()

    assert request.contents == [("system", "Answer briefly."), *HISTORY,
                                ("user", "How tall are they?")]
    await request.finish()
    await finished(task)


async def test_the_reply_is_tagged_with_its_conversation_for_the_cache(session, backend):
    task = session.spawn(session.send("Hello"))
    request = await backend.next_request()

    assert request.cache_tag == f"conversation-{session.conversation_id}"
    await request.finish()
    await finished(task)


async def test_the_first_message_titles_the_chat_and_the_list_is_told(session, backend):
    changed = []
    session.on_conversation_changed = changed.append
    await chat_turn(session, backend, "Pagodas of Kyoto\nand more", "Sure.")

    assert session.title == "Pagodas of Kyoto"
    assert session.conversation_id in changed


async def test_the_context_meter_counts_the_branch_after_a_reply(session, backend, view):
    await chat_turn(session, backend, "one two three", "four five")

    assert session.context_usage == (5, backend.max_model_len, 1024)
    assert view.called("show_context_usage")[-1] == (5, backend.max_model_len, 1024, True)


# -- refusals --------------------------------------------------------------------------------------


async def test_send_while_streaming_is_refused_and_the_text_given_back(session, backend, view):
    task = session.spawn(session.send("First"))
    request = await backend.next_request()

    await session.send("Second")
    assert view.drafts == ["Second"]
    await request.finish()
    await finished(task)
    assert await stored_branch(session) == [("user", "First", "complete"),
                                            ("assistant", "", "complete")]
    assert len(backend.requests) == 1


@pytest.mark.parametrize("state, notice", [("loading", LOADING), ("no model", NO_MODEL)])
async def test_send_without_a_ready_model_shows_why_and_keeps_the_text(open_chat, source, view,
                                                                       state, notice):
    session = await open_chat()
    if state == "loading":
        source.start_loading()
    else:
        source._backend = None

    await session.send("Hello?")
    assert session.notice == (notice, False)
    assert view.drafts == ["Hello?"]
    assert await session.db.messages(session.conversation_id) == []
    assert not session.is_streaming


async def test_whether_a_chat_can_send_follows_its_source_as_a_model_loads(open_chat, source):
    session = await open_chat()
    assert session.unable_to_send() is None

    source.start_loading()
    assert session.unable_to_send() == LOADING
    source.swap(ScriptedBackend())
    assert session.unable_to_send() is None
    source._backend = None
    assert session.unable_to_send() == NO_MODEL


# -- stop ------------------------------------------------------------------------------------------


async def test_stop_aborts_the_request_and_keeps_the_partial_reply_interrupted(session, backend):
    task = session.spawn(session.send("Count to ten"))
    request = await backend.next_request()
    await request.say("One, two")

    session.stop()
    await finished(task)
    assert backend.aborted == [request.id]
    assert request.finish_reason == "abort"
    assert await stored_branch(session) == [("user", "Count to ten", "complete"),
                                            ("assistant", "One, two", "interrupted")]
    assert session.views[-1].status == "interrupted"
    assert session.notice is None  # the user stopped it: nothing to explain
    assert not session.is_streaming


# -- regenerate and edit ---------------------------------------------------------------------------


async def test_regenerate_adds_a_sibling_reply_on_a_new_branch(open_chat, backend):
    session = await open_chat(HISTORY[:2])
    first_reply = session.path[-1]

    task = session.spawn(session.regenerate(first_reply.id))
    request = await backend.next_request()
    await request.say("A pagoda is a tiered tower with eaves.", "stop")
    await finished(task)

    assert await stored_branch(session) == [
        ("user", "What is a pagoda?", "complete"),
        ("assistant", "A pagoda is a tiered tower with eaves.", "complete")]
    siblings = await session.db.siblings(first_reply.id)
    assert [s.content for s in siblings] == ["A tiered tower.",
                                            "A pagoda is a tiered tower with eaves."]
    assert (session.views[-1].sibling_index, session.views[-1].sibling_count) == (1, 2)


async def test_regenerate_shows_the_model_exactly_the_branch_above_the_reply(open_chat,
                                                                             backend):
    session = await open_chat(HISTORY)
    first_reply = session.path[1]

    task = session.spawn(session.regenerate(first_reply.id))
    request = await backend.next_request()
    assert request.contents == [HISTORY[0]]  # neither the old reply nor the turns after it
    await request.finish()
    await finished(task)
    assert [m.content for m in session.path] == ["What is a pagoda?", ""]


async def test_regenerate_last_answers_the_newest_message_again(open_chat, backend):
    session = await open_chat(HISTORY)

    task = session.spawn(session.regenerate_last())
    request = await backend.next_request()
    assert request.contents == HISTORY[:3]
    await request.say("In East and Southeast Asia.", "stop")
    await finished(task)
    assert [m.content for m in session.path] == [*(text for _role, text in HISTORY[:3]),
                                                 "In East and Southeast Asia."]
    assert len(await session.db.messages(session.conversation_id)) == 5


async def test_edit_answers_the_edited_message_and_keeps_the_old_branch(open_chat, backend):
    session = await open_chat(HISTORY)
    old_question, old_answer = session.path[2], session.path[3]

    task = session.spawn(session.edit(old_question.id, "Where is the tallest?"))
    request = await backend.next_request()
    assert request.contents == [*HISTORY[:2], ("user", "Where is the tallest?")]
    await request.say("In China.", "stop")
    await finished(task)

    assert await stored_branch(session) == [
        ("user", "What is a pagoda?", "complete"), ("assistant", "A tiered tower.", "complete"),
        ("user", "Where is the tallest?", "complete"), ("assistant", "In China.", "complete")]
    assert (session.views[2].sibling_index, session.views[2].sibling_count) == (1, 2)
    kept = {m.id: m for m in await session.db.messages(session.conversation_id)}
    assert kept[old_question.id].content == "Where are they found?"
    assert (kept[old_answer.id].content, kept[old_answer.id].status) == ("Mostly in Asia.",
                                                                         "complete")


# -- branches --------------------------------------------------------------------------------------


async def test_switch_branch_shows_the_chosen_reply(open_chat, backend, view):
    session = await open_chat(HISTORY[:2])
    task = session.spawn(session.regenerate_last())
    await (await backend.next_request()).say("Another answer.", "stop")
    await finished(task)

    await session.switch_branch(session.views[-1].id, -1)
    assert [v.content for v in session.views] == ["What is a pagoda?", "A tiered tower."]
    assert (session.views[-1].sibling_index, session.views[-1].sibling_count) == (0, 2)
    shown = view.called("show_messages")[-1][0] + [v for (v,) in view.called("update_message")]
    assert any(v.content == "A tiered tower." for v in shown)

    await session.switch_branch(session.views[-1].id, +1)
    assert session.views[-1].content == "Another answer."


async def test_switch_branch_of_a_question_brings_back_its_whole_branch(open_chat, backend):
    session = await open_chat(HISTORY)
    task = session.spawn(session.edit(session.path[2].id, "Why so many roofs?"))
    await (await backend.next_request()).say("For the rain.", "stop")
    await finished(task)

    await session.switch_branch(session.views[2].id, -1)
    assert [v.content for v in session.views] == [text for _role, text in HISTORY]
    assert (session.views[2].sibling_index, session.views[2].sibling_count) == (0, 2)


async def test_switch_branch_while_streaming_is_refused_with_a_notice(open_chat, backend):
    session = await open_chat(HISTORY[:2])
    task = session.spawn(session.regenerate_last())
    request = await backend.next_request()
    streaming_branch = [m.id for m in session.path]

    await session.switch_branch(session.path[1].id, -1)
    assert session.notice == (WAIT_TO_SWITCH, False)
    assert [m.id for m in session.path] == streaming_branch
    await request.say("Still here.", "stop")
    await finished(task)
    assert session.views[-1].content == "Still here."


# -- fitting the chat to the model's context -------------------------------------------------------

TEN_WORDS = "one two three four five six seven eight nine ten"


async def test_the_oldest_turns_are_left_out_when_the_chat_outgrows_the_context(open_chat,
                                                                                 backend):
    # Two words of system prompt and four turns of ten words: 42 tokens. A reply needs 64 of
    # a 96-token context, so the prompt may take 32: the system prompt and the newest three.
    turns = [("user", f"u1 {TEN_WORDS[4:]}"), ("assistant", f"a1 {TEN_WORDS[4:]}"),
             ("user", f"u2 {TEN_WORDS[4:]}"), ("assistant", f"a2 {TEN_WORDS[4:]}")]
    session = await open_chat(turns, system_prompt="Be brief.")
    backend.max_model_len = 96

    task = session.spawn(session.send(f"u3 {TEN_WORDS[4:]}"))
    request = await backend.next_request()
    assert request.contents == [("system", "Be brief."), *turns[2:],
                                ("user", f"u3 {TEN_WORDS[4:]}")]
    assert request.options.max_tokens == 96 - 32
    assert "the 2 oldest messages were left out" in session.notice[0]
    await request.finish()
    await finished(task)
    assert len(session.path) == 6  # they stay in the chat


async def test_a_message_too_long_for_the_context_fails_the_reply_with_the_reason(session,
                                                                                   backend, view):
    backend.max_model_len = 96

    await session.send(" ".join([TEN_WORDS] * 5))
    message, is_error = session.notice
    assert is_error
    assert "50 tokens long" in message and "holds 96" in message
    reply = await stored_reply(session)
    assert (reply.status, reply.content, reply.error) == ("error", "", message)
    assert backend.requests == []
    assert not session.is_streaming


# -- actions that overlap --------------------------------------------------------------------------


async def test_a_second_send_while_the_first_is_stored_is_refused(session, backend, view):
    first = session.spawn(session.send("First"))
    second = session.spawn(session.send("Second"))
    await eventually(lambda: backend.running or second.done(), "a reply or a refusal")
    while not (first.done() and second.done()):
        for request in backend.running:
            await request.say("Answer", "stop")
        await asyncio.sleep(0.001)
    session.db.drain()

    assert [(m.role, m.content, m.status) for m in await session.db.messages(
        session.conversation_id)] == [("user", "First", "complete"),
                                      ("assistant", "Answer", "complete")]
    assert view.drafts == ["Second"]


async def test_stop_while_the_chat_is_counted_stops_the_reply(session, backend):
    gate = backend.hold_next_count()
    task = session.spawn(session.send("Hi"))
    await gate.wait_entered()
    assert session.is_streaming  # the tab shows Stop

    session.stop()
    gate.release()
    await eventually(lambda: task.done() or backend.running, "the reply to end or stream")
    streamed = [r.id for r in backend.requests if r.id not in backend.aborted]
    for request in backend.running:
        request.end_with_abort()
    await finished(task)

    assert streamed == []
    assert await stored_branch(session) == [("user", "Hi", "complete"),
                                            ("assistant", "", "interrupted")]


# -- closing the chat ------------------------------------------------------------------------------


async def test_closing_mid_stream_aborts_and_keeps_the_reply_interrupted(session, backend):
    task = session.spawn(session.send("Hi"))
    request = await backend.next_request()
    await request.say("Half a")

    session.close()
    assert backend.aborted == [request.id]
    await finished(task)
    session.db.drain()
    assert await stored_branch(session) == [("user", "Hi", "complete"),
                                            ("assistant", "Half a", "interrupted")]


async def test_a_closed_chat_tells_its_view_nothing_more(session, backend, view):
    task = session.spawn(session.send("Hi"))
    request = await backend.next_request()
    await request.say("Half")
    session.close()
    calls_at_close = len(view.calls)

    await finished(task)  # the stream still ends, and the reply with it
    session.spawn(_fails("after close"))
    await session.wait_idle()
    assert len(view.calls) == calls_at_close
    assert session.notice is None


class HeldStore:
    """Holds the store's `start_assistant_message` on its worker thread until released."""

    def __init__(self, store) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        original = store.start_assistant_message

        def held(*args, **kwargs):
            self.entered.set()
            self.release.wait(WAIT_S)
            return original(*args, **kwargs)

        store.start_assistant_message = held

    async def wait_entered(self) -> None:
        assert await asyncio.to_thread(self.entered.wait, WAIT_S), "the reply was not started"


async def test_closing_while_the_reply_is_being_started_leaves_it_interrupted(session, backend,
                                                                               store):
    held = HeldStore(store)
    task = session.spawn(session.send("Hi"))
    await held.wait_entered()

    session.close()
    held.release.set()
    await finished(task)
    session.db.drain()
    assert await stored_branch(session) == [("user", "Hi", "complete"),
                                            ("assistant", "", "interrupted")]
    assert backend.requests == []


async def test_closing_while_the_chat_is_counted_leaves_the_reply_interrupted(open_chat, backend,
                                                                             view):
    session = await open_chat(HISTORY)
    backend.max_model_len = 64 + 10  # 15 words: the oldest turns will be left out
    gate = backend.hold_next_count()
    task = session.spawn(session.send("Hi"))
    await gate.wait_entered()

    session.close()
    calls_at_close = len(view.calls)
    gate.release()
    await finished(task)
    session.db.drain()
    assert (await stored_branch(session))[-2:] == [("user", "Hi", "complete"),
                                                   ("assistant", "", "interrupted")]
    assert backend.requests == []
    assert len(view.calls) == calls_at_close  # not even the notice of what was left out


@pytest.mark.parametrize("removal", ["delete", "purge"])
async def test_deleting_a_chat_that_streams_ends_cleanly(session, backend, removal, caplog):
    task = session.spawn(session.send("Hi"))
    request = await backend.next_request()
    await request.say("Partial")

    session.close()
    await getattr(session.db, removal)(session.conversation_id)
    await finished(task)
    session.db.drain()
    if removal == "delete":  # soft: the chat can be brought back, its reply ended
        left = await session.db.messages(session.conversation_id)
        assert [(m.content, m.status) for m in left] == [("Hi", "complete"),
                                                         ("Partial", "interrupted")]
    assert "failed" not in caplog.text
    assert not backend.running


# -- the model switched ----------------------------------------------------------------------------


async def test_a_model_switch_mid_stream_keeps_the_reply_and_says_why(session, backend, source):
    task = session.spawn(session.send("Hi"))
    request = await backend.next_request()
    await request.say("Written by the old model")

    source.swap(ScriptedBackend("new-model"))
    await finished(task)
    assert await stored_branch(session) == [
        ("user", "Hi", "complete"), ("assistant", "Written by the old model", "interrupted")]
    assert session.notice == (MODEL_SWITCHED, True)
    assert not session.is_streaming


@pytest.mark.parametrize("old_model_counts_after_shutdown", [False, True])
async def test_a_switch_while_the_chat_is_counted_streams_on_the_new_model(
        session, backend, source, old_model_counts_after_shutdown):
    backend.counts_after_shutdown = old_model_counts_after_shutdown
    gate = backend.hold_next_count()
    task = session.spawn(session.send("Hi"))
    await gate.wait_entered()

    new = ScriptedBackend("new-model")
    source.swap(new)
    gate.release()
    request = await new.next_request()
    assert request.contents == [("user", "Hi")]
    await request.say("From the new model.", "stop")
    await finished(task)
    assert backend.requests == []
    reply = await stored_reply(session)
    assert (reply.content, reply.status, reply.stats.model) == ("From the new model.",
                                                                "complete", "new-model")
    assert session.notice is None


# -- backend failures ------------------------------------------------------------------------------


async def test_a_failure_after_text_keeps_the_reply_interrupted_and_says_what_failed(session,
                                                                                     backend):
    task = session.spawn(session.send("Hi"))
    request = await backend.next_request()
    await request.say("Some of it")
    await request.fail(ServerError("The server failed mid-reply: retry later.",
                                   partial_text="Some of it"))
    await finished(task)

    assert await stored_branch(session) == [("user", "Hi", "complete"),
                                            ("assistant", "Some of it", "interrupted")]
    assert session.notice == ("The server failed mid-reply: retry later.", True)


async def test_a_failure_before_any_text_stores_the_reply_as_an_error(session, backend):
    backend.fail_next_stream(ServerError("The server answered 500: try again.", status=500))
    await session.send("Hi")

    reply = await stored_reply(session)
    assert (reply.status, reply.content, reply.error) == ("error", "",
                                                          "The server answered 500: try again.")
    assert session.notice == ("The server answered 500: try again.", True)
    assert session.views[-1].status == "error"


async def test_a_failed_reply_shows_its_error_under_it(session, backend):
    backend.fail_next_stream(ServerError("The server answered 500: try again.", status=500))
    await session.send("Hi")

    assert session.views[-1].error == "The server answered 500: try again."


# -- where replies come from -----------------------------------------------------------------------


async def test_use_source_sends_the_next_reply_to_the_new_backend(session, backend):
    remote = ScriptedBackend("remote-model")
    assert session.use_source(FakeSource(remote))
    await session.wait_idle()

    await chat_turn(session, remote, "Hi", "From afar.")
    assert backend.requests == []
    assert (await stored_reply(session)).stats.model == "remote-model"


async def test_use_source_is_refused_while_a_reply_streams(session, backend):
    task = session.spawn(session.send("Hi"))
    request = await backend.next_request()

    assert not session.use_source(FakeSource(ScriptedBackend("remote-model")))
    assert "Wait for the reply to finish" in session.notice[0]
    await request.finish()
    await finished(task)
    await chat_turn(session, backend, "Again", "Same backend.")
    assert len(backend.requests) == 2


# -- settings --------------------------------------------------------------------------------------


async def test_saved_settings_change_what_the_model_is_given(session, backend):
    await session.save_settings(SamplingView(system_prompt="Speak like a pirate.",
                                             temperature=0.2, top_k=40, max_tokens=100, seed=7))

    task = session.spawn(session.send("Hi"))
    request = await backend.next_request()
    assert request.contents == [("system", "Speak like a pirate."), ("user", "Hi")]
    options = request.options
    assert (options.temperature, options.top_k, options.max_tokens, options.seed) == (0.2, 40,
                                                                                      100, 7)
    await request.finish()
    await finished(task)
    stored = await session.db.get_conversation(session.conversation_id)
    assert (stored.system_prompt, stored.sampling.temperature) == ("Speak like a pirate.", 0.2)


async def test_a_chat_opens_with_its_stored_settings(open_chat, view):
    session = await open_chat(system_prompt="Be brief.")
    assert session.settings.system_prompt == "Be brief."
    assert view.called("show_settings")[-1] == (session.settings,)


# -- actions that fail -----------------------------------------------------------------------------


async def _fails(message: str) -> None:
    raise RuntimeError(message)


async def test_an_unexpected_failure_in_an_action_is_shown_in_the_chat(session, view):
    session.spawn(_fails("the disk is full"))
    await session.wait_idle()

    assert session.notice == ("Something went wrong: the disk is full", True)
    assert view.called("show_notice")[-1] == ("Something went wrong: the disk is full", True)


# -- no window -------------------------------------------------------------------------------------


def test_the_chat_logic_loads_without_qt_or_torch():
    """Of the engine, only the sampling fields' table (no torch), which the store and the
    backends' options are built on, and the image decoder (Pillow, no torch) the composer's
    images are checked with."""
    table = ("pagoda.engine", "pagoda.engine.sampling", "pagoda.engine.sampling.fields",
             "pagoda.engine.errors", "pagoda.engine.multimodal", "pagoda.engine.multimodal.images")
    code = ("import sys, pagoda.app.components.chat.chat_session, tests.app.components.fake_backend; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('PySide6', 'torch') "
            f"or (m.startswith('pagoda.engine') and m not in {table!r})))")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.strip() == "[]"

