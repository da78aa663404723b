"""Text SQLite cannot take as it is: lone surrogates become U+FFFD, NUL is kept and searchable."""

import pytest

from pagoda.app.store import ConversationStore, SamplingSettings

BROKEN = "half an emoji \ud83d and a stray \udc00 here"
REPAIRED = "half an emoji \ufffd and a stray \ufffd here"


def test_lone_surrogates_in_a_user_message_become_replacement_characters(
    store: ConversationStore,
) -> None:
    cid = store.create_conversation().id
    sent = store.append_user_message(cid, BROKEN)
    assert sent.content == REPAIRED
    assert store.get_message(sent.id).content == REPAIRED
    assert store.get_conversation(cid).title == REPAIRED
    edited = store.edit_user_message(sent.id, "again \ud800")
    assert store.get_message(edited.id).content == edited.content == "again \ufffd"


def test_lone_surrogates_in_a_streamed_reply_become_replacement_characters(
    store: ConversationStore,
) -> None:
    cid = store.create_conversation().id
    store.append_user_message(cid, "q")
    reply = store.start_assistant_message(cid, model="model \udfff")
    store.update_streaming(reply.id, "partial \ud800")
    assert store.get_message(reply.id).content == "partial \ufffd"
    store.finish_message(reply.id, BROKEN, "stop \ud800")
    done = store.get_message(reply.id)
    assert (done.content, done.finish_reason) == (REPAIRED, "stop \ufffd")
    assert done.stats is not None and done.stats.model == "model \ufffd"
    failed = store.regenerate(reply.id)
    store.fail_message(failed.id, BROKEN, "engine said \udc80")
    assert store.get_message(failed.id).error == "engine said \ufffd"


def test_lone_surrogates_in_titles_and_prompts_become_replacement_characters(
    store: ConversationStore,
) -> None:
    created = store.create_conversation(BROKEN, model="m\ud800", system_prompt=BROKEN)
    assert (created.title, created.model, created.system_prompt) == (REPAIRED, "m\ufffd", REPAIRED)
    store.rename(created.id, "renamed \ud800")
    store.update_settings(created.id, system_prompt="be \udbff brief", sampling=SamplingSettings())
    again = store.get_conversation(created.id)
    assert (again.title, again.system_prompt) == ("renamed \ufffd", "be \ufffd brief")


def test_nul_characters_are_stored_and_returned_faithfully(store: ConversationStore) -> None:
    cid = store.create_conversation().id
    sent = store.append_user_message(cid, "before\x00after")
    reply = store.start_assistant_message(cid)
    store.finish_message(reply.id, "\x00 leading and trailing \x00", "stop")
    assert store.get_message(sent.id).content == "before\x00after"
    assert [m.content for m in store.current_path(cid)] == [
        "before\x00after",
        "\x00 leading and trailing \x00",
    ]


@pytest.fixture
def with_nul(store: ConversationStore) -> tuple[ConversationStore, int]:
    cid = store.create_conversation("plain").id
    store.append_user_message(cid, "hello world")
    store.append_user_message(cid, "nothing unusual in this one")
    other = store.create_conversation("odd").id
    mid = store.append_user_message(other, "a nul\x00inside here").id
    return store, mid


@pytest.mark.parametrize("query", ["\x00", "l\x00i", "nul\x00inside", "\x00inside here"])
def test_search_with_nul_finds_only_messages_containing_it(with_nul, query: str) -> None:
    store, mid = with_nul
    assert [h.message_id for h in store.search(query)] == [mid]


def test_search_with_nul_that_no_message_contains_finds_nothing(with_nul) -> None:
    store, _ = with_nul
    assert store.search("hello\x00") == [] and store.search("\x00\x00") == []


def test_search_with_lone_surrogates_finds_the_text_they_were_stored_as(
    store: ConversationStore,
) -> None:
    cid = store.create_conversation().id
    mid = store.append_user_message(cid, BROKEN).id
    store.append_user_message(cid, "nothing to see")
    assert [h.message_id for h in store.search("emoji \ud83d and")] == [mid]
    assert [h.message_id for h in store.search("\udc00")] == [mid]
    assert "<b>\ufffd</b>" in store.search("\ud800")[0].snippet
