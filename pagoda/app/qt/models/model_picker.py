"""The toolbar's model picker: entries whose text is cut to a bounded width (a served model
may be named by a long path), so that the picker, and with it the window, keeps its size; the
entry of a model still loading says so, so that it does not look ready before it is."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QComboBox, QWidget

from pagoda.app.qt.shared.elide import elided, with_whole_text

HINT = ("Where this chat's replies come from: a model on this computer (shared by every local "
        "chat) or a server")
WHOLE_TEXT = Qt.ItemDataRole.UserRole + 1  # an entry's text before it is cut or marked


class ModelPicker(QComboBox):
    """Its tooltip is the current entry's (the whole name and what the entry is) above HINT."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent, objectName="modelPicker")
        self.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        self.currentIndexChanged.connect(self._show_entry_tooltip)
        self._loading: tuple[str, str] | None = None  # the entry's data, what it reads first

    def add_entry(self, text: str, data: str, tooltip: str) -> None:
        self.addItem("", data)
        index = self.count() - 1
        self.setItemData(index, text, WHOLE_TEXT)
        self._show_entry_text(index)
        self.setItemData(index, with_whole_text(elided(text, self.fontMetrics()), text, tooltip),
                         Qt.ItemDataRole.ToolTipRole)
        if index == self.currentIndex():  # the first entry: its signal may be blocked
            self._show_entry_tooltip(index)

    def mark_loading(self, data: str | None, mark: str = "") -> None:
        """The entry of the model loading now (its `data`) reads `mark` first, e.g.
        "Loading 52%: SmolLM2…"; None: no entry is marked."""
        loading = None if data is None else (data, mark)
        if loading != self._loading:
            self._loading = loading
            for index in range(self.count()):
                self._show_entry_text(index)

    def _show_entry_text(self, index: int) -> None:
        whole = self.itemData(index, WHOLE_TEXT)
        if whole is None:  # a separator
            return
        if self._loading is not None and self.itemData(index) == self._loading[0]:
            whole = f"{self._loading[1]}: {whole}"
        shown = elided(whole, self.fontMetrics())
        if self.itemText(index) != shown:
            self.setItemText(index, shown)

    def _show_entry_tooltip(self, index: int) -> None:
        entry = self.itemData(index, Qt.ItemDataRole.ToolTipRole)
        self.setToolTip(f"{entry}\n\n{HINT}" if entry else HINT)
