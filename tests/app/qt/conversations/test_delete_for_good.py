"""Deleting a chat: Undo brings it back for a few seconds; after that (or when the app closes)
it is gone for good, and so are the blocks of it the prefix cache kept on disk that no other
chat used."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pagoda.app.store import ConversationNotFound, SamplingSettings

UNDO_S = 1
SHORT = SamplingSettings(temperature=0.0, max_tokens=24, repetition_penalty=1.0)


def kv_files() -> set[Path]:
    return set(Path(os.environ["PAGODA_KV_CACHE_DIR"]).rglob("*.kv"))


def listed_blocks(conversation_id: int) -> set[Path]:
    """The block files the chat's cache tag lists."""
    folder = Path(os.environ["PAGODA_KV_CACHE_DIR"])
    hashes = set()
    for tag_file in folder.rglob(f"conversation-{conversation_id}.hashes"):
        hashes |= set(tag_file.read_text().split())
    return {p for p in folder.rglob("*.kv") if p.stem in hashes}


@pytest.fixture
def window(make_disk_window, monkeypatch):
    """A window over a real engine keeping its prefix cache on disk, with an Undo window of one
    second."""
    monkeypatch.setattr("pagoda.app.qt.conversations.chat_list.UNDO_SECONDS", UNDO_S)
    return make_disk_window()


def chat(window, qtbot, run_async, text: str) -> int:
    """A new chat with one short reply; returns its id once its blocks are on disk."""
    conversation = window.db.store.create_conversation(sampling=SHORT)
    run_async(window.chat_tabs.open_conversation(conversation.id))
    controller = window.chat_tabs.current_controller()
    run_async(controller.session.send(text))
    qtbot.waitUntil(lambda: not controller.is_streaming, timeout=60_000)
    assert window.host.backend.flush_disk_cache()
    cid = controller.session.conversation_id
    assert listed_blocks(cid)
    return cid


def test_a_chat_deleted_for_good_leaves_no_block_of_its_own_on_disk(window, qtbot, run_async):
    kept = chat(window, qtbot, run_async, "Tell me about lighthouses. " * 12)
    deleted = chat(window, qtbot, run_async, "Explain how tides work, step by step. " * 12)
    kept_blocks, deleted_blocks = listed_blocks(kept), listed_blocks(deleted)
    own_blocks = deleted_blocks - kept_blocks
    assert own_blocks

    run_async(window.chat_list.delete(deleted))
    assert own_blocks <= kv_files()  # Undo can still bring it back, blocks and all
    qtbot.waitUntil(lambda: not own_blocks & kv_files(), timeout=(UNDO_S + 10) * 1000)

    assert kept_blocks <= kv_files()  # the other chat's, those it shared included
    assert not list(Path(os.environ["PAGODA_KV_CACHE_DIR"]).rglob(f"conversation-{deleted}.*"))
    with pytest.raises(ConversationNotFound):
        run_async(window.db.get_conversation(deleted))


def test_undo_keeps_the_chat_and_its_blocks(window, qtbot, run_async):
    cid = chat(window, qtbot, run_async, "Tell me about lighthouses. " * 12)
    blocks = listed_blocks(cid)

    run_async(window.chat_list.delete(cid))
    run_async(window.chat_list.undo_delete(cid))
    qtbot.wait((UNDO_S + 1) * 1000)

    assert blocks <= kv_files()
    assert run_async(window.db.get_conversation(cid)).id == cid


def test_closing_the_app_within_the_undo_window_deletes_for_good(window, qtbot, run_async):
    cid = chat(window, qtbot, run_async, "Tell me about lighthouses. " * 12)
    blocks = listed_blocks(cid)

    run_async(window.chat_list.delete(cid))
    window.close()

    assert not blocks & kv_files()
    with pytest.raises(ConversationNotFound):
        window.db.store.get_conversation(cid)


def test_a_chat_a_crash_left_deleted_is_deleted_for_good_at_the_next_start(window_on, tmp_path,
                                                                             qtbot):
    from pagoda.app.store import ConversationStore
    from pagoda.engine.disk_cache.store import DiskBlockStore

    store = ConversationStore.open(tmp_path / "chats.db")
    cid = store.create_conversation("deleted just before the crash").id
    store.delete(cid)
    store.close()
    blocks = DiskBlockStore(Path(os.environ["PAGODA_KV_CACHE_DIR"]), "ab" * 16, 1 << 20)
    blocks.save([(bytes([1]) * 16, (1,), b"kv" * 100)])
    blocks.record_tags({f"conversation-{cid}": [bytes([1]) * 16]})

    window = window_on(tmp_path / "chats.db")

    qtbot.waitUntil(lambda: not kv_files(), timeout=10_000)
    with pytest.raises(ConversationNotFound):
        window.db.store.get_conversation(cid)
