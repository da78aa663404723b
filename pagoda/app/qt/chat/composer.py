"""Where the user writes: Enter sends, Shift+Enter breaks the line, Esc stops or cancels an edit.
Documents and images join the message by the paperclip, or pasted or dropped as files (an image
copied from elsewhere is pasted too); documents wait as chips above the box, images as
thumbnails, and Send waits while a document is still being read. The folder button beside the
paperclip adds a folder the chat answers from."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QEvent, QMimeData, Qt, Signal
from PySide6.QtGui import QKeyEvent, QTextCursor
from PySide6.QtWidgets import (
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from pagoda.app.components.shared.view_models import AttachmentView, ImageView
from pagoda.app.qt.chat.file_drops import dropped_files
from pagoda.app.qt.chat.image_views import PendingImages, png_bytes
from pagoda.app.qt.documents.attachment_chips import AttachmentChips
from pagoda.app.qt.documents.attachment_text import reading_reason
from pagoda.app.qt.shared.theme import icon

EDIT_BANNER = "Editing a message — Enter to save as a new branch, Esc to cancel"
STREAMING_HINT = "A reply is being written: press Esc to stop it, or wait to send"
KEPT_NOTE = "Your message stays here."
PLACEHOLDER = "Message (Enter to send, Shift+Enter for a new line)"
MIN_LINES = 2
MAX_LINES = 8
ENTER_KEYS = (Qt.Key.Key_Return, Qt.Key.Key_Enter)
ATTACH_TIP = "Attach files (PDF, Word, PowerPoint, Excel, HTML, text, code) or images"
FOLDER_TIP = "Add a folder: this chat answers from its files, kept indexed as they change"
ATTACH_FILTERS = ("All files (*)", "Images (*.png *.jpg *.jpeg *.webp *.gif)", "PDF (*.pdf)",
                  "Word, PowerPoint, Excel (*.docx *.pptx *.xlsx)",
                  "Web pages (*.html *.htm)", "Text and Markdown (*.txt *.md)")


class _InputBox(QPlainTextEdit):
    """A plain-text box that turns Enter into a signal instead of an editing key, Esc into a
    call of `escape` (which says whether it used it), files pasted or dropped into it into
    `files_given` instead of their paths as text, and an image pasted (a screenshot, an image
    copied in a browser) into `image_given` as PNG bytes."""

    submitted = Signal()
    files_given = Signal(list)  # the files' paths
    image_given = Signal(bytes)  # a pasted image, encoded as PNG

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.escape: Callable[[], bool] = lambda: False

    def keyPressEvent(self, event: QKeyEvent) -> None:
        if event.key() in ENTER_KEYS:
            if event.modifiers() & Qt.KeyboardModifier.ShiftModifier:
                self.textCursor().insertText("\n")  # Qt's own Shift+Enter inserts U+2028
            else:
                self.submitted.emit()
            return
        if event.key() == Qt.Key.Key_Escape:
            if not self.escape():
                event.ignore()  # on to the window, which stops the chat's reply if one is due
            return
        super().keyPressEvent(event)

    def canInsertFromMimeData(self, source: QMimeData) -> bool:
        return (bool(dropped_files(source)) or source.hasImage()
                or super().canInsertFromMimeData(source))

    def insertFromMimeData(self, source: QMimeData) -> None:
        paths = dropped_files(source)
        if paths:
            self.files_given.emit(paths)
        elif source.hasImage():
            image = source.imageData()
            if image is not None and not image.isNull():
                self.image_given.emit(png_bytes(image))
        else:
            super().insertFromMimeData(source)


class Composer(QWidget):
    """The message box with Send and Stop buttons, an edit mode for re-asking a question, and
    the documents that will go with the next message."""

    send_requested = Signal(str)
    stop_requested = Signal()
    edit_submitted = Signal(int, str)  # message_id, new text
    draft_changed = Signal(str)  # the new message's text as typed (not while editing an old one)
    attach_requested = Signal(list)  # paths of files chosen, pasted or dropped into the box
    folder_requested = Signal(str)  # the path of a folder chosen for the chat to answer from
    pending_removed = Signal(int)  # the index of the waiting document the user took off
    image_pasted = Signal(bytes)  # an image pasted into the box, as PNG
    image_removed = Signal(int)  # the index of the waiting image the user took off

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._blocked: str | None = None  # why sending is not possible now
        self._reading: str | None = None  # "Reading report.pdf…" while a document is read
        self._attach_folder = str(Path.home())
        self._streaming = False
        self._editing_id: int | None = None
        self._saved_draft = ""
        self._banner = self._build_note(EDIT_BANNER, "editBanner")
        self._hint = self._build_note(STREAMING_HINT, "streamingHint")
        self._chips = AttachmentChips(self)
        self._chips.removed.connect(self.pending_removed)
        self._images = PendingImages(self)
        self._images.removed.connect(self.image_removed)
        self._input = self._build_input()
        self._attach = self._build_attach_button()
        self._folder = self._build_folder_button()
        self._send = self._build_button("Send", "sendButton", self._submit)
        self._stop = self._build_button("Stop", "stopButton", self.stop_requested.emit)
        self._lay_out()
        self.setFocusProxy(self._input)
        self._refresh_buttons()
        self._fit_height()

    # -- what the controller calls ----------------------------------------------------------------

    def set_send_blocked(self, reason: str | None) -> None:
        """Why sending is not possible now (a model loading, none loaded), or None when it is;
        typing works either way."""
        before = self._why_not_send()
        self._blocked = reason
        self._blocking_changed(before)

    def show_attachments(self, views: list[AttachmentView]) -> None:
        """The documents waiting to go with the next message; Send waits while one is read."""
        self._chips.show_attachments(views)
        before = self._why_not_send()
        self._reading = reading_reason(views)
        self._blocking_changed(before)

    def show_images(self, views: list[ImageView]) -> None:
        """The images waiting to go with the next message."""
        self._images.show_images(views)

    def choose_files(self) -> QFileDialog:
        """Non-blocking: the files chosen become `attach_requested`."""
        dialog = QFileDialog(self, "Attach files", self._attach_folder, ";;".join(ATTACH_FILTERS))
        dialog.setObjectName("attachDialog")
        dialog.setFileMode(QFileDialog.FileMode.ExistingFiles)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.filesSelected.connect(self._files_chosen)
        dialog.open()
        return dialog

    def choose_folder(self) -> QFileDialog:
        """Non-blocking: the folder chosen becomes `folder_requested`."""
        dialog = QFileDialog(self, "Add a folder to this chat", self._attach_folder)
        dialog.setObjectName("folderDialog")
        dialog.setFileMode(QFileDialog.FileMode.Directory)
        dialog.setOption(QFileDialog.Option.ShowDirsOnly, True)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.fileSelected.connect(self._folder_chosen)
        dialog.open()
        return dialog

    def send_blocked_reason(self) -> str | None:
        return self._blocked

    def set_streaming(self, streaming: bool) -> None:
        """While this tab's reply streams, Stop replaces Send and Esc stops it."""
        self._streaming = streaming
        if not streaming:
            self._hint.hide()
        self._refresh_buttons()

    def begin_edit(self, message_id: int, text: str) -> None:
        """Put a sent message back in the box; the next send becomes `edit_submitted`."""
        if self._editing_id is None:
            self._saved_draft = self.text()
        self._editing_id = message_id
        self._banner.show()
        self.set_text(text)
        self.focus_input()

    def cancel_edit(self) -> None:
        """Leave edit mode and bring back the draft that was in the box before it."""
        self._editing_id = None
        self._banner.hide()
        self.set_text(self._saved_draft)
        self._saved_draft = ""

    def text(self) -> str:
        return self._input.toPlainText()

    def set_text(self, text: str) -> None:
        self._input.setPlainText(text)
        self._input.moveCursor(QTextCursor.MoveOperation.End)

    def focus_input(self) -> None:
        self._input.setFocus(Qt.FocusReason.OtherFocusReason)

    # -- behaviour --------------------------------------------------------------------------------

    def _submit(self) -> None:
        text = self.text()
        blocked = self._why_not_send()
        if self._streaming and text.strip():
            self._show_hint(STREAMING_HINT)  # the text stays in the box for when it ends
            return
        if blocked is not None and text.strip():
            self._show_hint(_blocked_hint(blocked))
            return
        if self._streaming or blocked is not None or not text.strip():
            return
        if self._editing_id is not None:
            message_id = self._editing_id
            self.cancel_edit()
            self.edit_submitted.emit(message_id, text)
        else:
            self._input.clear()
            self.send_requested.emit(text)

    def _why_not_send(self) -> str | None:
        return self._blocked or self._reading

    def _blocking_changed(self, before: str | None) -> None:
        """A hint already showing the old reason shows the new one, or goes when none is left."""
        now = self._why_not_send()
        if before is not None and self._hint.text() == _blocked_hint(before):
            if now is None:
                self._hint.hide()
            else:
                self._hint.setText(_blocked_hint(now))
        self._refresh_buttons()

    def _files_chosen(self, paths: list[str]) -> None:
        if paths:
            self._attach_folder = str(Path(paths[0]).parent)
            self.attach_requested.emit(paths)

    def _folder_chosen(self, path: str) -> None:
        if path:
            self._attach_folder = str(Path(path).parent)
            self.folder_requested.emit(path)

    def _show_hint(self, text: str) -> None:
        self._hint.setText(text)
        self._hint.show()

    def _escape(self) -> bool:
        """Esc cancels an edit, or stops the reply this box shows streaming; False: it did
        neither (a reply still being started is stopped by the window)."""
        if self._editing_id is not None:
            self.cancel_edit()
        elif self._streaming:
            self.stop_requested.emit()
        else:
            return False
        return True

    def _refresh_buttons(self) -> None:
        self._send.setVisible(not self._streaming)
        self._stop.setVisible(self._streaming)
        self._send.setEnabled(self._why_not_send() is None)
        self._send.setToolTip(self._why_not_send() or "")

    def _fit_height(self) -> None:
        """Grow with the text from MIN_LINES up to MAX_LINES, then scroll."""
        lines = int(self._input.document().size().height())
        lines = max(MIN_LINES, min(MAX_LINES, lines))
        margins = self._input.contentsMargins()
        chrome = 2 * self._input.document().documentMargin() + margins.top() + margins.bottom()
        self._input.setFixedHeight(int(lines * self._input.fontMetrics().lineSpacing() + chrome))

    # -- construction -----------------------------------------------------------------------------

    def _build_note(self, text: str, name: str) -> QLabel:
        """A hidden line in italics above the box: the edit banner, or a hint."""
        note = QLabel(text, self)
        note.setObjectName(name)
        note.setWordWrap(True)
        note.setStyleSheet("padding: 2px 4px; font-style: italic;")
        note.hide()
        return note

    def _build_input(self) -> _InputBox:
        box = _InputBox(self)
        box.setObjectName("composer")
        box.setPlaceholderText(PLACEHOLDER)
        box.setTabChangesFocus(True)
        box.submitted.connect(self._submit)
        box.escape = self._escape
        box.document().contentsChanged.connect(self._fit_height)
        box.textChanged.connect(self._text_changed)
        box.files_given.connect(self.attach_requested)
        box.image_given.connect(self.image_pasted)
        return box

    def _build_attach_button(self) -> QToolButton:
        button = QToolButton(self, objectName="attachButton", autoRaise=True)
        button.setIcon(icon("attach"))
        button.setToolTip(ATTACH_TIP)
        button.clicked.connect(self.choose_files)
        return button

    def _build_folder_button(self) -> QToolButton:
        button = QToolButton(self, objectName="folderButton", autoRaise=True)
        button.setIcon(icon("folder"))
        button.setToolTip(FOLDER_TIP)
        button.clicked.connect(self.choose_folder)
        return button

    def _text_changed(self) -> None:
        if self._editing_id is None:
            self.draft_changed.emit(self._input.toPlainText())

    def _build_button(self, label: str, name: str, slot: Callable[[], None]) -> QPushButton:
        button = QPushButton(label, self)
        button.setObjectName(name)
        button.setAutoDefault(False)
        button.clicked.connect(slot)
        return button

    def changeEvent(self, event: QEvent) -> None:
        super().changeEvent(event)
        if event.type() == QEvent.Type.PaletteChange:
            self._attach.setIcon(icon("attach"))  # drawn in the new theme's text colour
            self._folder.setIcon(icon("folder"))

    def _lay_out(self) -> None:
        row = QHBoxLayout()
        row.addWidget(self._attach, 0, Qt.AlignmentFlag.AlignBottom)
        row.addWidget(self._folder, 0, Qt.AlignmentFlag.AlignBottom)
        row.addWidget(self._input, 1)
        row.addWidget(self._send, 0, Qt.AlignmentFlag.AlignBottom)
        row.addWidget(self._stop, 0, Qt.AlignmentFlag.AlignBottom)
        column = QVBoxLayout(self)
        column.setContentsMargins(0, 0, 0, 0)
        column.addWidget(self._banner)
        column.addWidget(self._hint)
        column.addWidget(self._chips)
        column.addWidget(self._images)
        column.addLayout(row)


def _blocked_hint(reason: str) -> str:
    return f"{reason} {KEPT_NOTE}"
