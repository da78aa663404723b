"""Names that may be as long as a file's path (llama.cpp's server names its model by its .gguf
path), shown cut in their middle so that no label or picker widens the window or squeezes
the sidebar."""

from __future__ import annotations

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QFontMetrics, QPainter, QPaintEvent
from PySide6.QtWidgets import QLabel, QWidget

# Room for "SmolLM2-135M-Instruct (bundled) · GGUF · Q4_1 · 128 MiB" and a bit more.
NAME_CHARS = 64
# The least a label shrinks to before its layout must give it room.
MIN_CHARS = 12


def elided(text: str, metrics: QFontMetrics, chars: int = NAME_CHARS) -> str:
    """`text` cut in its middle to the width of `chars` average characters: of a path, the
    folders go first and the file name's end (the quantization, the host) stays."""
    return elided_to(text, metrics, metrics.averageCharWidth() * chars)


def elided_to(text: str, metrics: QFontMetrics, width: int) -> str:
    return metrics.elidedText(text, Qt.TextElideMode.ElideMiddle, max(width, 0))


def with_whole_text(shown: str, text: str, tooltip: str) -> str:
    """The tooltip of something showing `shown` for `text`: the whole text first when it was
    cut (and the tooltip does not already say it)."""
    if shown == text or text in tooltip:
        return tooltip
    return f"{text}\n{tooltip}" if tooltip else text


class ElidedLabel(QLabel):
    """A one-line label that asks for at most NAME_CHARS of width and, given less, shows its
    text cut in the middle; `text()` stays whole. Its layout never has to grow for it."""

    def __init__(self, parent: QWidget | None = None, *, objectName: str = "") -> None:
        super().__init__(parent, objectName=objectName)

    def sizeHint(self) -> QSize:
        hint = super().sizeHint()
        return QSize(min(hint.width(), self._chars_width(NAME_CHARS)), hint.height())

    def minimumSizeHint(self) -> QSize:
        hint = super().minimumSizeHint()
        return QSize(min(hint.width(), self._chars_width(MIN_CHARS)), hint.height())

    def shown_text(self) -> str:
        """The text as it fits the label's width now."""
        return elided_to(self.text(), self.fontMetrics(), self.contentsRect().width())

    def paintEvent(self, event: QPaintEvent) -> None:
        painter = QPainter(self)
        self.style().drawItemText(painter, self.contentsRect(), int(self.alignment()),
                                  self.palette(), self.isEnabled(), self.shown_text(),
                                  self.foregroundRole())

    def _chars_width(self, chars: int) -> int:
        margins = self.contentsMargins()
        return (self.fontMetrics().averageCharWidth() * chars + margins.left() + margins.right()
                + 2 * self.margin())
