"""The documents waiting in the composer, one chip each: its name, then its pages and size, its
progress while it is read, or its error; a ✕ takes it off. The chips wrap onto more rows when
the composer is narrow."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QToolButton, QVBoxLayout, QWidget

from pagoda.app.components.shared.view_models import AttachmentView
from pagoda.app.qt.documents.attachment_text import DOCUMENT_MARK, attachment_status
from pagoda.app.qt.shared.elide import ElidedLabel
from pagoda.app.qt.shared.wrap_layout import WrapLayout

CHIP_CHARS = 30  # the widest a chip grows, in average characters; longer names are cut
CHIP_SPACING = 6


class AttachmentChips(QWidget):
    """Renders the pending documents; `removed(int)` when the ✕ of the chip at that index is
    clicked. Hidden while there are none."""

    removed = Signal(int)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("attachmentChips")
        self._layout = WrapLayout(self, CHIP_SPACING)
        self.hide()

    def show_attachments(self, views: list[AttachmentView]) -> None:
        self._layout.replace_widgets(
            [self._chip(index, view) for index, view in enumerate(views)])
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
