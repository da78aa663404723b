"""Conversations: create, list, rename, pin, archive, soft delete, purge, settings, tabs."""

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from pagoda.app.store import (
    ConversationNotFound,
    ConversationStore,
    ReplyParts,
    SamplingSettings,
    StoreError,
    ToolCall,
    default_db_path,
    resolve_db_path,
)
from pagoda.app.store.convert import sampling_of


def test_new_conversation_round_trips_every_field(store: ConversationStore) -> None:
    sampling = SamplingSettings(temperature=0.2, top_k=40, seed=7)
    created = store.create_conversation(
        "Plans", model="smollm2", system_prompt="Be brief.", sampling=sampling
    )
    loaded = store.get_conversation(created.id)
    assert loaded == created
    assert (loaded.title, loaded.model, loaded.system_prompt) == ("Plans", "smollm2", "Be brief.")
    assert loaded.sampling == sampling
    assert not loaded.pinned and not loaded.archived and loaded.deleted_at is None
    assert loaded.leaf_id is None
    assert loaded.created_at.tzinfo is UTC
    assert abs(loaded.created_at - datetime.now(UTC)) < timedelta(seconds=5)


def test_default_sampling_settings(store: ConversationStore) -> None:
    assert store.create_conversation().sampling == SamplingSettings()


def test_settings_saved_before_a_sampling_field_existed_read_it_at_a_new_chats_value() -> None:
    """A chat's settings as an older Pagoda wrote them, before presence_penalty and the
    fields after it were in the table: no migration, each missing knob takes its default."""
    saved = ('{"enable_thinking": null, "max_tokens": 1024, "min_p": 0.0, "repetition_penalty": '
             '1.1, "seed": 3, "temperature": 0.2, "tools": ["files"], "top_k": 40, "top_p": 0.9}')
    assert sampling_of(saved) == SamplingSettings(temperature=0.2, top_k=40, seed=3,
                                                  tools=("files",))


def test_list_shows_pinned_first_then_most_recent(store: ConversationStore) -> None:
    old, middle, _new = (store.create_conversation(t) for t in ("old", "middle", "new"))
    store.append_user_message(middle.id, "bump")  # activity makes it the most recent
    store.set_pinned(old.id, True)
    assert [c.title for c in store.list_conversations()] == ["old", "middle", "new"]
    store.set_pinned(old.id, False)
    assert [c.title for c in store.list_conversations()] == ["middle", "new", "old"]


def test_replies_being_written_and_ending_do_not_reorder_the_list(
        store: ConversationStore) -> None:
    first, second = store.create_conversation("first"), store.create_conversation("second")
    store.append_user_message(first.id, "A question")
    store.append_user_message(second.id, "Another question")
    reply = store.start_assistant_message(first.id)

    def titles() -> list[str | None]:
        return [c.title for c in store.list_conversations()]

    assert titles() == ["second", "first"]

    store.update_streaming(reply.id, "Half an answer")
    store.finish_message(reply.id, "A whole answer", "tool_calls",
                         parts=ReplyParts(tool_calls=(ToolCall("call_1", "add", "{}"),)))
    store.append_tool_message(reply.id, ToolCall("call_1", "add", "{}"), "3", "done")
    assert titles() == ["second", "first"]

    store.regenerate(reply.id)  # the user asked again: the chat is the latest active
    assert titles() == ["first", "second"]


def test_archived_conversations_are_listed_only_on_request(store: ConversationStore) -> None:
    kept, archived = store.create_conversation("kept"), store.create_conversation("archived")
    store.set_archived(archived.id, True)
    assert [c.id for c in store.list_conversations()] == [kept.id]
    assert {c.id for c in store.list_conversations(include_archived=True)} == {kept.id, archived.id}
    assert store.get_conversation(archived.id).archived


def test_rename(store: ConversationStore) -> None:
    c = store.create_conversation("before")
    store.rename(c.id, "  after  ")
    assert store.get_conversation(c.id).title == "after"


def test_soft_delete_hides_and_undo_restores(store: ConversationStore) -> None:
    c = store.create_conversation("oops")
    store.delete(c.id)
    assert store.list_conversations(include_archived=True) == []
    assert store.get_conversation(c.id).deleted_at is not None
    store.undo_delete(c.id)
    assert [x.id for x in store.list_conversations()] == [c.id]
    assert store.get_conversation(c.id).deleted_at is None


