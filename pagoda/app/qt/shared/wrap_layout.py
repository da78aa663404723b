"""A layout that wraps: its widgets left to right, a new row where the width runs out (the
composer's chips)."""

from __future__ import annotations

from PySide6.QtCore import QPoint, QRect, QSize, Qt
from PySide6.QtWidgets import QLayout, QLayoutItem, QWidget


class WrapLayout(QLayout):
    """Its widgets left to right at their preferred width (at most the row's), a new row
    where the width runs out."""

    def __init__(self, parent: QWidget, spacing: int) -> None:
        super().__init__(parent)
        self._items: list[QLayoutItem] = []
        self.setContentsMargins(0, 0, 0, 0)
        self.setSpacing(spacing)

    def replace_widgets(self, widgets: list[QWidget]) -> None:
        """Its widgets deleted and these shown in their place, now rather than when the
        event loop next runs."""
        while self._items:
            old = self._items.pop(0).widget()
            old.hide()
            old.deleteLater()
        for widget in widgets:
            self.addWidget(widget)
            widget.show()

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
