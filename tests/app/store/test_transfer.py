"""Export and import: lossless JSON round trips, Markdown of the current branch."""

import json
from pathlib import Path

import pytest

from pagoda.app.store import (
    ConversationStore,
    GenerationStats,
    ReplyParts,
    SamplingSettings,
    StoreError,
    ToolCall,
)


def populate(store: ConversationStore) -> list[int]:
    chat = store.create_conversation(
        model="smollm2", system_prompt="Be kind.", sampling=SamplingSettings(seed=3, top_k=20)
    ).id
    store.append_user_message(chat, "北京 is the capital of?")
    first = store.start_assistant_message(chat)
    stats = GenerationStats(model="smollm2", ttft_s=0.123456789, tokens_per_s=42.5, cached_tokens=7)
    store.finish_message(first.id, "China.", "stop", stats, prompt_tokens=11, completion_tokens=2)
    second = store.regenerate(first.id)
    store.interrupt_message(second.id, "It is")
    store.switch_branch(first.id)
    broken = store.start_assistant_message(chat)
    store.fail_message(broken.id, "x", "engine failed")
    pinned = store.create_conversation("Pinned and archived")
    store.set_pinned(pinned.id, True)
    store.set_archived(pinned.id, True)
    trashed = store.create_conversation("In the trash")
    store.append_user_message(trashed.id, "bye")
    store.delete(trashed.id)
    store.create_conversation()
    return [chat, pinned.id, trashed.id, with_tools(store)]


def with_tools(store: ConversationStore) -> int:
    """A turn that thought, called a tool, read its result and answered."""
    chat = store.create_conversation("Weather").id
    store.append_user_message(chat, "Weather in Paris?")
    caller = store.start_assistant_message(chat)
    call = ToolCall("call_1", "get_weather", '{"city": "Paris"}')
    store.finish_message(caller.id, "", "tool_calls",
                         parts=ReplyParts("I should ask the tool.", 1.25, (call,)))
    result = store.append_tool_message(caller.id, call, '{"temp": 18}', "done")
    answer = store.start_assistant_message(chat, parent_id=result.id)
    store.finish_message(answer.id, "18 °C in Paris.", "stop")
    return chat


def test_export_import_into_empty_database_exports_identically(store, tmp_path: Path) -> None:
    populate(store)
    exported = store.export_json()
    with ConversationStore.open(tmp_path / "empty.db") as empty:
        ids = empty.import_json(exported)
        assert ids == [c["id"] for c in json.loads(exported)["conversations"]]
        assert empty.export_json() == exported


def test_export_is_lossless_for_tree_statuses_and_stats(store) -> None:
    chat, *_ = populate(store)
    document = json.loads(store.export_json([chat]))
    (conversation,) = document["conversations"]
    statuses = [m["status"] for m in conversation["messages"]]
    assert statuses == ["complete", "complete", "interrupted", "error"]
    assert conversation["messages"][1]["stats"]["ttft_s"] == 0.123456789
    assert conversation["leaf_id"] == conversation["messages"][3]["id"]
    assert conversation["sampling"]["seed"] == 3
    assert conversation["created_at"].endswith("+00:00")


def test_import_into_a_used_database_gives_new_ids_and_keeps_the_tree(store, tmp_path) -> None:
    chat, *_ = populate(store)
    exported = store.export_json([chat])
    (new_id,) = store.import_json(exported)
    assert new_id != chat
    original = [(m.role, m.content, m.status) for m in store.current_path(chat)]
    copied = store.current_path(new_id)
    assert [(m.role, m.content, m.status) for m in copied] == original
    assert all(m.conversation_id == new_id for m in copied)
    assert len(store.messages(new_id)) == len(store.messages(chat))
    assert [h.conversation_id for h in store.search("北京")] == [new_id, chat]


