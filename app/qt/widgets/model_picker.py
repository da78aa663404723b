"""The toolbar's model picker: entries whose text is cut to a bounded width (a served model
may be named by a long path), so that the picker, and with it the window, keeps its size."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QComboBox, QWidget

from app.qt.widgets.elide import elided, with_whole_text

HINT = ("Where this chat's replies come from: a model on this computer (shared by every local "
        "chat) or a server")


class ModelPicker(QComboBox):
    """Its tooltip is the current entry's (the whole name and what the entry is) above HINT."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent, objectName="modelPicker")
        self.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        self.currentIndexChanged.connect(self._show_entry_tooltip)

    def add_entry(self, text: str, data: str, tooltip: str) -> None:
        shown = elided(text, self.fontMetrics())
        self.addItem(shown, data)
        index = self.count() - 1
        self.setItemData(index, with_whole_text(shown, text, tooltip),
                         Qt.ItemDataRole.ToolTipRole)
        if index == self.currentIndex():  # the first entry: its signal may be blocked
            self._show_entry_tooltip(index)

    def _show_entry_tooltip(self, index: int) -> None:
        entry = self.itemData(index, Qt.ItemDataRole.ToolTipRole)
        self.setToolTip(f"{entry}\n\n{HINT}" if entry else HINT)
