"""The documents waiting in the composer, one chip each: its name, then its pages and size, its
progress while it is read, or its error; a ✕ takes it off. The chips wrap onto more rows when
the composer is narrow."""

from __future__ import annotations

from PySide6.QtCore import QPoint, QRect, QSize, Qt, Signal
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QLayout,
    QLayoutItem,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.components.view_models import AttachmentView
from app.qt.widgets.attachment_text import DOCUMENT_MARK, attachment_status
from app.qt.widgets.elide import ElidedLabel

CHIP_CHARS = 30  # the widest a chip grows, in average characters; longer names are cut
CHIP_SPACING = 6


class AttachmentChips(QWidget):
    """Renders the pending documents; `removed(int)` when the ✕ of the chip at that index is
    clicked. Hidden while there are none."""

    removed = Signal(int)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("attachmentChips")
        self._layout = _WrapLayout(self)
        self.hide()

    def show_attachments(self, views: list[AttachmentView]) -> None:
        while self._layout.count():
            chip = self._layout.takeAt(0).widget()
            chip.hide()
            chip.deleteLater()
        for index, view in enumerate(views):
            chip = self._chip(index, view)
            self._layout.addWidget(chip)
            chip.show()  # now, not when the event loop next runs
        self.setVisible(bool(views))

    def _chip(self, index: int, view: AttachmentView) -> QFrame:
        chip = QFrame(self, objectName="attachmentChip")
        chip.setMaximumWidth(self.fontMetrics().averageCharWidth() * CHIP_CHARS)
        name = ElidedLabel(chip, objectName="attachmentName")
        name.setText(f"{DOCUMENT_MARK} {view.name}")
        name.setToolTip(view.name)
        status = self._status(chip, view)
        remove = QToolButton(chip, text="✕", autoRaise=True, objectName="removeAttachment")
        remove.setToolTip(f"Remove {view.name}")
        remove.clicked.connect(lambda: self.removed.emit(index))
        lines = QVBoxLayout()
        lines.setSpacing(0)
        lines.addWidget(name)
        lines.addWidget(status)
        row = QHBoxLayout(chip)
        row.setContentsMargins(8, 4, 2, 4)
        row.addLayout(lines, 1)
        row.addWidget(remove, 0, Qt.AlignmentFlag.AlignTop)
        return chip

    def _status(self, chip: QFrame, view: AttachmentView) -> QLabel:
        """Pages and size, or progress, on one line; an error in full, wrapped, since it says
        what to do instead."""
        if view.state == "failed":
            status = QLabel(attachment_status(view), chip, objectName="attachmentStatus",
                            wordWrap=True)
            status.setTextFormat(Qt.TextFormat.PlainText)
            status.setProperty("error", True)
            return status
        status = ElidedLabel(chip, objectName="attachmentStatus")
        status.setText(attachment_status(view))
        status.setToolTip(status.text())
        status.setProperty("muted", True)
        return status


class _WrapLayout(QLayout):
    """Its widgets left to right at their preferred width (at most the row's), a new row
    where the width runs out."""

    def __init__(self, parent: QWidget) -> None:
        super().__init__(parent)
        self._items: list[QLayoutItem] = []
        self.setContentsMargins(0, 0, 0, 0)
        self.setSpacing(CHIP_SPACING)

    def addItem(self, item: QLayoutItem) -> None:
        self._items.append(item)

    def count(self) -> int:
        return len(self._items)

    def itemAt(self, index: int) -> QLayoutItem | None:
        return self._items[index] if 0 <= index < len(self._items) else None

    def takeAt(self, index: int) -> QLayoutItem | None:
        return self._items.pop(index) if 0 <= index < len(self._items) else None

    def expandingDirections(self) -> Qt.Orientation:
        return Qt.Orientation(0)

    def hasHeightForWidth(self) -> bool:
        return True

    def heightForWidth(self, width: int) -> int:
        return self._arrange(QRect(0, 0, width, 0), place=False)

    def setGeometry(self, rect: QRect) -> None:
        super().setGeometry(rect)
        self._arrange(rect, place=True)

    def sizeHint(self) -> QSize:
        return self.minimumSize()

    def minimumSize(self) -> QSize:
        size = QSize()
        for item in self._items:
            size = size.expandedTo(item.minimumSize())
        return size

    def _arrange(self, rect: QRect, place: bool) -> int:
        """Lay the items out in `rect` (or only measure); returns the height they take."""
        x, y, row_height = rect.x(), rect.y(), 0
        for item in self._items:
            hint = item.sizeHint()
            width = max(min(hint.width(), rect.width()), item.minimumSize().width())
            height = item.heightForWidth(width) if item.hasHeightForWidth() else hint.height()
            if x > rect.x() and x + width > rect.x() + rect.width():
                x, y, row_height = rect.x(), y + row_height + self.spacing(), 0
            if place:
                item.setGeometry(QRect(QPoint(x, y), QSize(width, height)))
            x += width + self.spacing()
            row_height = max(row_height, height)
        return y + row_height - rect.y()
