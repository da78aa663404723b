"""The widgets of images: the composer takes a pasted image as PNG (not as text) and shows the
waiting ones with a ✕ each; the paperclip offers images; the transcript draws a message's
images as thumbnails that open full size on a click, and says so where one cannot be read."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from PySide6.QtCore import QMimeData, QUrl
from PySide6.QtGui import QColor, QImage
from PySide6.QtWidgets import QFileDialog, QFrame, QPlainTextEdit, QTextBrowser, QToolButton

from pagoda.app.components.shared.view_models import ImageView, MessageView
from pagoda.app.qt.chat.composer import Composer
from pagoda.app.qt.chat.image_views import DAMAGED, THUMBNAIL_SIDE, png_bytes
from pagoda.app.qt.chat.transcript import TranscriptView

NOW = datetime(2026, 12, 7, tzinfo=UTC)


def picture(width: int, height: int) -> QImage:
    image = QImage(width, height, QImage.Format.Format_RGB32)
    image.fill(QColor(20, 120, 220))
    return image


def image_view(width: int = 240, height: int = 120, name: str = "sky.png") -> ImageView:
    return ImageView(name, "image/png", width, height, png_bytes(picture(width, height)))


@pytest.fixture
def composer(qtbot) -> Composer:
    widget = Composer()
    qtbot.addWidget(widget)
    widget.show()
    return widget


@pytest.fixture
def transcript(qtbot) -> TranscriptView:
    widget = TranscriptView()
    qtbot.addWidget(widget)
    widget.resize(600, 400)
    widget.show()
    return widget


def test_a_pasted_image_becomes_png_bytes_not_text(composer, qtbot):
    mime = QMimeData()
    mime.setImageData(picture(30, 20))
    box = composer.findChild(QPlainTextEdit, "composer")
    assert box.canInsertFromMimeData(mime)
    with qtbot.waitSignal(composer.image_pasted) as pasted:
        box.insertFromMimeData(mime)
    data = pasted.args[0]
    assert data.startswith(b"\x89PNG") and QImage.fromData(data).size().width() == 30
    assert composer.text() == ""


def test_pasted_text_is_still_text(composer, qtbot):
    mime = QMimeData()
    mime.setText("plain words")
    box = composer.findChild(QPlainTextEdit, "composer")
    with qtbot.assertNotEmitted(composer.image_pasted):
        box.insertFromMimeData(mime)
    assert composer.text() == "plain words"


def test_waiting_images_show_as_thumbnails_and_the_cross_takes_one_off(composer, qtbot):
    composer.show_images([image_view(name="a.png"), image_view(name="b.png")])
    tiles = [t for t in composer.findChildren(QFrame, "pendingImage") if t.isVisible()]
    assert len(tiles) == 2
    remove = tiles[1].findChild(QToolButton, "removeImage")
    assert remove.toolTip() == "Remove b.png"
    with qtbot.waitSignal(composer.image_removed) as removed:
        remove.click()
    assert removed.args == [1]
    composer.show_images([])
    qtbot.waitUntil(lambda: not composer.findChild(QFrame, "pendingImage"))


def test_the_paperclip_offers_images(composer):
    dialog = composer.choose_files()
    try:
        assert any("*.png" in f and "*.webp" in f for f in dialog.nameFilters())
        assert dialog.fileMode() == QFileDialog.FileMode.ExistingFiles
    finally:
        dialog.close()


def _image_links(view: TranscriptView) -> list[QUrl]:
    document = view.findChild(QTextBrowser).document()
    found, block = [], document.begin()
    while block.isValid():
        fragments = block.begin()
        while not fragments.atEnd():
            fmt = fragments.fragment().charFormat()
            if fmt.isImageFormat() and fmt.isAnchor():
                found.append(QUrl(fmt.anchorHref()))
            fragments += 1
        block = block.next()
    return found


def test_a_messages_images_are_thumbnails_that_open_full_size(transcript):
    wide, small = image_view(480, 240), image_view(40, 30, "icon.png")
    transcript.set_messages([MessageView(1, "user", "Look", NOW, images=(wide, small))])
    assert transcript.thumbnail_sizes(1) == [(THUMBNAIL_SIDE, THUMBNAIL_SIDE // 2), (40, 30)]
    transcript.findChild(QTextBrowser).anchorClicked.emit(_image_links(transcript)[0])
    assert transcript.viewer.isVisible()
    assert transcript.viewer.windowTitle() == "sky.png"
    assert (transcript.viewer.shown_size().width(), transcript.viewer.shown_size().height()) == (
        480, 240)


def test_an_image_that_cannot_be_read_is_said_in_words(transcript):
    damaged = ImageView("old.png", "image/png", 10, 10, b"\x89PNG not really")
    transcript.set_messages([MessageView(1, "user", "Look", NOW, images=(damaged,))])
    assert transcript.thumbnail_sizes(1) == []
    assert f"old.png: {DAMAGED}" in transcript.plain_text()
