"""The folders a chat answers from, one chip each above the composer: the folder's name, then
its files and where their indexing stands; the tooltip names the folder's path and the files
that could not be read, with why. A ✕ removes the folder from the chat."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QToolButton, QVBoxLayout, QWidget

from pagoda.app.components.shared.view_models import FolderView
from pagoda.app.qt.documents.folder_text import folder_details, folder_status
from pagoda.app.qt.shared.elide import ElidedLabel
from pagoda.app.qt.shared.theme import icon
from pagoda.app.qt.shared.wrap_layout import WrapLayout

CHIP_CHARS = 34  # the widest a chip grows, in average characters
CHIP_SPACING = 6
ICON_PX = 16


class FolderChips(QWidget):
    """Renders the chat's folders; `removed(int)` with the folder's id when its ✕ is clicked.
    Hidden while the chat has none."""

    removed = Signal(int)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("folderChips")
        self._layout = WrapLayout(self, CHIP_SPACING)
        self.hide()

    def show_folders(self, views: list[FolderView]) -> None:
        self._layout.replace_widgets([self._chip(view) for view in views])
        self.setVisible(bool(views))

    def _chip(self, view: FolderView) -> QFrame:
        chip = QFrame(self, objectName="folderChip")
        chip.setMaximumWidth(self.fontMetrics().averageCharWidth() * CHIP_CHARS)
        chip.setToolTip(folder_details(view))
        mark = QLabel(chip, objectName="folderMark")
        mark.setPixmap(icon("folder").pixmap(ICON_PX, ICON_PX))
        name = ElidedLabel(chip, objectName="folderName")
        name.setText(view.name)
        status = ElidedLabel(chip, objectName="folderStatus")
        status.setText(folder_status(view))
        status.setProperty("error" if view.state == "failed" or view.failed else "muted", True)
        remove = QToolButton(chip, text="✕", autoRaise=True, objectName="removeFolder")
        remove.setToolTip(f"Stop answering from {view.name} (its index is deleted; the folder "
                          "and its files stay as they are)")
        remove.clicked.connect(lambda: self.removed.emit(view.id))
        return self._lay_out(chip, mark, name, status, remove)

    @staticmethod
    def _lay_out(chip: QFrame, mark: QLabel, name: QLabel, status: QLabel,
                 remove: QToolButton) -> QFrame:
        lines = QVBoxLayout()
        lines.setSpacing(0)
        lines.addWidget(name)
        lines.addWidget(status)
        row = QHBoxLayout(chip)
        row.setContentsMargins(8, 4, 2, 4)
        row.addWidget(mark, 0, Qt.AlignmentFlag.AlignTop)
        row.addLayout(lines, 1)
        row.addWidget(remove, 0, Qt.AlignmentFlag.AlignTop)
        return chip
