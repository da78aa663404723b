"""A tree as high as the rows it shows, for a panel that scrolls as a whole: a box of its own
that scrolls inside the panel showed one and a half rows of a chat's tools."""

from __future__ import annotations

from PySide6.QtCore import QSize, Qt
from PySide6.QtWidgets import QSizePolicy, QTreeWidget, QWidget


class FittedTree(QTreeWidget):
    """Its height follows its rows as they are added, removed, expanded and collapsed; a row
    too long for its width is cut at the end."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setUniformRowHeights(True)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        model = self.model()
        for signal in (self.itemExpanded, self.itemCollapsed, model.rowsInserted,
                       model.rowsRemoved, model.modelReset):
            signal.connect(self.updateGeometry)

    def rows_shown(self) -> int:
        """Rows on screen when scrolled through: top-level items and the children of the
        expanded ones."""
        count, item = 0, self.topLevelItem(0)
        while item is not None:
            count += 1
            item = self.itemBelow(item)
        return count

    def sizeHint(self) -> QSize:
        return QSize(super().sizeHint().width(), self._height())

    def minimumSizeHint(self) -> QSize:
        return QSize(super().minimumSizeHint().width(), self._height())

    def _height(self) -> int:
        rows = self.rows_shown()
        row_height = self.sizeHintForRow(0) if rows else 0
        header = 0 if self.isHeaderHidden() else self.header().sizeHint().height()
        return rows * row_height + header + 2 * self.frameWidth()
