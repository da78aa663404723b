"""Images in a chat without a window: pasted, dropped or chosen into the composer, refused in
words when they cannot be used, sent with the message and kept with it, counted in the meter,
and, for a model that takes text only, refused before sending with nothing lost."""

from __future__ import annotations

import asyncio
import io

from PIL import Image

from pagoda.app.backends import ChatImage, ImageCost, ImageInput
from pagoda.app.backends.images import LIMITS
from tests.app.components.fake_backend import WAIT_S

TEXT_ONLY = ImageInput(False, why="fake-model takes text only")


def png(width: int = 56, height: int = 28, colour=(250, 0, 0)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), colour).save(buffer, format="PNG")
    return buffer.getvalue()


def pending(view) -> list:
    return view.called("show_pending_images")[-1][0]


async def test_a_pasted_image_waits_in_the_composer_and_goes_with_the_message(session, backend,
                                                                               store, view):
    await session.files.paste_image(png())
    assert [(v.name, v.width, v.height) for v in pending(view)] == [("pasted image", 56, 28)]

    task = session.spawn(session.send("What colour is this?"))
    request = await backend.next_request()
    (asked,) = request.messages
    assert asked.content == "What colour is this?"
    assert [(i.mime_type, i.width, i.height, i.data) for i in asked.images] == [
        ("image/png", 56, 28, png())]
    await request.say("Red.", "stop")
    await asyncio.wait_for(task, WAIT_S)

    assert pending(view) == []  # the composer is left empty
    user = store.current_path(session.conversation_id)[0]
    assert [k.image.data for k in user.images] == [png()]
    shown = session.views[0]
    assert [(v.name, v.data) for v in shown.images] == [("pasted image", png())]


async def test_image_files_become_images_and_other_files_documents(session, view, tmp_path):
    photo = tmp_path / "leaf.png"
    photo.write_bytes(png(28, 28, (0, 200, 0)))
    await session.files.attach([str(photo)])
    assert [v.name for v in pending(view)] == ["leaf.png"]
    assert view.called("show_pending_attachments") == []  # not read as a document


async def test_a_damaged_image_is_refused_in_words_and_not_added(session, view, tmp_path):
    broken = tmp_path / "broken.png"
    broken.write_bytes(png()[:50])
    await session.files.attach([str(broken)])
    assert session.files.images.images == []
    assert "broken.png is not a whole PNG image" in view.notices[-1]


async def test_a_too_large_image_file_is_refused_before_it_is_read(session, view, tmp_path):
    huge = tmp_path / "huge.png"
    with open(huge, "wb") as f:
        f.truncate(LIMITS.max_bytes + 1)  # sparse: nothing is written, nothing need be read
    await session.files.attach([str(huge)])
    assert session.files.images.images == []
    assert "huge.png is 20.0 MB, over the 20.0 MB" in view.notices[-1]


async def test_a_text_only_model_says_so_when_an_image_is_attached(session, backend, view):
    backend.image_input = TEXT_ONLY
    await session.files.paste_image(png())
    assert "fake-model takes text only" in view.notices[-1]


async def test_a_text_only_model_refuses_the_send_and_keeps_text_and_image(session, backend,
                                                                           store, view):
    backend.image_input = TEXT_ONLY
    await session.files.paste_image(png())
    await session.send("What is this?")
    assert backend.requests == []
    assert store.current_path(session.conversation_id) == []
    assert view.drafts[-1] == "What is this?"
    assert len(session.files.images.images) == 1
    assert "Your message and its images stay in the box" in view.notices[-1]


async def test_a_removed_image_is_not_sent(session, backend, view):
    await session.files.paste_image(png(colour=(1, 1, 1)))
    await session.files.paste_image(png(colour=(2, 2, 2)))
    session.files.remove_pending_image(0)
    assert len(pending(view)) == 1
    task = session.spawn(session.send("Which one?"))
    request = await backend.next_request()
    assert [i.data for i in request.messages[0].images] == [png(colour=(2, 2, 2))]
    await request.finish()
    await asyncio.wait_for(task, WAIT_S)


async def test_the_meter_counts_a_pending_image_at_the_backends_cost(session, backend):
    await session.count_draft("one two")
    text_only = session.context_usage[0]
    await session.files.paste_image(png(280, 140))
    expected = ImageCost(exact=True).tokens(280, 140)
    assert session.context_usage[0] == text_only + expected


async def test_a_sent_image_is_counted_in_the_branch(session, backend):
    await session.files.paste_image(png(280, 140))
    task = session.spawn(session.send("one two"))
    request = await backend.next_request()
    await request.finish()
    await asyncio.wait_for(task, WAIT_S)
    await session.refresh_context_meter()
    assert session.context_usage[0] == 2 + ImageCost(exact=True).tokens(280, 140)


async def test_a_text_only_model_refuses_a_chat_whose_branch_holds_images(session, backend,
                                                                          store, view):
    await session.files.paste_image(png())
    task = session.spawn(session.send("What is this?"))
    request = await backend.next_request()
    await request.say("A red square.", "stop")
    await asyncio.wait_for(task, WAIT_S)

    backend.image_input = TEXT_ONLY  # the chat moved to a model that takes text only
    await session.send("And now?")
    assert len(backend.requests) == 1
    assert "earlier messages hold images" in view.notices[-1]
    assert view.drafts[-1] == "And now?"
    assert len(store.current_path(session.conversation_id)) == 2


async def test_an_image_the_store_refuses_stays_in_the_box_with_the_text(session, backend,
                                                                         store, view):
    """The store keeps PNG, JPEG, WebP and GIF; an image of another type (which the reader
    never lets through) is refused there in words, and nothing is lost or sent."""
    session.files.images.images.append(ChatImage("image/bmp", b"BM", 1, 1, "odd.bmp"))
    await session.send("Look")
    assert backend.requests == []
    assert store.current_path(session.conversation_id) == []
    assert view.drafts[-1] == "Look"
    assert [i.name for i in session.files.images.images] == ["odd.bmp"]
    assert "odd.bmp is image/bmp" in view.notices[-1]
