"""A chat's folders in the store: added (at most 8, each once), their files kept as documents
with no message, replaced when a file changes and forgotten when it goes, with their passages
and both search indexes; gone with their folder or their chat; and a database of revision
0004 upgraded with its attached documents, passages and search kept."""

import sqlite3
from pathlib import Path

import pytest
from alembic import command

from pagoda.app.store import AttachmentChunk, ConversationStore, NewAttachment, StoreError
from pagoda.app.store.database.connection import create_store_engine
from pagoda.app.store.database.migrate import (
    alembic_config,
    current_revision,
    head_revision,
    upgrade,
)
from pagoda.app.store.documents.folders import MAX_FOLDERS

LIGHTHOUSE = "The lighthouse keeper lit the lamp at dusk every evening."
SOLAR = "Solar panels on the roof gave 4.2 kW of capacity in the summer."
GREAT_WALL = "长城是中国古代的军事防御工程，全长两万多公里。"


def document(name: str, *passages: str) -> NewAttachment:
    chunks = tuple(AttachmentChunk(i, body) for i, body in enumerate(passages))
    text = "\n\n".join(passages)
    return NewAttachment(name, "markdown", len(text.encode()), text, chunks)


def indexed_ids(store: ConversationStore, index: str, match: str) -> list[int]:
    """The passage ids an FTS index itself holds for `match` (not joined with the passages)."""
    with sqlite3.connect(store.path) as raw:
        return [rowid for (rowid,) in raw.execute(
            f"SELECT rowid FROM {index} WHERE {index} MATCH ?", (match,))]


@pytest.fixture
def cid(store: ConversationStore) -> int:
    return store.create_conversation().id


def test_a_chat_keeps_its_folders_in_the_order_they_were_added(store, cid) -> None:
    notes = store.add_folder(cid, "/home/ana/notes")
    papers = store.add_folder(cid, "/home/ana/papers")
    assert [(f.id, f.path) for f in store.folders(cid)] == [(notes.id, "/home/ana/notes"),
                                                            (papers.id, "/home/ana/papers")]
    assert notes.conversation_id == cid and notes.added_at.tzinfo is not None
    assert store.folders(store.create_conversation().id) == []


def test_a_folder_is_added_once_and_a_chat_holds_at_most_eight(store, cid) -> None:
    store.add_folder(cid, "/data/0")
    with pytest.raises(StoreError, match="already one of this chat's folders"):
        store.add_folder(cid, "/data/0")
    for i in range(1, MAX_FOLDERS):
        store.add_folder(cid, f"/data/{i}")
    with pytest.raises(StoreError, match="at most 8 folders"):
        store.add_folder(cid, "/data/8")
    store.add_folder(store.create_conversation().id, "/data/0")  # another chat may have it


def test_a_folders_file_is_kept_with_its_mtime_size_and_passages(store, cid) -> None:
    folder = store.add_folder(cid, "/notes")
    kept = store.put_folder_file(folder.id, "log/keeper.md", 1_700_000_000_123_456_789, 120,
                                 document("log/keeper.md", LIGHTHOUSE, SOLAR))
    assert store.folder_files(folder.id) == [kept]
    assert (kept.source_path, kept.mtime_ns, kept.size, kept.num_chunks) == (
        "log/keeper.md", 1_700_000_000_123_456_789, 120, 2)
    hits = store.search_passages([kept.attachment_id], '"solar"')
    assert [(h.name, h.chunk.ordinal) for h in hits] == [("log/keeper.md", 1)]
    assert store.chat_folder_files(cid) == [kept]


def test_a_folders_files_are_not_a_messages_documents_nor_exported(store, cid) -> None:
    asked = store.append_user_message(cid, "What do my notes say?")
    attached = store.add_attachment(asked.id, document("brought.md", SOLAR))
    folder = store.add_folder(cid, "/notes")
    store.put_folder_file(folder.id, "keeper.md", 1, 10, document("keeper.md", LIGHTHOUSE))
    assert store.attachments(cid) == [attached]
    exported = store.export_json([cid])
    assert "keeper" not in exported and "brought.md" in exported
    (again,) = store.import_json(exported)
    assert [a.name for a in store.attachments(again)] == ["brought.md"]
    assert store.folders(again) == []


def test_a_changed_file_replaces_its_passages_in_both_indexes(store, cid) -> None:
    folder = store.add_folder(cid, "/notes")
    old = store.put_folder_file(folder.id, "a.md", 1, 10, document("a.md", LIGHTHOUSE,
                                                                   GREAT_WALL))
    new = store.put_folder_file(folder.id, "a.md", 2, 11, document("a.md", SOLAR))
    assert store.folder_files(folder.id) == [new] and new.attachment_id != old.attachment_id
    assert indexed_ids(store, "attachment_chunks_fts", '"lighthouse"') == []
    assert indexed_ids(store, "attachment_chunks_cjk", "长城") == []
    assert [h.attachment_id for h in store.search_passages([new.attachment_id], '"solar"')] == [
        new.attachment_id]
    with pytest.raises(StoreError):
        store.attachment_text(old.attachment_id)


def test_a_file_gone_from_the_folder_is_forgotten_with_its_passages(store, cid) -> None:
    folder = store.add_folder(cid, "/notes")
    store.put_folder_file(folder.id, "a.md", 1, 10, document("a.md", LIGHTHOUSE, GREAT_WALL))
    kept = store.put_folder_file(folder.id, "b.md", 1, 10, document("b.md", SOLAR))
    assert indexed_ids(store, "attachment_chunks_cjk", "长城") != []
    store.drop_folder_file(folder.id, "a.md")
    store.drop_folder_file(folder.id, "never-there.md")
    assert store.folder_files(folder.id) == [kept]
    assert indexed_ids(store, "attachment_chunks_fts", '"lighthouse"') == []
    assert indexed_ids(store, "attachment_chunks_cjk", "长城") == []


