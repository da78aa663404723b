"""Files dragged from a file manager, or copied there and pasted: their paths. Anything else
(text, a web link) is left to the widget it was dropped on."""

from __future__ import annotations

from PySide6.QtCore import QEvent, QMimeData, QObject, Signal
from PySide6.QtGui import QDropEvent
from PySide6.QtWidgets import QWidget


def dropped_files(mime: QMimeData) -> list[str]:
    """The local files `mime` carries, as paths; none for text or for links to the web."""
    if not mime.hasUrls():
        return []
    return [url.toLocalFile() for url in mime.urls() if url.isLocalFile() and url.toLocalFile()]


class FileDrops(QObject):
    """Takes drops of files on the widgets it watches and emits `dropped(list[str])` with their
    paths; other drags go on to the widget as before."""

    dropped = Signal(list)

    def watch(self, widget: QWidget) -> None:
        widget.setAcceptDrops(True)
        widget.installEventFilter(self)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        kind = event.type()
        if kind not in (QEvent.Type.DragEnter, QEvent.Type.DragMove, QEvent.Type.Drop):
            return False
        assert isinstance(event, QDropEvent)  # drag enter and drag move events are drop events
        paths = dropped_files(event.mimeData())
        if not paths:
            return False
        event.acceptProposedAction()
        if kind == QEvent.Type.Drop:
            self.dropped.emit(paths)
        return True
