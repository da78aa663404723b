"""Passages' vectors in the store (migration 0006): kept per embedding model, bounded, found
missing, joined with bm25 by reciprocal rank, and gone with their chat."""

from __future__ import annotations

import sqlite3

import numpy as np
import pytest

from pagoda.app.store import AttachmentChunk, NewAttachment, StoreError

PASSAGES = ["Oil use rose to forty litres a week in winter.",
            "The lens was cleaned on Tuesdays.",
            "Storms came from the north-west."]


def attach(store) -> tuple[int, int, list[int]]:
    cid = store.create_conversation().id
    message = store.append_user_message(cid, "Read this")
    chunks = tuple(AttachmentChunk(i, text) for i, text in enumerate(PASSAGES))
    attachment = store.add_attachment(message.id, NewAttachment("log.md", "markdown", 10,
                                                                "\n".join(PASSAGES), chunks))
    ids = [chunk_id for chunk_id, _ in store.chunks_without_vectors(attachment.id, "m", 10)]
    return cid, attachment.id, ids


def vector(*values: float) -> bytes:
    return np.array(values, dtype="<f4").tobytes()


def test_vectors_are_kept_per_model_and_the_missing_ones_named(store):
    _, attachment, ids = attach(store)
    assert len(ids) == 3
    store.add_chunk_vectors("m", [(ids[0], vector(1, 0)), (ids[2], vector(0, 1))])
    assert store.chunks_without_vectors(attachment, "m", 10) == [(ids[1], PASSAGES[1])]
    assert len(store.chunks_without_vectors(attachment, "other", 10)) == 3
    assert store.chunk_vectors(attachment, "m") == [(ids[0], vector(1, 0)),
                                                    (ids[2], vector(0, 1))]
    store.add_chunk_vectors("m", [(ids[0], vector(0.5, 0.5))])  # embedded again: replaced
    assert store.chunk_vectors(attachment, "m")[0] == (ids[0], vector(0.5, 0.5))


@pytest.mark.parametrize("rows, words", [
    ([(1, b"abc")], "not float32"),
    ([(1, b"")], "not float32"),
    ([(1, b"\0" * (4 * 16_385))], "at most 16,384"),
    ([(10_000, vector(1.0))], "no passage has id 10000"),
    ([(1, vector(1.0))] * 257, "at most 256 vectors"),
])
def test_vectors_out_of_bounds_are_refused(store, rows, words):
    attach(store)
    with pytest.raises(StoreError, match=words):
        store.add_chunk_vectors("m", rows)


def test_a_model_name_is_bounded(store):
    _, _, ids = attach(store)
    with pytest.raises(StoreError, match="1 to 512 characters"):
        store.add_chunk_vectors("x" * 513, [(ids[0], vector(1.0))])


def test_a_ranking_by_meaning_is_joined_with_the_words_ranking(store):
    _, attachment, ids = attach(store)
    by_meaning = store.search_passages([attachment], None, "", 3, ranked=[ids[2], ids[1]])
    assert [h.chunk.text for h in by_meaning] == [PASSAGES[2], PASSAGES[1]]
    joined = store.search_passages([attachment], '"lens"', "", 3, ranked=[ids[2], ids[1]])
    # The lens passage is first by words and second by meaning: first when joined.
    assert [h.chunk.text for h in joined] == [PASSAGES[1], PASSAGES[2]]


def test_a_ranking_naming_another_chats_passages_finds_nothing_of_them(store):
    _, _first, ids = attach(store)
    _, second, _ = attach(store)
    assert store.search_passages([second], None, "", 3, ranked=ids) == []


def test_purging_the_chat_deletes_its_vectors(store, db_path):
    cid, _attachment, ids = attach(store)
    store.add_chunk_vectors("m", [(i, vector(1.0)) for i in ids])
    store.delete(cid)
    store.purge(cid)
    with sqlite3.connect(db_path) as raw:
        assert raw.execute("SELECT count(*) FROM chunk_vectors").fetchone() == (0,)