def test_removing_a_folder_removes_its_documents_and_their_index(store, cid) -> None:
    folder = store.add_folder(cid, "/notes")
    other = store.add_folder(cid, "/papers")
    store.put_folder_file(folder.id, "a.md", 1, 10, document("a.md", LIGHTHOUSE, GREAT_WALL))
    kept = store.put_folder_file(other.id, "b.md", 1, 10, document("b.md", SOLAR))
    assert indexed_ids(store, "attachment_chunks_fts", '"lighthouse"') != []
    store.remove_folder(folder.id)
    assert [f.id for f in store.folders(cid)] == [other.id]
    assert store.chat_folder_files(cid) == [kept]
    assert indexed_ids(store, "attachment_chunks_fts", '"lighthouse"') == []
    assert indexed_ids(store, "attachment_chunks_cjk", "长城") == []
    with pytest.raises(StoreError, match="was removed from its chat"):
        store.put_folder_file(folder.id, "a.md", 2, 10, document("a.md", LIGHTHOUSE))
    with pytest.raises(StoreError, match="was removed from its chat"):
        store.folder_files(folder.id)


def test_deleting_a_chat_for_good_deletes_its_folders_documents_and_index(store, cid) -> None:
    folder = store.add_folder(cid, "/notes")
    store.put_folder_file(folder.id, "a.md", 1, 10, document("a.md", LIGHTHOUSE, GREAT_WALL))
    store.purge(cid)
    with sqlite3.connect(store.path) as raw:
        counts = [raw.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
                  for table in ("chat_folders", "attachments", "attachment_chunks")]
    assert counts == [0, 0, 0]
    assert indexed_ids(store, "attachment_chunks_fts", '"lighthouse"') == []
    assert indexed_ids(store, "attachment_chunks_cjk", "长城") == []


def test_a_database_of_revision_0004_keeps_its_documents_passages_and_search(db_path: Path
                                                                             ) -> None:
    db_path.parent.mkdir(parents=True)
    upgrade(db_path, "0004")
    with sqlite3.connect(db_path) as raw:
        raw.executescript(f"""
            INSERT INTO conversations (id, title, created_at, updated_at, sampling, pinned,
                                       archived)
                VALUES (1, 'old', '2026-01-01 00:00:00', '2026-01-01 00:00:00', '{{}}', 0, 0);
            INSERT INTO messages (id, conversation_id, parent_id, role, content, created_at,
                                  status)
                VALUES (1, 1, NULL, 'user', 'what is in it?', '2026-01-01 00:00:00',
                        'complete');
            INSERT INTO conversation_leaves VALUES (1, 1);
            INSERT INTO attachments (id, conversation_id, message_id, name, kind, size_bytes,
                                     text, created_at)
                VALUES (4, 1, 1, 'log.md', 'markdown', 99, 'the log', '2026-01-01 00:00:00'),
                       (7, 1, 1, 'gone.md', 'markdown', 9, 'gone', '2026-01-01 00:00:00');
            DELETE FROM attachments WHERE id = 7;
            INSERT INTO attachment_chunks (id, attachment_id, ordinal, start, text)
                VALUES (1, 4, 0, 0, '{LIGHTHOUSE}'), (2, 4, 1, 60, '{GREAT_WALL}');
            INSERT INTO attachment_chunks_cjk (rowid, grams)
                VALUES (2, '长城 城是 是中 中国 国古 古代');
        """)
    with ConversationStore.open(db_path) as store:
        assert current_revision(db_path) == head_revision()
        (kept,) = store.attachments(1)
        assert (kept.id, kept.name, kept.message_id, kept.num_chunks) == (4, "log.md", 1, 2)
        assert [h.chunk.ordinal for h in store.search_passages([4], '"lighthouse"')] == [0]
        assert [h.chunk.ordinal for h in store.search_passages([4], None, "长城")] == [1]
        new = store.add_attachment(1, document("new.md", SOLAR))
        assert new.id == 8  # the counter survived the rebuild: 7 is never handed out again
        store.purge(1)
        assert indexed_ids(store, "attachment_chunks_fts", '"lighthouse"') == []
    with sqlite3.connect(db_path) as raw:
        assert raw.execute("PRAGMA foreign_key_check").fetchall() == []



def downgrade(path: Path, revision: str) -> None:
    """Alembic's downgrade, run as migrate.upgrade runs an upgrade (foreign keys off)."""
    engine = create_store_engine(path, foreign_keys=False, pooled=False)
    try:
        with engine.begin() as connection:
            config = alembic_config()
            config.attributes["connection"] = connection
            command.downgrade(config, revision)
    finally:
        engine.dispose()


def test_going_back_to_0004_keeps_attached_documents_and_is_refused_with_a_folder(
        db_path) -> None:
    with ConversationStore.open(db_path) as store:
        cid = store.create_conversation().id
        asked = store.append_user_message(cid, "What do my notes say?")
        attached = store.add_attachment(asked.id, document("brought.md", SOLAR))
        folder = store.add_folder(cid, "/notes")
    with pytest.raises(RuntimeError, match="remove them from their chats first"):
        downgrade(db_path, "0004")
    with ConversationStore.open(db_path) as store:
        store.remove_folder(folder.id)
    downgrade(db_path, "0004")
    assert current_revision(db_path) == "0004"
    with sqlite3.connect(db_path) as raw:
        assert raw.execute("SELECT id, name FROM attachments").fetchall() == [
            (attached.id, "brought.md")]
        assert raw.execute("PRAGMA foreign_key_check").fetchall() == []
