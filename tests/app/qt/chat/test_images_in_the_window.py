"""Images in the window (issue 57): an image pasted with Ctrl+V waits as a thumbnail in the
composer, goes to the server with the question, and after the app is closed and opened again
is still on the message, where a click opens it full size; a chat on the model of this
computer, which takes text only, says so before sending and keeps the text and the image.

The server is the fake one in vLLM's shape (it takes whatever it is sent, as a server whose
model sees images does); the local engine is a fake, text-only as every model here is today."""

import pytest
from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
from PySide6.QtGui import QColor, QDragEnterEvent, QDropEvent, QGuiApplication, QImage
from PySide6.QtWidgets import QApplication, QFrame, QLabel, QPlainTextEdit

from pagoda.app.qt.chat.image_views import THUMBNAIL_SIDE
from pagoda.app.qt.models.models_controller import SERVER_ITEM_PREFIX

WAIT_MS = 10_000
PHOTO = (300, 200)


def _photo() -> QImage:
    image = QImage(*PHOTO, QImage.Format.Format_RGB32)
    image.fill(QColor(200, 40, 40))
    return image


@pytest.fixture
def clipboard(qapp):
    """The clipboard, emptied after the test (Qt's offscreen clipboard left holding an image
    crashes the process at exit)."""
    board = QGuiApplication.clipboard()
    yield board
    board.clear()


def _paste_photo(controller, qtbot, clipboard) -> None:
    """Ctrl+V in the message box with an image on the clipboard (a screenshot, say)."""
    mime = QMimeData()
    mime.setImageData(_photo())
    clipboard.setMimeData(mime)
    box = controller.view.composer.findChild(QPlainTextEdit, "composer")
    box.setFocus()
    qtbot.keyClick(box, Qt.Key.Key_V, Qt.KeyboardModifier.ControlModifier)
    qtbot.waitUntil(lambda: len(controller.session.files.images.images) == 1, timeout=WAIT_MS)


def _waiting_tiles(controller) -> list[QFrame]:
    return [tile for tile in controller.view.composer.findChildren(QFrame, "pendingImage")
            if tile.isVisibleTo(controller.view.composer)]


def _pick_server(window, run_async, url: str) -> None:
    from fake_server import MODEL
    connection = run_async(window.sources.saved.add(url, MODEL, None))
    window.models_controller.refresh_picker()
    window.models_controller.picked(
        window.model_picker.findData(SERVER_ITEM_PREFIX + connection.id))


def test_paste_an_image_ask_reopen_the_app_and_the_image_is_still_on_the_message(
        window_on, fake_vllm, qtbot, run_async, tmp_path, clipboard):
    fake, url = fake_vllm
    db_path = tmp_path / "chats.db"
    window = window_on(db_path)
    _pick_server(window, run_async, url)
    controller = window.chat_tabs.current_controller()

    _paste_photo(controller, qtbot, clipboard)
    qtbot.waitUntil(lambda: len(_waiting_tiles(controller)) == 1, timeout=WAIT_MS)
    assert controller.view.composer.text() == ""  # the image is not pasted as text

    controller.view.composer.send_requested.emit("What colour is this?")
    qtbot.waitUntil(lambda: controller.is_streaming, timeout=WAIT_MS)
    qtbot.waitUntil(lambda: not controller.is_streaming, timeout=WAIT_MS)
    text, part = fake.requests[-1]["messages"][-1]["content"]
    assert text["text"] == "What colour is this?"
    assert part["image_url"]["url"].startswith("data:image/png;base64,")
    assert _waiting_tiles(controller) == []
    asked = window.db.store.current_path(controller.conversation_id)[0]
    window.close()
    window.db.close()  # as the app does at exit: the next start takes the database's lock

    again = window_on(db_path)
    transcript = again.chat_tabs.current_controller().view.transcript
    assert transcript.thumbnail_sizes(asked.id) == [(THUMBNAIL_SIDE,
                                                     THUMBNAIL_SIDE * PHOTO[1] // PHOTO[0])]
    transcript.open_image(asked.id, 0)
    assert transcript.viewer.isVisible()
    assert (transcript.viewer.shown_size().width(),
            transcript.viewer.shown_size().height()) == PHOTO


def test_a_text_only_model_says_so_before_sending_and_keeps_text_and_image(window_on, qtbot,
                                                                           tmp_path, clipboard):
    window = window_on(tmp_path / "chats.db")
    controller = window.chat_tabs.current_controller()
    _paste_photo(controller, qtbot, clipboard)
    notice = controller.view.findChild(QLabel, "notice")
    qtbot.waitUntil(lambda: "takes text only" in notice.text(), timeout=WAIT_MS)

    controller.view.composer.set_text("What colour is this?")
    controller.view.composer.findChild(QPlainTextEdit, "composer").setFocus()
    qtbot.keyClick(controller.view.composer.findChild(QPlainTextEdit, "composer"),
                   Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: "stay in the box" in notice.text(), timeout=WAIT_MS)
    assert controller.view.composer.text() == "What colour is this?"
    assert len(_waiting_tiles(controller)) == 1
    assert window.db.store.current_path(controller.conversation_id) == []


def _drop_files(target, *paths) -> None:
    """Drag files from a file manager over `target` and let go."""
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(path)) for path in paths])
    point = target.rect().center()
    QApplication.sendEvent(target, QDragEnterEvent(point, Qt.DropAction.CopyAction, mime,
                                                   Qt.MouseButton.LeftButton,
                                                   Qt.KeyboardModifier.NoModifier))
    QApplication.sendEvent(target, QDropEvent(QPointF(point), Qt.DropAction.CopyAction, mime,
                                              Qt.MouseButton.LeftButton,
                                              Qt.KeyboardModifier.NoModifier))


def test_an_image_file_dropped_on_the_chat_waits_as_a_thumbnail(window_on, qtbot, tmp_path):
    window = window_on(tmp_path / "chats.db")
    controller = window.chat_tabs.current_controller()
    photo = tmp_path / "photo.jpg"
    assert _photo().save(str(photo), "JPEG")
    _drop_files(controller.view.transcript.drop_area(), photo)
    qtbot.waitUntil(lambda: len(_waiting_tiles(controller)) == 1, timeout=WAIT_MS)
    (waiting,) = controller.session.files.images.images
    assert (waiting.name, waiting.mime_type, waiting.width, waiting.height) == (
        "photo.jpg", "image/jpeg", *PHOTO)