@pytest.mark.parametrize(
    "text",
    ["not json", "[]", '{"format": "something else"}', '{"format": "pagoda-conversations"}'],
)
def test_import_of_something_else_raises_a_clear_error(store, text: str) -> None:
    with pytest.raises(StoreError, match="not a valid Pagoda export"):
        store.import_json(text)
    assert store.list_conversations() == []


def test_markdown_export_shows_the_current_branch_only(store) -> None:
    chat, *_ = populate(store)
    markdown = store.export_markdown(chat)
    assert markdown.startswith("# 北京 is the capital of?\n")
    assert "## System\n\nBe kind." in markdown
    assert "## User\n\n北京 is the capital of?" in markdown
    assert "China." in markdown
    assert "It is" not in markdown  # the interrupted regeneration is another branch
    assert "*(error: engine failed)*" in markdown


def test_markdown_export_shows_thinking_calls_and_results(store) -> None:
    chat = with_tools(store)
    markdown = store.export_markdown(chat)
    assert "> *Thinking*\n>\n> I should ask the tool." in markdown
    assert '*Called `get_weather` with* `{"city": "Paris"}`' in markdown
    assert '## Tool: get_weather (done)\n\n```\n{"temp": 18}\n```' in markdown
    assert markdown.index("I should ask") < markdown.index("get_weather") < markdown.index("18 °C")


def test_reimport_with_taken_ids_keeps_messages_oldest_first(store) -> None:
    cid = store.create_conversation().id
    first = store.append_user_message(cid, "q1")
    answer = store.start_assistant_message(cid)
    store.finish_message(answer.id, "a1", "stop")
    store.append_user_message(cid, "q2")
    second = store.start_assistant_message(cid)
    store.finish_message(second.id, "a2", "stop")
    again = store.regenerate(answer.id)  # a branch near the root, written last
    store.finish_message(again.id, "a1 again", "stop")
    assert store.get_message(again.id).parent_id == first.id

    (copy,) = store.import_json(store.export_json([cid]))

    original = [(m.role, m.content) for m in store.messages(cid)]
    assert [(m.role, m.content) for m in store.messages(copy)] == original
    created = [m.created_at for m in store.messages(copy)]
    assert created == sorted(created)


def test_import_with_ids_near_the_limit_gives_new_ids_so_later_ones_still_fit(store) -> None:
    cid = store.create_conversation().id
    store.append_user_message(cid, "hello")
    document = json.loads(store.export_json([cid]))
    (conversation,) = document["conversations"]
    top = 2**63 - 1
    conversation["id"] = top
    conversation["leaf_id"] = conversation["messages"][0]["id"] = top
    conversation["messages"][0]["conversation_id"] = top
    with ConversationStore.open(store.path.with_name("other.db")) as other:
        (new_id,) = other.import_json(json.dumps(document))
        assert new_id < top and [m.id < top for m in other.messages(new_id)] == [True]
        later = other.create_conversation().id
        assert other.append_user_message(later, "still room").conversation_id == later


def test_an_imported_chat_beside_its_original_is_marked_imported(store) -> None:
    weather = with_tools(store)
    exported = store.export_json([weather])
    (first,) = store.import_json(exported)
    (second,) = store.import_json(exported)
    titles = {c.id: c.title for c in store.list_conversations()}
    assert (titles[weather], titles[first], titles[second]) == (
        "Weather", "Weather (imported)", "Weather (imported 2)")


def test_a_restore_into_an_empty_database_keeps_repeated_titles(store, tmp_path: Path) -> None:
    for _ in range(2):
        store.create_conversation("Hello")
    store.create_conversation()
    exported = store.export_json()
    with ConversationStore.open(tmp_path / "empty.db") as empty:
        empty.import_json(exported)
        assert sorted(c.title or "" for c in empty.list_conversations()) == ["", "Hello", "Hello"]
        assert empty.export_json() == exported
        empty.import_json(exported)
        assert sorted(c.title or "" for c in empty.list_conversations()) == sorted([
            "", "", "Hello", "Hello", "Hello (imported)", "Hello (imported 2)"])
