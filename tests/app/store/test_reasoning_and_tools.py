"""Reasoning kept apart from the answer, the calls a reply made, and tool messages: stored,
streamed, searched and carried over from a database of the previous schema."""

import sqlite3
from pathlib import Path

import pytest

from pagoda.app.store import ConversationStore, ReplyParts, StoreError, StreamingWriter, ToolCall
from pagoda.app.store.database.migrate import current_revision, head_revision, upgrade

CALL = ToolCall("call_7", "add", '{"a": 2, "b": 3}')


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def reply(store: ConversationStore):
    cid = store.create_conversation().id
    store.append_user_message(cid, "what is 2 + 3?")
    return store.start_assistant_message(cid)


def test_reasoning_streams_to_disk_apart_from_the_answer_and_is_timed(store, reply) -> None:
    clock = FakeClock()
    writer = StreamingWriter(store, reply.id, clock=clock)
    writer.append_reasoning("Two plus")
    assert store.get_message(reply.id).reasoning == "Two plus"
    assert store.get_message(reply.id).content == ""
    clock.now = 12.0
    writer.append_reasoning(" three.")
    writer.append("It is 5.")
    clock.now = 15.0
    writer.finish("stop")
    message = store.get_message(reply.id)
    assert (message.reasoning, message.content) == ("Two plus three.", "It is 5.")
    assert message.reasoning_s == 12.0  # until the answer began, not until the end


def test_a_reply_cut_while_thinking_keeps_its_reasoning_and_time_so_far(store, reply) -> None:
    clock = FakeClock()
    writer = StreamingWriter(store, reply.id, clock=clock)
    writer.append_reasoning("Hmm")
    clock.now = 3.0
    writer.interrupt("stopped")
    message = store.get_message(reply.id)
    assert (message.status, message.reasoning, message.reasoning_s) == ("interrupted", "Hmm", 3.0)


def test_a_reply_without_reasoning_stores_none(store, reply) -> None:
    writer = StreamingWriter(store, reply.id, clock=FakeClock())
    writer.append("5")
    writer.finish("stop")
    message = store.get_message(reply.id)
    assert (message.reasoning, message.reasoning_s, message.tool_calls) == (None, None, ())


def test_calls_of_a_reply_and_their_results_form_the_branch(store, reply) -> None:
    writer = StreamingWriter(store, reply.id, clock=FakeClock())
    writer.set_tool_calls((CALL,))
    writer.finish("tool_calls")
    result = store.append_tool_message(reply.id, CALL, "5", "done")
    answer = store.start_assistant_message(reply.conversation_id, parent_id=result.id)
    store.finish_message(answer.id, "2 + 3 = 5.", "stop")
    path = store.current_path(reply.conversation_id)
    assert [m.role for m in path] == ["user", "assistant", "tool", "assistant"]
    assert path[1].tool_calls == (CALL,)
    assert (path[2].tool_call_id, path[2].tool_name, path[2].finish_reason) == (
        "call_7", "add", "done")


def test_tool_results_need_a_known_outcome_and_a_reply_above_them(store, reply) -> None:
    store.finish_message(reply.id, "", "tool_calls", parts=ReplyParts(tool_calls=(CALL,)))
    with pytest.raises(StoreError, match="one of done, denied, failed"):
        store.append_tool_message(reply.id, CALL, "5", "maybe")
    user = store.current_path(reply.conversation_id)[0]
    with pytest.raises(StoreError, match="user message"):
        store.append_tool_message(user.id, CALL, "5", "done")


def test_search_finds_answers_and_results_but_not_reasoning(store, reply) -> None:
    store.finish_message(reply.id, "the answer is five", "stop",
                         parts=ReplyParts("secret pondering", 1.0))
    assert [hit.message_id for hit in store.search("five")] == [reply.id]
    assert store.search("pondering") == []


def test_a_database_of_the_previous_schema_keeps_its_chats_and_takes_tools(db_path: Path) -> None:
    db_path.parent.mkdir(parents=True)
    upgrade(db_path, "0002")
    connection = sqlite3.connect(db_path)
    connection.executescript("""
        INSERT INTO conversations (id, title, created_at, updated_at, sampling, pinned, archived)
            VALUES (1, 'old', '2026-01-01 00:00:00', '2026-01-01 00:00:00', '{}', 0, 0);
        INSERT INTO messages (id, conversation_id, parent_id, role, content, created_at, status)
            VALUES (1, 1, NULL, 'user', 'hello there', '2026-01-01 00:00:00', 'complete'),
                   (9, 1, 1, 'assistant', 'gone', '2026-01-01 00:00:00', 'complete');
        DELETE FROM messages WHERE id = 9;
        INSERT INTO messages (id, conversation_id, parent_id, role, content, created_at, status)
            VALUES (2, 1, 1, 'assistant', 'general kenobi', '2026-01-01 00:00:01', 'complete');
        INSERT INTO conversation_leaves VALUES (1, 2);
    """)
    connection.commit()
    connection.close()
    with ConversationStore.open(db_path) as store:
        assert current_revision(db_path) == head_revision()
        assert [m.content for m in store.current_path(1)] == ["hello there", "general kenobi"]
        assert [hit.message_id for hit in store.search("kenobi")] == [2]
        result = store.append_tool_message(2, CALL, "5", "failed")
        assert result.id == 10  # the counter survived the rebuild: 9 is never handed out again
        assert store.search("kenobi")[0].message_id == 2
    connection = sqlite3.connect(db_path)
    assert connection.execute("PRAGMA foreign_key_check").fetchall() == []
    connection.close()
