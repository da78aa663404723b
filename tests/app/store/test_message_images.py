"""Images kept with a user's message (migration 0007): read back with the branch, bounded,
carried over by an edit, exported and imported with their chat, gone with it."""

import base64
import io
import json
import sqlite3

import pytest
from alembic import command
from PIL import Image

from pagoda.app.store import (
    MAX_IMAGE_BYTES,
    ConversationStore,
    ImageRefusedError,
    ImportValidationError,
    NewImage,
    StoreError,
)
from pagoda.app.store.database.connection import create_store_engine
from pagoda.app.store.database.migrate import (
    alembic_config,
    current_revision,
    head_revision,
    upgrade,
)


def png(width: int = 3, height: int = 2, colour=(200, 30, 40)) -> NewImage:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), colour).save(buffer, format="PNG")
    return NewImage("photo.png", "image/png", width, height, buffer.getvalue())


def test_an_image_is_kept_with_its_message_and_read_back_with_the_branch(store) -> None:
    cid = store.create_conversation().id
    first, second = png(), png(5, 4, (0, 0, 255))
    sent = store.append_user_message(cid, "What is in these?", [first, second])
    assert [kept.image for kept in sent.images] == [first, second]
    (message,) = store.current_path(cid)
    assert [kept.image for kept in message.images] == [first, second]
    assert Image.open(io.BytesIO(message.images[1].image.data)).size == (5, 4)


def test_an_image_over_the_bound_is_refused_in_words_and_nothing_is_kept(store) -> None:
    cid = store.create_conversation().id
    huge = NewImage("scan.png", "image/png", 100, 100, b"\x89PNG" + bytes(MAX_IMAGE_BYTES))
    with pytest.raises(ImageRefusedError, match=r"scan\.png is 20\.0 MB, over the 20\.0 MB"):
        store.append_user_message(cid, "Look", [huge])
    assert store.current_path(cid) == []


def test_a_type_the_store_does_not_keep_is_refused(store) -> None:
    cid = store.create_conversation().id
    with pytest.raises(ImageRefusedError, match="image/bmp"):
        store.append_user_message(cid, "Look", [NewImage("a.bmp", "image/bmp", 1, 1, b"BM")])


def test_images_come_only_with_a_users_message(store) -> None:
    cid = store.create_conversation().id
    asked = store.append_user_message(cid, "hi")
    reply = store.start_assistant_message(cid, asked.id)
    with pytest.raises(StoreError, match="assistant message"):
        store.add_images(reply.id, [png()])


def test_an_edited_question_keeps_the_originals_images(store) -> None:
    cid = store.create_conversation().id
    asked = store.append_user_message(cid, "What colour?", [png()])
    edited = store.edit_user_message(asked.id, "Which colour is it?")
    assert edited.id != asked.id
    (message,) = store.current_path(cid)
    assert message.id == edited.id and [k.image for k in message.images] == [png()]


def _images_in_file(db_path) -> int:
    with sqlite3.connect(db_path) as connection:
        return connection.execute("SELECT COUNT(*) FROM message_images").fetchone()[0]


def test_images_go_with_their_chat(store, db_path) -> None:
    cid = store.create_conversation().id
    store.append_user_message(cid, "Look", [png()])
    assert _images_in_file(db_path) == 1
    store.purge(cid)
    assert _images_in_file(db_path) == 0


def test_an_export_and_import_keep_the_images(store, tmp_path) -> None:
    cid = store.create_conversation().id
    store.append_user_message(cid, "Look", [png(), png(7, 7, (9, 9, 9))])
    exported = store.export_json([cid])
    with ConversationStore.open(tmp_path / "other.db") as other:
        (new_cid,) = other.import_json(exported)
        (message,) = other.current_path(new_cid)
        assert [k.image for k in message.images] == [png(), png(7, 7, (9, 9, 9))]
        assert other.export_json([new_cid]) == exported
    (again,) = store.import_json(exported)  # beside the original: new ids, same images
    assert [k.image for k in store.current_path(again)[0].images] == [png(),
                                                                      png(7, 7, (9, 9, 9))]


