"""A reply cut at its max tokens can be reopened to stream its rest into the same message."""

import pytest

from pagoda.app.store import ConversationStore, StoreError, StreamingWriter, ToolCall


def _cut(store: ConversationStore) -> tuple[int, int]:
    cid = store.create_conversation().id
    store.append_user_message(cid, "Write a poem")
    reply = store.start_assistant_message(cid)
    store.finish_message(reply.id, "Roses are red,", "length", completion_tokens=4)
    return cid, reply.id


def test_a_cut_reply_reopens_and_grows_in_place(store: ConversationStore) -> None:
    cid, mid = _cut(store)
    resumed = store.resume_message(mid)
    assert (resumed.status, resumed.content) == ("streaming", "Roses are red,")

    writer = StreamingWriter(store, mid, text=resumed.content)
    writer.append(" violets are blue.")
    writer.finish("stop", completion_tokens=9)

    reply = store.current_path(cid)[-1]
    assert (reply.id, reply.content, reply.status, reply.finish_reason) == (
        mid, "Roses are red, violets are blue.", "complete", "stop")
    assert len(store.siblings(mid)) == 1


def test_only_the_newest_reply_cut_at_max_tokens_can_be_reopened(
        store: ConversationStore) -> None:
    cid, mid = _cut(store)
    store.append_user_message(cid, "Another")
    with pytest.raises(StoreError, match="not the newest"):
        store.resume_message(mid)
    done = store.start_assistant_message(cid)
    store.finish_message(done.id, "Fine.", "stop")
    with pytest.raises(StoreError, match="max tokens"):
        store.resume_message(done.id)


def test_a_stopped_reply_reopens_but_not_a_finished_one_or_one_that_called_tools(
        store: ConversationStore) -> None:
    cid = store.create_conversation().id
    store.append_user_message(cid, "Write a poem")
    reply = store.start_assistant_message(cid)
    writer = StreamingWriter(store, reply.id)
    writer.append("Roses are")
    writer.interrupt("stopped")
    resumed = store.resume_message(reply.id)
    assert (resumed.status, resumed.content, resumed.finish_reason) == (
        "streaming", "Roses are", None)
    StreamingWriter(store, reply.id, text=resumed.content).finish("stop")
    with pytest.raises(StoreError, match="max tokens nor stopped"):
        store.resume_message(reply.id)

    caller = store.start_assistant_message(cid)
    writer = StreamingWriter(store, caller.id)
    writer.set_tool_calls((ToolCall("call_1", "add", "{}"),))
    writer.interrupt("stopped")
    with pytest.raises(StoreError, match="max tokens nor stopped"):
        store.resume_message(caller.id)
