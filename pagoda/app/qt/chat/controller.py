"""One controller per tab: forwards the tab's input to its ChatSession and Qt signals out of it.
The chat's logic is in chat_session.py and runs without a window; ChatTab renders it."""

from __future__ import annotations

import asyncio

from PySide6.QtCore import QObject, QTimer, Signal

from pagoda.app.components.chat.chat_session import ChatSession
from pagoda.app.components.chat.reply_stream import Reply
from pagoda.app.components.shared.async_store import AsyncStore
from pagoda.app.qt.chat.chat_tab import ChatTab
from pagoda.app.store import Conversation, Message

DRAFT_COUNT_DELAY_MS = 400


class ChatController(QObject):
    """Joins a ChatTab to its ChatSession.

    Signals: `conversation_changed(int)` when the sidebar should refresh (title, order);
    `streaming_changed(bool)`.
    """

    conversation_changed = Signal(int)
    streaming_changed = Signal(bool)

    def __init__(self, session: ChatSession, view: ChatTab, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.view = view
        self.session = session
        session.view = view
        # Typing pauses this long before the draft is counted (tokenized off the GUI thread).
        self._draft_timer = QTimer(self, singleShot=True, interval=DRAFT_COUNT_DELAY_MS)
        self.session.on_conversation_changed = self.conversation_changed.emit
        self.session.on_streaming_changed = self.streaming_changed.emit
        self._connect_view()

    def _connect_view(self) -> None:
        v, s = self.view, self.session
        v.composer.send_requested.connect(lambda text: s.spawn(s.send(text)))
        v.composer.edit_submitted.connect(lambda mid, text: s.spawn(s.edit(mid, text)))
        v.composer.stop_requested.connect(s.stop)
        v.transcript.branch_requested.connect(lambda mid, d: s.spawn(s.switch_branch(mid, d)))
        v.transcript.edit_requested.connect(s.begin_edit)
        v.transcript.regenerate_requested.connect(lambda mid: s.spawn(s.regenerate(mid)))
        v.transcript.continue_requested.connect(lambda mid: s.spawn(s.continue_reply(mid)))
        v.transcript.tool_call_answered.connect(
            lambda mid, index, decision: s.answer_tool_call(mid, index, decision))
        v.regenerate_button.clicked.connect(lambda: s.spawn(s.regenerate_last()))
        v.settings_changed.connect(lambda settings: s.spawn(s.save_settings(settings)))
        v.notice_dismissed.connect(s.clear_notice)
        v.attach_requested.connect(lambda paths: s.spawn(s.files.attach(paths)))
        v.composer.pending_removed.connect(lambda index: s.files.remove_pending(index))
        v.composer.image_pasted.connect(lambda data: s.spawn(s.files.paste_image(data)))
        v.composer.image_removed.connect(lambda index: s.files.remove_pending_image(index))
        v.folder_requested.connect(lambda path: s.spawn(s.files.add_folder(path)))
        v.folder_removed.connect(lambda folder_id: s.spawn(s.files.remove_folder(folder_id)))
        v.transcript.source_requested.connect(lambda mid, n: s.spawn(s.files.open_source(mid, n)))
        self._draft_timer.timeout.connect(
            lambda: s.spawn(s.count_draft(v.composer.text())))
        v.composer.draft_changed.connect(lambda _text: self._draft_timer.start())

    # -- the session, for the window ----------------------------------------------------------

    @property
    def conversation_id(self) -> int:
        return self.session.conversation_id

    @property
    def db(self) -> AsyncStore:
        return self.session.db

    @property
    def conversation(self) -> Conversation | None:
        return self.session.conversation

    @property
    def path(self) -> list[Message]:
        return self.session.path

    @property
    def reply(self) -> Reply | None:
        return self.session.reply

    @property
    def is_streaming(self) -> bool:
        return self.session.is_streaming

    def spawn(self, coro) -> asyncio.Task:
        return self.session.spawn(coro)

    async def open(self) -> None:
        await self.session.open()

    async def refresh_context_meter(self) -> None:
        await self.session.refresh_context_meter()

    async def show_branch_of(self, message_id: int) -> None:
        await self.session.show_branch_of(message_id)

    def stop(self) -> None:
        self.session.stop()

    def close(self) -> None:
        self.session.close()
