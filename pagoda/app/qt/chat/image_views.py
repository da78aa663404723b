"""Images on screen: a thumbnail made from an image's bytes, the strip of images waiting in the
composer (each with a ✕), and the viewer a click on a thumbnail opens, the image at full size
(scrolled where it is larger than the screen). Render and forward only."""

from __future__ import annotations

from PySide6.QtCore import QBuffer, QByteArray, QIODevice, QSize, Qt, Signal
from PySide6.QtGui import QGuiApplication, QImage, QPixmap
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QFrame,
    QHBoxLayout,
    QLabel,
    QScrollArea,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from pagoda.app.components.shared.view_models import ImageView

THUMBNAIL_SIDE = 96  # px: the longer side of a thumbnail, on a message or in the composer
DAMAGED = "This image cannot be shown: its data is damaged."


def thumbnail(data: bytes, side: int = THUMBNAIL_SIDE) -> QImage | None:
    """The image scaled to fit `side` x `side` (never enlarged); None where Qt cannot read it
    (an imported chat's damaged bytes)."""
    image = QImage.fromData(data)
    if image.isNull():
        return None
    if image.width() <= side and image.height() <= side:
        return image
    return image.scaled(side, side, Qt.AspectRatioMode.KeepAspectRatio,
                        Qt.TransformationMode.SmoothTransformation)


def png_bytes(image: QImage) -> bytes:
    """An image pasted from the clipboard, encoded as PNG (what the composer is given)."""
    encoded = QByteArray()
    buffer = QBuffer(encoded)
    buffer.open(QIODevice.OpenModeFlag.WriteOnly)
    image.save(buffer, "PNG")
    buffer.close()
    return bytes(encoded.data())


def size_text(view: ImageView) -> str:
    return f"{view.name} · {view.width} x {view.height} · {len(view.data) / 1024:,.0f} KB"


class PendingImages(QWidget):
    """The images waiting for the next message, as thumbnails; `removed(int)` when the ✕ of the
    one at that index is clicked. Hidden while there are none."""

    removed = Signal(int)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("pendingImages")
        self._row = QHBoxLayout(self)
        self._row.setContentsMargins(0, 0, 0, 0)
        self._row.addStretch(1)
        self.hide()

    def show_images(self, views: list[ImageView]) -> None:
        while self._row.count() > 1:
            widget = self._row.takeAt(0).widget()
            widget.deleteLater()
        for index, view in enumerate(views):
            self._row.insertWidget(index, self._tile(index, view))
        self.setVisible(bool(views))

    def _tile(self, index: int, view: ImageView) -> QFrame:
        tile = QFrame(self, objectName="pendingImage")
        picture = QLabel(tile, objectName="pendingThumbnail")
        image = thumbnail(view.data)
        if image is None:
            picture.setText("?")
        else:
            picture.setPixmap(QPixmap.fromImage(image))
        picture.setToolTip(size_text(view))
        remove = QToolButton(tile, text="✕", autoRaise=True, objectName="removeImage")
        remove.setToolTip(f"Remove {view.name}")
        remove.clicked.connect(lambda: self.removed.emit(index))
        row = QHBoxLayout(tile)
        row.setContentsMargins(2, 2, 2, 2)
        row.addWidget(picture)
        row.addWidget(remove, 0, Qt.AlignmentFlag.AlignTop)
        return tile


class ImageViewer(QDialog):
    """One image at full size, in a window no larger than the screen (scrolled beyond it).
    Non-modal: the chat stays usable beside it; opening another image shows it in its place."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("imageViewer")
        self.setModal(False)
        self._picture = QLabel(self, objectName="fullImage")
        self._picture.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self._scroll = QScrollArea(self)
        self._scroll.setWidget(self._picture)
        self._scroll.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self._caption = QLabel(self, objectName="imageCaption")
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close, self)
        buttons.rejected.connect(self.close)
        layout = QVBoxLayout(self)
        layout.addWidget(self._scroll, 1)
        layout.addWidget(self._caption)
        layout.addWidget(buttons)

    def show_image(self, view: ImageView) -> None:
        self.setWindowTitle(view.name)
        pixmap = QPixmap()
        if pixmap.loadFromData(view.data):
            self._picture.setPixmap(pixmap)
            self._caption.setText(size_text(view))
        else:
            self._picture.setText(DAMAGED)
            self._caption.setText(view.name)
        self._picture.adjustSize()
        self.resize(self._fitted(self._picture.sizeHint()))
        self.show()
        self.raise_()
        self.activateWindow()

    def shown_size(self) -> QSize:
        """The image's size as shown (0 x 0 when it could not be read)."""
        pixmap = self._picture.pixmap()
        return QSize() if pixmap is None or pixmap.isNull() else pixmap.size()

    def _fitted(self, wanted: QSize) -> QSize:
        screen = self.screen() or QGuiApplication.primaryScreen()
        room = screen.availableGeometry().size() * 0.9
        chrome = QSize(40, 90)  # the frame, the caption and the Close button
        return (wanted + chrome).boundedTo(room)
