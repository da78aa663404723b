"""What an empty chat says in its transcript, wrapped to the transcript's width: a text
browser's own placeholder is painted on one line, cut at its right edge."""

from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, QSize, Qt
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import QLabel, QTextEdit


class EmptyChatHint(QLabel):
    """Lies on `browser`'s viewport, in the placeholder's colour, while its document is empty."""

    def __init__(self, text: str, browser: QTextEdit) -> None:
        super().__init__(text, browser.viewport(), objectName="emptyChatHint", wordWrap=True)
        self.setForegroundRole(QPalette.ColorRole.PlaceholderText)
        self.setAttribute(Qt.WidgetAttribute.WA_TransparentForMouseEvents)
        self._document = browser.document()
        self._document.contentsChanged.connect(self._follow_document)
        browser.viewport().installEventFilter(self)
        self._fit(browser.viewport().size())
        self._follow_document()

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if event.type() == QEvent.Type.Resize:
            self._fit(watched.size())
        return False

    def _fit(self, viewport: QSize) -> None:
        margin = int(self._document.documentMargin())
        width = max(viewport.width() - 2 * margin, 0)
        self.setGeometry(margin, margin, width, self.heightForWidth(width))

    def _follow_document(self) -> None:
        empty = self._document.isEmpty()
        if self.isHidden() == empty:
            self.setVisible(empty)
