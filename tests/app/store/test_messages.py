"""Messages as a tree: streaming replies, edits and regenerations as sibling branches."""

import pytest

from pagoda.app.store import (
    ConversationStore,
    GenerationStats,
    MessageNotFound,
    StoreError,
)
from pagoda.app.store.titles import TITLE_LIMIT


def chat(store: ConversationStore, *turns: tuple[str, str]) -> int:
    cid = store.create_conversation().id
    for question, answer in turns:
        store.append_user_message(cid, question)
        reply = store.start_assistant_message(cid)
        store.finish_message(reply.id, answer, "stop")
    return cid


def texts(store: ConversationStore, cid: int) -> list[str]:
    return [m.content for m in store.current_path(cid)]


def test_user_message_becomes_the_leaf(store: ConversationStore) -> None:
    cid = store.create_conversation().id
    first = store.append_user_message(cid, "hello")
    assert (first.role, first.parent_id, first.status) == ("user", None, "complete")
    assert store.get_conversation(cid).leaf_id == first.id
    second = store.append_user_message(cid, "anyone?")
    assert second.parent_id == first.id
    assert texts(store, cid) == ["hello", "anyone?"]


def test_streaming_reply_lifecycle_keeps_text_and_stats(store: ConversationStore) -> None:
    cid = store.create_conversation(model="smollm2").id
    user = store.append_user_message(cid, "capital of France?")
    reply = store.start_assistant_message(cid)
    assert (reply.status, reply.content, reply.parent_id) == ("streaming", "", user.id)
    assert reply.stats == GenerationStats(model="smollm2")
    assert store.get_conversation(cid).leaf_id == reply.id
    store.update_streaming(reply.id, "Paris")
    assert store.get_message(reply.id).content == "Paris"
    stats = GenerationStats(model="smollm2-q4", ttft_s=0.25, tokens_per_s=31.5, cached_tokens=12)
    store.finish_message(reply.id, "Paris.", "stop", stats, prompt_tokens=20, completion_tokens=3)
    done = store.get_message(reply.id)
    assert (done.status, done.content, done.finish_reason) == ("complete", "Paris.", "stop")
    assert (done.prompt_tokens, done.completion_tokens) == (20, 3)
    assert done.stats == stats


def test_interrupted_and_failed_replies_keep_partial_text(store: ConversationStore) -> None:
    cid = chat(store, ("q1", "a1"))
    store.append_user_message(cid, "q2")
    stopped = store.start_assistant_message(cid)
    store.interrupt_message(stopped.id, "half an ans")
    assert store.get_message(stopped.id).status == "interrupted"
    failed = store.regenerate(stopped.id)
    store.fail_message(failed.id, "par", "out of memory")
    loaded = store.get_message(failed.id)
    assert (loaded.status, loaded.content, loaded.error) == ("error", "par", "out of memory")


def test_ended_reply_refuses_more_streaming(store: ConversationStore) -> None:
    cid = store.create_conversation().id
    store.append_user_message(cid, "q")
    reply = store.start_assistant_message(cid)
    store.finish_message(reply.id, "done", "stop")
    with pytest.raises(StoreError, match="no longer streaming"):
        store.update_streaming(reply.id, "late")
    with pytest.raises(StoreError, match="no longer streaming"):
        store.interrupt_message(reply.id, "late")
    assert store.get_message(reply.id).content == "done"


def test_first_user_message_titles_the_conversation(store: ConversationStore) -> None:
    cid = store.create_conversation().id
    long_line = "Explain how a paged KV cache shares prefix blocks between many concurrent requests"
    store.append_user_message(cid, f"\n  {long_line}\nsecond line")
    assert store.get_conversation(cid).title == long_line  # views elide it as they draw it
    store.append_user_message(cid, "another question")
    assert store.get_conversation(cid).title == long_line


def test_a_very_long_first_line_is_cut_at_a_word_without_an_ellipsis(
        store: ConversationStore) -> None:
    cid = store.create_conversation().id
    long_line = " ".join(["pagoda"] * 40)
    store.append_user_message(cid, long_line)
    title = store.get_conversation(cid).title
    assert title is not None and len(title) <= TITLE_LIMIT and not title.endswith("…")
    assert long_line.startswith(title) and long_line[len(title)] == " "


def test_short_and_chinese_titles(store: ConversationStore) -> None:
    short = store.create_conversation().id
    store.append_user_message(short, "Hi!")
    assert store.get_conversation(short).title == "Hi!"
    chinese = store.create_conversation().id
    store.append_user_message(chinese, "请" * 80)
    assert store.get_conversation(chinese).title == "请" * 80
    longer = store.create_conversation().id
    store.append_user_message(longer, "请" * 500)
    assert store.get_conversation(longer).title == "请" * TITLE_LIMIT
    named = store.create_conversation("Mine").id
    store.append_user_message(named, "something else")
    assert store.get_conversation(named).title == "Mine"


