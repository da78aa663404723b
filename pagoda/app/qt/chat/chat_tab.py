"""One open conversation's widgets: the transcript, the context meter, notices, the model's
load while it goes on, and the composer. It is the ChatView its ChatSession renders into
(pagoda/app/components/chat/chat_session.py)."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QPushButton,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from pagoda.app.components.shared.view_models import (
    AttachmentView,
    FolderView,
    ImageView,
    LoadStepView,
    MessageView,
    PassageView,
    SamplingView,
)
from pagoda.app.qt.chat.composer import Composer
from pagoda.app.qt.chat.context_meter import ContextMeter
from pagoda.app.qt.chat.file_drops import FileDrops
from pagoda.app.qt.chat.transcript import TranscriptView
from pagoda.app.qt.documents.folder_chips import FolderChips
from pagoda.app.qt.documents.passage_dialog import PassageDialog
from pagoda.app.qt.shared.elide import ElidedLabel
from pagoda.app.qt.status_bar import show_share

SEND_WAITS = "You can write meanwhile; Send waits until the model is ready."


class ChatTab(QWidget):
    """Widgets only: its ChatSession tells it what to show; its ChatController forwards its input.

    `title_changed(str)` asks the tab bar to relabel; `settings_changed(SamplingView)` carries
    edits from the window's settings panel while this tab is the current one;
    `notice_dismissed()` when the notice's ✕ is clicked; `attach_requested(list[str])` with the
    paths of files chosen by the composer's paperclip, pasted into it, or dropped anywhere on
    the tab; `folder_requested(str)` with a folder chosen by the composer's folder button;
    `folder_removed(int)` with the id of the folder whose chip's ✕ was clicked.
    """

    title_changed = Signal(str)
    settings_changed = Signal(object)
    notice_dismissed = Signal()
    attach_requested = Signal(list)
    folder_requested = Signal(str)
    folder_removed = Signal(int)

    def __init__(self, conversation_id: int, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.conversation_id = conversation_id
        self.title = "New chat"
        self.settings = SamplingView()
        self.transcript = TranscriptView(self)
        self.context_meter = ContextMeter(self)
        self.composer = Composer(self)
        self.folder_chips = FolderChips(self)
        self.regenerate_button = QPushButton("Regenerate", self, objectName="regenerateButton")
        self.regenerate_button.setToolTip("Answer the last message again, as a new branch")
        self.regenerate_button.setEnabled(False)
        self.source_label = ElidedLabel(self, objectName="chatSource")
        self._notice = QLabel(self, objectName="notice", wordWrap=True,
                              textInteractionFlags=Qt.TextInteractionFlag.TextSelectableByMouse)
        self._notice_close = QToolButton(self, text="✕", autoRaise=True)
        self._notice_close.clicked.connect(self.clear_notice)
        self._notice_close.clicked.connect(self.notice_dismissed)
        self._passage: PassageDialog | None = None
        self._loading = QWidget(self, objectName="modelLoading")
        self._loading_text = QLabel(self._loading, objectName="modelLoadingText", wordWrap=True)
        self._loading_bar = QProgressBar(self._loading, objectName="modelLoadingBar",
                                         textVisible=False)
        self.composer.attach_requested.connect(self.attach_requested)
        self.composer.folder_requested.connect(self.folder_requested)
        self.folder_chips.removed.connect(self.folder_removed)
        self._drops = FileDrops(self)
        self._drops.dropped.connect(self.attach_requested)
        self._drops.watch(self)
        self._drops.watch(self.transcript.drop_area())
        self._layout()
        self.clear_notice()

    def _layout(self) -> None:
        notice_row = QHBoxLayout()
        notice_row.addWidget(self._notice, 1)
        notice_row.addWidget(self._notice_close)
        tools = QHBoxLayout()
        tools.addWidget(self.source_label)
        tools.addWidget(self.context_meter, 1)
        tools.addWidget(self.regenerate_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 8, 8, 8)
        layout.addWidget(self.transcript, 1)
        layout.addLayout(notice_row)
        layout.addLayout(tools)
        layout.addWidget(self.folder_chips)
        layout.addWidget(self._build_loading())
        layout.addWidget(self.composer)

    def _build_loading(self) -> QWidget:
        """Above the message box, where the user looks to write: the model's load, hidden
        until one goes on."""
        row = QVBoxLayout(self._loading)
        row.setContentsMargins(0, 0, 0, 0)
        row.setSpacing(2)
        row.addWidget(self._loading_text)
        row.addWidget(self._loading_bar)
        self._loading.hide()
        return self._loading

    # -- the ChatView a session renders into ---------------------------------------------------

    def show_messages(self, views: list[MessageView]) -> None:
        self.transcript.set_messages(views)

    def update_message(self, view: MessageView) -> None:
        self.transcript.update_message(view)

    def begin_stream(self, view: MessageView) -> None:
        self.transcript.begin_stream(view)

    def append_delta(self, message_id: int, delta: str) -> None:
        self.transcript.append_delta(message_id, delta)

    def append_reasoning(self, message_id: int, delta: str) -> None:
        self.transcript.append_reasoning(message_id, delta)

    def show_reading(self, message_id: int, text: str | None) -> None:
        self.transcript.show_activity(message_id, text)

    def end_stream(self, view: MessageView) -> None:
        self.transcript.end_stream(view)

    def show_title(self, title: str) -> None:
        self.set_title(title)

    def show_streaming(self, streaming: bool) -> None:
        self.composer.set_streaming(streaming)

    def show_can_regenerate(self, enabled: bool) -> None:
        self.set_can_regenerate(enabled)

    def show_settings(self, settings: SamplingView) -> None:
        self.set_settings(settings)

    def show_context_usage(self, used: int, max_model_len: int, max_tokens: int, *,
                           exact: bool = True) -> None:
        self.context_meter.set_usage(used, max_model_len, max_tokens, exact=exact)

    def show_source(self, text: str) -> None:
        """Where this chat's replies come from, e.g. "llama-3-8b · gpu-box:8000"."""
        self.source_label.setText(text)
        self.source_label.setToolTip(f"Replies in this chat come from {text}. Choose another "
                                     "model or server in the model picker.")

    def show_model_loading(self, text: str | None, step: LoadStepView | None = None) -> None:
        """While the model this chat answers from loads: `text` (which model, what the load
        does, how far it is) and `step`'s share on a bar; None once it is over."""
        if text is None:
            if not self._loading.isHidden():
                self._loading.hide()
            return
        shown = f"{text}. {SEND_WAITS}"
        if self._loading_text.text() != shown:
            self._loading_text.setText(shown)
        show_share(self._loading_bar, step)
        if self._loading.isHidden():
            self._loading.show()

    def model_loading_text(self) -> str | None:
        """What the chat says of the model's load; None while none goes on."""
        return None if self._loading.isHidden() else self._loading_text.text()

    def restore_draft(self, text: str) -> None:
        self.composer.set_text(text)

    def begin_edit(self, message_id: int, content: str) -> None:
        self.composer.begin_edit(message_id, content)

    def show_pending_attachments(self, views: list[AttachmentView]) -> None:
        """The documents waiting to go with the next message (reading, ready or failed)."""
        self.composer.show_attachments(views)

    def show_pending_images(self, views: list[ImageView]) -> None:
        self.composer.show_images(views)

    def show_folders(self, views: list[FolderView]) -> None:
        """The folders the chat answers from, and where their indexing stands."""
        self.folder_chips.show_folders(views)

    def show_passage(self, view: PassageView) -> None:
        """Open a cited passage beside the chat; a second one replaces the first."""
        if self._passage is None:
            self._passage = PassageDialog(self)
        self._passage.show_passage(view)

    # -- its own widgets ---------------------------------------------------------------------------

    def set_title(self, title: str) -> None:
        if title != self.title:
            self.title = title
            self.title_changed.emit(title)

    def set_settings(self, settings: SamplingView) -> None:
        self.settings = settings

    def set_can_regenerate(self, enabled: bool) -> None:
        self.regenerate_button.setEnabled(enabled)

    def show_notice(self, text: str, error: bool = False) -> None:
        self._notice.setProperty("error", error)
        self._notice.setStyleSheet("color: #c62828;" if error else "")
        self._notice.setText(text)
        self._notice.setVisible(True)
        self._notice_close.setVisible(True)

    def notice_text(self) -> str:
        return self._notice.text()

    def clear_notice(self) -> None:
        self._notice.clear()
        self._notice.setVisible(False)
        self._notice_close.setVisible(False)
