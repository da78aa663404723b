"""The open tabs without a window: opening, closing, order and the current tab, kept in the store
for the next start; closing mid-reply and deleting an open chat. No Qt, no engine."""

from __future__ import annotations

import pytest

from pagoda.app.components.chat.chat_sources import LOCAL, ChatSources, RemoteSource
from pagoda.app.components.conversations.open_chats import LOCAL_INSTEAD, OpenChats
from pagoda.app.components.shared.connections import ConnectionKeys, SavedConnections
from tests.app.components.fake_backend import eventually


@pytest.fixture
def make_chats(db, source):
    async def make() -> OpenChats:
        sources = ChatSources(source, SavedConnections(db, ConnectionKeys.in_memory()), db)
        await sources.load()
        chats = OpenChats(db, sources)
        events = []
        chats.on_opened = lambda s: events.append(("opened", s.conversation_id))
        chats.on_closed = lambda cid: events.append(("closed", cid))
        chats.on_current = lambda cid: events.append(("current", cid))
        chats.on_purged = lambda cid: events.append(("purged", cid))
        chats.events = events
        return chats

    return make


async def test_a_first_start_opens_one_new_chat_and_keeps_the_list(make_chats, db):
    chats = await make_chats()
    await chats.restore()

    assert len(chats.ids) == 1 and chats.current == chats.ids[0]
    assert await db.load_open_tabs() == (chats.ids, chats.current)


async def test_tabs_come_back_in_their_order_with_the_current_one(make_chats, db):
    chats = await make_chats()
    await chats.restore()
    second = (await chats.new_chat()).conversation_id
    third = (await chats.new_chat()).conversation_id
    chats.move([third, chats.ids[0], second])
    chats.select(second)
    await chats.wait_idle()

    again = await make_chats()
    await again.restore()
    assert again.ids == [third, chats.ids[1], second]
    assert again.current == second
    assert [e for e in again.events if e[0] == "opened"] == [("opened", c) for c in again.ids]


async def test_closing_an_untouched_new_chat_leaves_nothing_behind(make_chats, db):
    chats = await make_chats()
    await chats.restore()
    kept = (await chats.new_chat()).conversation_id
    await db.rename(kept, "Kept")
    empty = chats.ids[0]

    await chats.close(empty)

    assert chats.ids == [kept] and chats.current == kept
    assert ("purged", empty) in chats.events
    assert [c.id for c in await db.list_conversations()] == [kept]
    assert await db.load_open_tabs() == ([kept], kept)


async def test_empty_new_chats_left_without_a_tab_are_removed_at_start(make_chats, db,
                                                                       tmp_path):
    left_empty = (await db.create_conversation()).id  # as a crash leaves one
    titled = (await db.create_conversation("Plans")).id
    with_folder = (await db.create_conversation()).id
    await db.add_folder(with_folder, str(tmp_path))
    written = (await db.create_conversation()).id
    await db.append_user_message(written, "Hello")

    chats = await make_chats()
    await chats.restore()

    kept = {c.id for c in await db.list_conversations()}
    assert left_empty not in kept and {titled, with_folder, written} <= kept


async def test_a_new_chat_given_a_folder_is_kept_when_its_tab_closes(make_chats, db, tmp_path):
    chats = await make_chats()
    await chats.restore()
    with_folder = chats.current
    await chats.sessions[with_folder].files.add_folder(str(tmp_path))
    await chats.new_chat()

    await chats.close(with_folder)

    assert ("purged", with_folder) not in chats.events
    assert [f.path for f in await db.folders(with_folder)] == [str(tmp_path.resolve())]


async def test_closing_the_current_tab_makes_its_right_neighbour_current(make_chats):
    chats = await make_chats()
    await chats.restore()
    first = chats.ids[0]
    second = (await chats.new_chat()).conversation_id
    third = (await chats.new_chat()).conversation_id
    chats.select(second)

    await chats.close(second)
    assert chats.current == third
    await chats.close(third)
    assert chats.current == first
    await chats.close(first)
    assert chats.current is None and chats.ids == []