def test_the_markdown_export_names_the_images(store) -> None:
    cid = store.create_conversation().id
    store.append_user_message(cid, "Look", [png()])
    assert "*Image: photo.png (3 x 2)*" in store.export_markdown(cid)


def _export_with_image(store, **changes) -> str:
    cid = store.create_conversation().id
    store.append_user_message(cid, "Look", [png()])
    document = json.loads(store.export_json([cid]))
    document["conversations"][0]["messages"][0]["images"][0].update(changes)
    return json.dumps(document)


@pytest.mark.parametrize(("changes", "words"), [
    ({"data": "not base64!"}, "is not base64"),
    ({"data": "A" * (MAX_IMAGE_BYTES // 3 * 4 + 8)}, "over the"),
    ({"mime_type": "image/svg+xml"}, "mime_type"),
    ({"width": 0}, "width"),
])
def test_an_import_with_a_wrong_image_is_refused_before_anything_is_kept(store, changes,
                                                                         words) -> None:
    text = _export_with_image(store, **changes)
    before = len(store.list_conversations())
    with pytest.raises(ImportValidationError, match=words):
        store.import_json(text)
    assert len(store.list_conversations()) == before


def test_an_import_refuses_images_on_a_reply(store) -> None:
    cid = store.create_conversation().id
    asked = store.append_user_message(cid, "Look")
    store.finish_message(store.start_assistant_message(cid, asked.id).id, "ok", "stop")
    document = json.loads(store.export_json([cid]))
    image = {"id": 1, "name": "a.png", "mime_type": "image/png", "width": 1, "height": 1,
             "data": base64.b64encode(png().data).decode()}
    document["conversations"][0]["messages"][1]["images"] = [image]
    with pytest.raises(ImportValidationError, match="come with a user's message"):
        store.import_json(json.dumps(document))


def test_a_database_of_revision_0006_upgrades_and_its_chats_take_images(db_path) -> None:
    db_path.parent.mkdir(parents=True)
    upgrade(db_path, "0006")
    with sqlite3.connect(db_path) as raw:
        raw.executescript("""
            INSERT INTO conversations (id, title, created_at, updated_at, sampling, pinned,
                                       archived)
                VALUES (1, 'old', '2026-01-01 00:00:00', '2026-01-01 00:00:00', '{}', 0, 0);
            INSERT INTO messages (id, conversation_id, parent_id, role, content, created_at,
                                  status)
                VALUES (1, 1, NULL, 'user', 'an old question', '2026-01-01 00:00:00',
                        'complete');
            INSERT INTO conversation_leaves VALUES (1, 1);
        """)
    with ConversationStore.open(db_path) as store:
        assert current_revision(db_path) == head_revision() == "0007"
        (old,) = store.current_path(1)
        assert (old.content, old.images) == ("an old question", ())
        store.add_images(1, [png()])
        assert [k.image for k in store.current_path(1)[0].images] == [png()]


def _downgrade(path, revision: str) -> None:
    """Alembic's downgrade, run as migrate.upgrade runs an upgrade (foreign keys off)."""
    engine = create_store_engine(path, foreign_keys=False, pooled=False)
    try:
        with engine.begin() as connection:
            config = alembic_config()
            config.attributes["connection"] = connection
            command.downgrade(config, revision)
    finally:
        engine.dispose()


def test_going_back_to_0006_is_refused_while_a_message_holds_an_image(db_path) -> None:
    with ConversationStore.open(db_path) as store:
        cid = store.create_conversation().id
        store.append_user_message(cid, "Look", [png()])
    with pytest.raises(RuntimeError, match="delete their chats first"):
        _downgrade(db_path, "0006")
    assert _images_in_file(db_path) == 1
    with ConversationStore.open(db_path) as store:
        store.purge(cid)
    _downgrade(db_path, "0006")
    assert current_revision(db_path) == "0006"
