"""Images in the window (issue 57): an image pasted with Ctrl+V waits as a thumbnail in the
composer, goes to a model that sees it with the question, and after the app is closed and
opened again is still on the message, where a click opens it full size; a chat on a model that
takes text only says so before sending and keeps the text and the image.

The model that sees images is a tiny multimodal Gemma 3 served by Pagoda's own server (random
weights: its reply is no sentence, but the image goes through the tower); the window's local
engine is a fake, text-only."""

import pytest
from fake_server import MODEL
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


@pytest.fixture(scope="module")
def seeing_server(tmp_path_factory):
    """Pagoda's server over the tiny multimodal Gemma 3, and the images its tower encodes."""
    from pagoda.engine import LLM
    from pagoda.engine.async_engine import AsyncEngine
    from pagoda.engine.server.api import build_app
    from pagoda.engine.server.runner import ServerThread
    from pagoda.engine.server.served import ServedModel
    from tests.engine.multimodal.test_gemma3_images import CountingEncoder
    from tests.engine.tiny_vision import save_gemma3_as_released, tiny_gemma3_vision

    folder = save_gemma3_as_released(tiny_gemma3_vision(), tmp_path_factory.mktemp("gemma3"))
    engine = AsyncEngine(engine=LLM(str(folder), num_threads=1, num_kv_blocks=64).engine)
    tower, encoded = engine.engine.runner.image_tower, []
    tower.encoder = CountingEncoder(tower.encoder, encoded)
    served = ServedModel(MODEL, engine, engine.max_model_len)
    server = ServerThread(build_app(lambda: served)).start()
    yield server.url + "/v1", encoded
    server.stop()
    engine.shutdown()


def _pick_server(window, run_async, url: str) -> None:
    connection = run_async(window.sources.saved.add(url, MODEL, None))
    window.models_controller.refresh_picker()
    window.models_controller.picked(
        window.model_picker.findData(SERVER_ITEM_PREFIX + connection.id))


def test_paste_an_image_ask_reopen_the_app_and_the_image_is_still_on_the_message(
        window_on, seeing_server, qtbot, run_async, tmp_path, clipboard):
    url, encoded = seeing_server
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
    assert encoded == [1]  # the model's tower saw the one image
    assert _waiting_tiles(controller) == []
    asked, answered = window.db.store.current_path(controller.conversation_id)
    assert asked.content == "What colour is this?" and answered.role == "assistant"
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
