"""The chat list's controller: the sidebar's requests (search, rename, pin, archive, delete with
Undo, export, import) carried out on the store, and the list drawn again after each."""

from __future__ import annotations

import asyncio
from datetime import date
from pathlib import Path

from PySide6.QtCore import QObject, QTimer
from PySide6.QtWidgets import QFileDialog, QMessageBox, QPushButton

from pagoda.app.components.conversations.chat_import import (
    ChatImportError,
    import_chats,
    imported_text,
)
from pagoda.app.components.conversations.export_names import (
    EXPORT_FORMATS,
    export_file_name,
    with_suffix,
)
from pagoda.app.qt.conversations.sidebar import ConversationItem, SearchResultItem, Sidebar
from pagoda.app.qt.shared.window_frame import WindowFrame
from pagoda.app.store import SearchHit

UNDO_SECONDS = 10


class ChatList(QObject):
    """Joins the window's sidebar to the store and the open chats. A deleted chat can be
    brought back for UNDO_SECONDS (the newest delete only); then it is deleted for good."""

    def __init__(self, window: WindowFrame, sidebar: Sidebar) -> None:
        super().__init__(window)
        self.window = window
        self.sidebar = sidebar
        self.db = window.db
        self.undo_button = QPushButton("Undo", window, objectName="undoButton")
        self._undo_timer = QTimer(self, singleShot=True, interval=UNDO_SECONDS * 1000)
        self._undo_connection = None
        self.undoable_delete: int | None = None  # the conversation Undo would bring back
        self._undo_timer.timeout.connect(self._undo_expired)
        self._connect()

    def _connect(self) -> None:
        s, spawn = self.sidebar, self.window.spawn
        s.new_requested.connect(lambda: spawn(self.window.chat_tabs.new_chat()))
        s.open_requested.connect(
            lambda cid, mid: spawn(self.window.chat_tabs.show_message(cid, mid)))
        s.search_requested.connect(lambda q: spawn(self.search(q)))
        s.rename_requested.connect(lambda cid, t: spawn(self.rename(cid, t)))
        s.pin_requested.connect(lambda cid, p: spawn(self.pin(cid, p)))
        s.archive_requested.connect(lambda cid, a: spawn(self.archive(cid, a)))
        s.show_archived_changed.connect(lambda _on: spawn(self.refresh()))
        s.delete_requested.connect(lambda cid: spawn(self.delete(cid)))
        s.export_requested.connect(lambda cid: self.export_conversation(cid, s.title_of(cid)))
        s.import_requested.connect(self.import_chats)

    async def refresh(self) -> None:
        archived = self.sidebar.show_archived.isChecked()
        conversations = await self.db.list_conversations(include_archived=archived)
        self.sidebar.set_conversations([
            ConversationItem(c.id, c.title or "New chat", c.updated_at, c.pinned, c.archived)
            for c in conversations if not self.window.chats.unlisted(c)])
        shown = self.window.chat_tabs.shown_conversation()
        if shown is not None:
            self.sidebar.select_conversation(shown)

    async def search(self, query: str) -> None:
        if not query:
            return
        hits = await self.db.search(query)
        if query == self.sidebar.search_box.text().strip():
            self.sidebar.set_search_results([_result_item(h) for h in hits])

    async def rename(self, cid: int, title: str) -> None:
        await self.db.rename(cid, title)
        controller = self.window.chat_tabs.controllers.get(cid)
        if controller is not None:
            controller.session.rename(title)
        await self.refresh()

    async def pin(self, cid: int, pinned: bool) -> None:
        await self.db.set_pinned(cid, pinned)
        await self.refresh()

    async def archive(self, cid: int, archived: bool) -> None:
        """Archive a chat (its tab closes, the list leaves it out until "Show archived chats"),
        or bring it back. A new chat never written to is gone once its tab closes."""
        if archived and not await self._closed_and_kept(cid):
            return
        await self.db.set_archived(cid, archived)
        await self.refresh()
        title = (await self.db.get_conversation(cid)).title or "New chat"
        self.window.status.showMessage(
            f"Archived “{title}”: “Show archived chats” lists it." if archived
            else f"“{title}” is back in the list.", 5000)

    async def _closed_and_kept(self, cid: int) -> bool:
        """Close the chat's tab, if open; False when that left nothing to keep (an untouched
        new chat is gone once its tab closes)."""
        closing = self.window.chats.close(cid)
        if closing is None:
            return True
        await closing
        if cid in {c.id for c in await self.db.list_conversations(include_archived=True)}:
            return True
        await self.refresh()
        return False

    async def delete(self, cid: int) -> None:
        if not await self._closed_and_kept(cid):
            return
        conversation = await self.db.get_conversation(cid)
        await self.db.delete(cid)
        await self.refresh()
        self._offer_undo(cid, conversation.title or "New chat")

    def _offer_undo(self, cid: int, title: str) -> None:
        self.window.status.showMessage(f"Deleted “{title}”.", UNDO_SECONDS * 1000)
        if self.undoable_delete is not None:  # only the newest delete can be undone
            self.window.spawn(self.delete_for_good(self.undoable_delete))
        self.undoable_delete = cid
        if self._undo_connection is not None:
            self.undo_button.clicked.disconnect(self._undo_connection)
        self._undo_connection = self.undo_button.clicked.connect(
            lambda: self.window.spawn(self.undo_delete(cid)))
        self.undo_button.show()
        self._undo_timer.start()

    def _undo_expired(self) -> None:
        self.undo_button.hide()
        if self.undoable_delete is not None:
            self.window.spawn(self.delete_for_good(self.undoable_delete))
            self.undoable_delete = None

    async def delete_for_good(self, cid: int) -> None:
        """Once it can no longer be undone: the conversation leaves the store, and the blocks
        of it the prefix cache keeps on disk that no other chat used leave the disk."""
        await self.db.purge(cid)
        await self.window.host.forget_chat_blocks(cid)

    async def finish_deletes(self) -> None:
        """Chats deleted in a run that ended before their Undo window did (a crash) are deleted
        for good now."""
        for cid in await self.db.deleted_conversation_ids():
            await self.delete_for_good(cid)

    async def undo_delete(self, cid: int) -> None:
        self._undo_timer.stop()
        self.undoable_delete = None
        self.undo_button.hide()
        self.window.status.clearMessage()
        await self.db.undo_delete(cid)
        await self.refresh()
        await self.window.chat_tabs.open_conversation(cid)

    def close(self) -> int | None:
        """Closing ends the Undo window: the chat it would bring back, to delete for good."""
        deleted, self.undoable_delete = self.undoable_delete, None
        return deleted

    def export_conversation(self, cid: int, title: str | None = None) -> QFileDialog:
        """Non-blocking; the file name suggested is the chat's title and today's date."""
        dialog = QFileDialog(self.window, "Export chat", str(Path.home()),
                             ";;".join(EXPORT_FORMATS))
        dialog.setObjectName("exportDialog")
        dialog.setAcceptMode(QFileDialog.AcceptMode.AcceptSave)
        dialog.setDefaultSuffix("md")
        dialog.selectFile(export_file_name(title, date.today()))
        dialog.filterSelected.connect(lambda name: _follow_export_format(dialog, name))
        dialog.fileSelected.connect(lambda path: self.window.spawn(self._export_to(cid, path)))
        dialog.open()
        return dialog

    async def _export_to(self, cid: int, path: str) -> None:
        if path.endswith(".json"):
            text = await self.db.export_json([cid])
        else:
            text = await self.db.export_markdown(cid)
        await asyncio.get_running_loop().run_in_executor(
            self.window.host.executor, lambda: Path(path).write_text(text, encoding="utf-8"))
        self.window.status.showMessage(f"Exported to {path}", 5000)

    def import_chats(self) -> QFileDialog:
        """Non-blocking: the chats of a Pagoda export (a .json file) join the sidebar."""
        dialog = QFileDialog(self.window, "Import chats", str(Path.home()),
                             "Pagoda export (*.json);;All files (*)")
        dialog.setFileMode(QFileDialog.FileMode.ExistingFile)
        dialog.fileSelected.connect(lambda path: self.window.spawn(self.import_from(Path(path))))
        dialog.open()
        return dialog

    async def import_from(self, path: Path) -> None:
        try:
            cids = await import_chats(self.db, path, self.window.host.executor)
        except ChatImportError as error:
            self.window.message_box(QMessageBox.Icon.Warning, "Could not import chats",
                                    str(error), object_name="importErrorDialog")
            return
        await self.refresh()
        self.window.status.showMessage(imported_text(path, len(cids)), 10_000)


def _follow_export_format(dialog: QFileDialog, name_filter: str) -> None:
    """The suggested name's suffix follows the format picked."""
    suffix = EXPORT_FORMATS.get(name_filter, "md")
    dialog.setDefaultSuffix(suffix)
    chosen = dialog.selectedFiles()
    if chosen:
        dialog.selectFile(with_suffix(Path(chosen[0]).name, suffix))


def _result_item(hit: SearchHit) -> SearchResultItem:
    """The store's snippet is already HTML-escaped, with matches in <b>…</b>."""
    return SearchResultItem(hit.conversation_id, hit.message_id,
                            hit.conversation_title or "New chat", hit.snippet)
