"""A cited passage, opened from a reply's sources: the file and page it comes from, the heading
it sits under, and its text to read and copy. Non-modal: the chat stays usable beside it."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QFont
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QLabel,
    QPlainTextEdit,
    QVBoxLayout,
    QWidget,
)

from pagoda.app.components.shared.view_models import PassageView
from pagoda.app.qt.documents.attachment_text import passage_place

SELECTABLE = (Qt.TextInteractionFlag.TextSelectableByMouse
              | Qt.TextInteractionFlag.TextSelectableByKeyboard)


class PassageDialog(QDialog):
    """Shows one passage at a time; opening another source shows that one in its place."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("passageDialog")
        self.setModal(False)
        self.resize(560, 420)
        self._place = QLabel(self, objectName="passagePlace", textInteractionFlags=SELECTABLE)
        self._place.setTextFormat(Qt.TextFormat.PlainText)
        bold = self._place.font()
        bold.setWeight(QFont.Weight.Bold)
        self._place.setFont(bold)
        self._heading = QLabel(self, objectName="passageHeading", wordWrap=True,
                               textInteractionFlags=SELECTABLE)
        self._heading.setTextFormat(Qt.TextFormat.PlainText)
        self._text = QPlainTextEdit(self, objectName="passageText", readOnly=True)
        self._text.setTextInteractionFlags(SELECTABLE)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close, self)
        buttons.rejected.connect(self.close)
        layout = QVBoxLayout(self)
        layout.addWidget(self._place)
        layout.addWidget(self._heading)
        layout.addWidget(self._text, 1)
        layout.addWidget(buttons)

    def show_passage(self, view: PassageView) -> None:
        place = passage_place(view)
        self.setWindowTitle(place)
        self._place.setText(place)
        self._heading.setText(view.heading or "")
        self._heading.setVisible(bool(view.heading))
        self._text.setPlainText(view.text)
        self.show()
        self.raise_()
        self.activateWindow()

    def text(self) -> str:
        return self._text.toPlainText()