def test_purge_removes_conversation_and_its_messages(store: ConversationStore) -> None:
    c = store.create_conversation()
    m = store.append_user_message(c.id, "hello there")
    store.purge(c.id)
    with pytest.raises(ConversationNotFound):
        store.get_conversation(c.id)
    with pytest.raises(StoreError, match=str(m.id)):
        store.get_message(m.id)
    assert store.search("hello") == []


def test_deleted_conversations_are_listed_until_purged(store: ConversationStore) -> None:
    first, _alive, second = (store.create_conversation(t) for t in ("first", "alive", "second"))
    store.delete(second.id)
    store.delete(first.id)
    assert store.deleted_conversation_ids() == [first.id, second.id]
    store.purge(first.id)
    store.undo_delete(second.id)
    assert store.deleted_conversation_ids() == []


def test_purge_deleted_respects_age(store: ConversationStore) -> None:
    recent, alive = store.create_conversation("recent"), store.create_conversation("alive")
    store.delete(recent.id)
    assert store.purge_deleted(older_than=timedelta(days=30)) == 0
    assert store.purge_deleted() == 1
    assert [c.id for c in store.list_conversations()] == [alive.id]
    with pytest.raises(ConversationNotFound):
        store.get_conversation(recent.id)


def test_update_settings_changes_only_what_is_given(store: ConversationStore) -> None:
    c = store.create_conversation(model="a", system_prompt="old prompt")
    store.update_settings(c.id, sampling=SamplingSettings(temperature=1.0))
    loaded = store.get_conversation(c.id)
    assert (loaded.model, loaded.system_prompt) == ("a", "old prompt")
    assert loaded.sampling.temperature == 1.0
    store.update_settings(c.id, system_prompt=None, model="b")
    loaded = store.get_conversation(c.id)
    assert (loaded.model, loaded.system_prompt) == ("b", None)


@pytest.mark.parametrize(
    "call",
    [
        lambda s: s.get_conversation(999),
        lambda s: s.rename(999, "x"),
        lambda s: s.delete(999),
        lambda s: s.purge(999),
        lambda s: s.append_user_message(999, "hi"),
        lambda s: s.current_path(999),
        lambda s: s.save_open_tabs([999], None),
    ],
)
def test_unknown_conversation_id_raises_naming_it(store: ConversationStore, call) -> None:
    with pytest.raises(ConversationNotFound, match="999"):
        call(store)


def test_settings_round_trip_json_values(store: ConversationStore) -> None:
    assert store.get_setting("theme", "light") == "light"
    store.set_setting("theme", "dark")
    store.set_setting("window", {"w": 800, "h": 600, "panes": [1, 2]})
    store.set_setting("theme", "solarized")
    assert store.get_setting("theme") == "solarized"
    assert store.get_setting("window") == {"w": 800, "h": 600, "panes": [1, 2]}


def test_setting_that_is_not_json_raises(store: ConversationStore) -> None:
    with pytest.raises(StoreError, match="'bad'"):
        store.set_setting("bad", object())


def test_open_tabs_survive_a_restart_in_order(db_path: Path) -> None:
    with ConversationStore.open(db_path) as store:
        a, b, c = (store.create_conversation(t).id for t in "abc")
        store.save_open_tabs([c, a, b], active=a)
    with ConversationStore.open(db_path) as store:
        assert store.load_open_tabs() == ([c, a, b], a)


def test_open_tabs_skip_deleted_and_purged_conversations(store: ConversationStore) -> None:
    a, b, c = (store.create_conversation(t).id for t in "abc")
    store.save_open_tabs([a, b, c], active=b)
    store.delete(b)
    store.purge(c)
    assert store.load_open_tabs() == ([a], None)
    store.save_open_tabs([], None)
    assert store.load_open_tabs() == ([], None)


def test_db_path_comes_from_argument_then_env_then_user_data_dir(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("PAGODA_DB", str(tmp_path / "env.db"))
    assert resolve_db_path(tmp_path / "flag.db") == tmp_path / "flag.db"
    assert resolve_db_path() == tmp_path / "env.db"
    monkeypatch.delenv("PAGODA_DB")
    assert resolve_db_path() == default_db_path()
    assert default_db_path().name == "pagoda.db"
    assert "pagoda" in default_db_path().parent.name.lower()


def test_open_without_path_uses_pagoda_db_env(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("PAGODA_DB", str(tmp_path / "nested" / "env.db"))
    with ConversationStore.open() as store:
        assert store.path == tmp_path / "nested" / "env.db"
        store.create_conversation("x")
    assert (tmp_path / "nested" / "env.db").exists()