async def test_closing_a_tab_mid_reply_keeps_the_reply_interrupted(make_chats, backend, db):
    chats = await make_chats()
    await chats.restore()
    session = chats.current_session
    task = session.spawn(session.send("Hello"))
    request = await backend.next_request()
    await request.say("Half a")

    await chats.close(session.conversation_id)
    await eventually(task.done, "the reply to end")
    db.drain()

    assert backend.aborted == [request.id]
    path = await db.current_path(session.conversation_id)
    assert [(m.role, m.content, m.status) for m in path] == [
        ("user", "Hello", "complete"), ("assistant", "Half a", "interrupted")]


async def test_deleting_an_open_chat_mid_reply_closes_it_first(make_chats, backend, db):
    chats = await make_chats()
    await chats.restore()
    session = chats.current_session
    cid = session.conversation_id
    task = session.spawn(session.send("Hello"))
    request = await backend.next_request()
    await request.say("Half")

    await chats.close(cid)
    await db.delete(cid)
    await eventually(task.done, "the reply to end")
    db.drain()

    assert cid not in chats.sessions and cid not in {c.id for c in await db.list_conversations()}
    assert [m.status for m in await db.current_path(cid)] == ["complete", "interrupted"]


async def test_a_new_chat_answers_from_where_the_current_one_does(make_chats, db, fake_vllm):
    _fake, address = fake_vllm
    chats = await make_chats()
    await chats.restore()
    connection = await chats.sources.saved.add(address, "llama-3-8b", None)
    first = chats.current_session
    assert first.use_source(chats.sources.source(connection.id))
    await chats.sources.choose(first.conversation_id, connection.id)

    second = await chats.new_chat()

    assert isinstance(second.source, RemoteSource)
    assert second.source.connection == connection
    again = await make_chats()
    await again.restore()
    assert all(isinstance(s.source, RemoteSource) for s in again.sessions.values())
    again.sources.shutdown()
    chats.sources.shutdown()


async def test_a_new_chat_answers_here_when_the_current_chats_server_is_down(make_chats, db,
                                                                           source,
                                                                           closed_port):
    chats = await make_chats()
    await chats.restore()
    connection = await chats.sources.saved.add(f"http://127.0.0.1:{closed_port}/v1", "gone",
                                               None)
    first = chats.current_session
    assert first.use_source(chats.sources.source(connection.id))
    await chats.sources.choose(first.conversation_id, connection.id)
    await first.send("Hello?")
    assert "Could not connect" in first.notice[0]

    second = await chats.new_chat()

    assert second.source is source
    assert chats.sources.chosen_for(second.conversation_id) == LOCAL
    assert second.notice == (LOCAL_INSTEAD.format(server=connection.label), False)
    chats.sources.shutdown()


async def test_a_new_chat_answers_here_when_the_server_stopped_since_its_last_reply(
        make_chats, db, source, closed_port):
    chats = await make_chats()
    await chats.restore()
    connection = await chats.sources.saved.add(f"http://127.0.0.1:{closed_port}/v1", "stopped",
                                               None)
    first = chats.current_session
    assert first.use_source(chats.sources.source(connection.id))
    await chats.sources.choose(first.conversation_id, connection.id)
    assert chats.sources.source(connection.id).unreachable is None  # nothing failed yet

    second = await chats.new_chat()

    assert second.source is source
    assert second.notice == (LOCAL_INSTEAD.format(server=connection.label), False)
    chats.sources.shutdown()


async def test_closing_everything_at_exit_keeps_the_list_for_the_next_start(make_chats, db,
                                                                            backend):
    chats = await make_chats()
    await chats.restore()
    await chats.new_chat()
    session = chats.current_session
    session.spawn(session.send("Hello"))
    await backend.next_request()

    chats.close_all()
    chats.save_now()
    db.drain()

    assert (await db.load_open_tabs()) == (chats.ids, chats.current)
    assert [m.status for m in await db.current_path(session.conversation_id)] == [
        "complete", "interrupted"]