def test_edit_creates_a_sibling_branch_and_keeps_the_old_one(store: ConversationStore) -> None:
    cid = chat(store, ("q1", "a1"), ("q2", "a2"))
    old_q2 = store.current_path(cid)[2]
    edited = store.edit_user_message(old_q2.id, "q2 edited")
    assert edited.parent_id == old_q2.parent_id
    assert texts(store, cid) == ["q1", "a1", "q2 edited"]
    reply = store.start_assistant_message(cid)
    store.finish_message(reply.id, "a2 new", "stop")
    assert texts(store, cid) == ["q1", "a1", "q2 edited", "a2 new"]
    assert [m.content for m in store.siblings(old_q2.id)] == ["q2", "q2 edited"]
    store.switch_branch(old_q2.id)
    assert texts(store, cid) == ["q1", "a1", "q2", "a2"]
    store.switch_branch(edited.id)
    assert texts(store, cid) == ["q1", "a1", "q2 edited", "a2 new"]


def test_regenerate_adds_an_answer_next_to_the_old_one(store: ConversationStore) -> None:
    cid = chat(store, ("q1", "a1"))
    first_answer = store.current_path(cid)[-1]
    again = store.regenerate(first_answer.id)
    assert (again.parent_id, again.status) == (first_answer.parent_id, "streaming")
    store.finish_message(again.id, "a1 again", "stop")
    assert texts(store, cid) == ["q1", "a1 again"]
    assert [m.id for m in store.siblings(again.id)] == [first_answer.id, again.id]
    assert store.switch_branch(first_answer.id).id == first_answer.id
    assert texts(store, cid) == ["q1", "a1"]


def test_start_with_a_parent_that_has_an_answer_is_a_regeneration(
    store: ConversationStore,
) -> None:
    cid = chat(store, ("q1", "a1"))
    question = store.current_path(cid)[0]
    sibling = store.start_assistant_message(cid, parent_id=question.id)
    assert len(store.siblings(sibling.id)) == 2
    assert store.get_conversation(cid).leaf_id == sibling.id


def test_switch_branch_follows_the_newest_child_down_to_a_leaf(store: ConversationStore) -> None:
    cid = chat(store, ("q1", "a1"), ("q2", "a2"))
    q1, a1, q2, a2 = store.current_path(cid)
    other_q2 = store.edit_user_message(q2.id, "q2b")
    store.switch_branch(q1.id)
    assert [m.id for m in store.current_path(cid)] == [q1.id, a1.id, other_q2.id]
    leaf = store.switch_branch(q2.id)
    assert leaf.id == a2.id
    assert store.get_conversation(cid).leaf_id == a2.id


def test_root_messages_can_branch_too(store: ConversationStore) -> None:
    cid = chat(store, ("first", "answer"))
    root = store.current_path(cid)[0]
    edited = store.edit_user_message(root.id, "first, edited")
    assert edited.parent_id is None
    assert [m.content for m in store.siblings(root.id)] == ["first", "first, edited"]
    assert texts(store, cid) == ["first, edited"]


def test_messages_lists_every_branch(store: ConversationStore) -> None:
    cid = chat(store, ("q", "a"))
    store.regenerate(store.current_path(cid)[-1].id)
    assert [m.role for m in store.messages(cid)] == ["user", "assistant", "assistant"]


def test_wrong_roles_and_foreign_parents_are_refused(store: ConversationStore) -> None:
    cid = chat(store, ("q", "a"))
    question, answer = store.current_path(cid)
    with pytest.raises(StoreError, match="assistant message"):
        store.edit_user_message(answer.id, "x")
    with pytest.raises(StoreError, match="user message"):
        store.regenerate(question.id)
    other = store.create_conversation().id
    with pytest.raises(StoreError, match=f"conversation {cid}"):
        store.start_assistant_message(other, parent_id=question.id)


@pytest.mark.parametrize(
    "call",
    [
        lambda s: s.get_message(4242),
        lambda s: s.update_streaming(4242, "x"),
        lambda s: s.finish_message(4242, "x", "stop"),
        lambda s: s.edit_user_message(4242, "x"),
        lambda s: s.regenerate(4242),
        lambda s: s.siblings(4242),
        lambda s: s.switch_branch(4242),
    ],
)
def test_unknown_message_id_raises_naming_it(store: ConversationStore, call) -> None:
    with pytest.raises(MessageNotFound, match="4242"):
        call(store)
