"""The main window: a frame that makes the window's parts (sidebar, tabs, settings dock, model
picker, status bar), the feature controllers that run them (chat tabs, chat list, models,
servers, local server, settings), and connects them; start-up, shortcuts and closing."""

from __future__ import annotations

import asyncio
import html
import logging
from pathlib import Path
from typing import TypeVar

from PySide6.QtCore import QEvent, Qt, Signal
from PySide6.QtGui import QCloseEvent, QKeyEvent, QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QDialog,
    QMainWindow,
    QMessageBox,
    QSplitter,
    QTabWidget,
    QToolBar,
    QWidget,
)

from pagoda.app.components.chat.chat_sources import ChatSources
from pagoda.app.components.conversations.open_chats import OpenChats
from pagoda.app.components.documents.document_embeddings import DocumentEmbeddings, EmbeddingsState
from pagoda.app.components.server.api_key import ApiKeyFile
from pagoda.app.components.server.local_server import LocalServer
from pagoda.app.components.shared.async_store import AsyncStore
from pagoda.app.components.shared.connections import ConnectionKeys, SavedConnections
from pagoda.app.components.tools.toolbox import Toolbox
from pagoda.app.qt.chat.tabs import ChatTabs
from pagoda.app.qt.conversations.chat_list import ChatList
from pagoda.app.qt.conversations.sidebar import Sidebar
from pagoda.app.qt.documents.documents_dialog import DOCUMENTS_DIALOG, DocumentsDialog
from pagoda.app.qt.models.engine_host import EngineHost
from pagoda.app.qt.models.model_picker import ModelPicker
from pagoda.app.qt.models.model_settings import ModelSettingsPanel
from pagoda.app.qt.models.models_controller import ModelsController
from pagoda.app.qt.server.remote_servers import RemoteServers
from pagoda.app.qt.server.server_controller import LocalServerController
from pagoda.app.qt.server.server_settings import LocalServerPanel
from pagoda.app.qt.settings.appearance_settings import AppearancePanel
from pagoda.app.qt.settings.settings_dock import SettingsDock
from pagoda.app.qt.settings.settings_panel import SettingsPanel
from pagoda.app.qt.status_bar import EngineStatusBar
from pagoda.app.qt.tools.tools_dialog import TOOLS_DIALOG, ToolsDialog
from pagoda.app.qt.window_layout import WindowLayout, place_first_window

logger = logging.getLogger(__name__)
D = TypeVar("D", bound=QDialog)

SHORTCUTS = {
    "Ctrl+N": "New chat",
    "Ctrl+W": "Close the current tab",
    "Ctrl+Tab / Ctrl+Shift+Tab": "Next / previous tab",
    "Ctrl+F": "Search all chats",
    "Ctrl+,": "Show or hide the settings panel",
    "Enter / Shift+Enter": "Send / new line",
    "Esc": "Stop the reply (or cancel an edit); in the search box, clear it",
}


class MainWindow(QMainWindow):
    """`closed` fires once every partial reply is saved and the engine has stopped.
    `window_layout` keeps its size, place and Settings' state for the next start; without one
    it opens as on a first start, and nothing is kept.

    The feature controllers: `chat_tabs` (the tabs over OpenChats), `chat_list` (the sidebar),
    `models_controller` (the picker, loading), `remote_servers`, `server_controller` (the local
    server), `settings_dock`. They reach each other through the window."""

    closed = Signal()

    def __init__(self, db: AsyncStore, host: EngineHost,
                 api_key_file: ApiKeyFile | None = None,
                 connection_keys: ConnectionKeys | None = None,
                 window_layout: WindowLayout | None = None) -> None:
        super().__init__()
        self.recovered_from: Path | None = None
        self.setWindowTitle("Pagoda")
        self.window_layout = window_layout
        self.db = db
        self.host = host
        self.closing = False
        # The window's state without Qt (pagoda.app.components).
        self.sources = ChatSources(host, SavedConnections(db, connection_keys or ConnectionKeys()),
                                   db)
        self.toolbox = Toolbox(db)
        self.embeddings = DocumentEmbeddings(db, self.sources.saved)
        self.chats = OpenChats(db, self.sources, self.toolbox.for_chat, self.embeddings)
        self.local_server = LocalServer(host, api_key_file or ApiKeyFile.default())
        # Its parts.
        self.sidebar = Sidebar(self)
        self.tabs = QTabWidget(self, objectName="chatTabs", tabsClosable=True, movable=True,
                               documentMode=True)
        self.settings_panel = SettingsPanel(self)
        self.model_settings = ModelSettingsPanel(self)
        self.server_panel = LocalServerPanel(self)
        self.appearance_panel = AppearancePanel(self)
        self.status = EngineStatusBar(self)
        self.model_picker = ModelPicker(self)
        # The controllers that run them.
        self.chat_tabs = ChatTabs(self)
        self.controllers = self.chat_tabs.controllers
        self.chat_list = ChatList(self, self.sidebar)
        self.remote_servers = RemoteServers(self)
        self.models_controller = ModelsController(self, host, self.model_picker,
                                                  self.model_settings)
        self.local_models = self.models_controller.local_models
        self.model_library = self.models_controller.library
        self.settings_dock = SettingsDock(self, self.settings_panel,
                                          [self.model_settings, self.server_panel],
                                          self.appearance_panel)
        self._build()
        self._connect()
        if window_layout is not None:
            window_layout.restore(self)
        else:
            place_first_window(self)
        self.server_controller = LocalServerController(self.local_server, self.server_panel,
                                                       self.status, db, self.spawn, self)

    def _build(self) -> None:
        splitter = QSplitter(Qt.Orientation.Horizontal, self)
        splitter.addWidget(self.sidebar)
        splitter.addWidget(self.tabs)
        splitter.setStretchFactor(1, 1)
        splitter.setSizes([260, 940])
        self.setCentralWidget(splitter)
        self.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, self.settings_dock)
        self.setStatusBar(self.status)
        self.status.addPermanentWidget(self.chat_list.undo_button)
        self.chat_list.undo_button.hide()
        toolbar = QToolBar("Model", self, objectName="modelToolbar", movable=False)
        toolbar.addWidget(self.model_picker)
        toolbar.addSeparator()
        toolbar.addAction("Settings", self.settings_dock.toggle)
        toolbar.addAction("Tools", self.open_tools_dialog)
        toolbar.addAction("Documents", self.open_documents_dialog)
        toolbar.addAction("Shortcuts", self.show_shortcuts)
        self.addToolBar(toolbar)
        tabs = self.chat_tabs
        for keys, slot in [("Ctrl+N", lambda: self.spawn(tabs.new_chat())),
                           ("Ctrl+W", lambda: tabs.close_tab(self.tabs.currentIndex())),
                           ("Ctrl+Tab", lambda: tabs.cycle(1)),
                           ("Ctrl+Shift+Tab", lambda: tabs.cycle(-1)),
                           ("Ctrl+F", self.sidebar.search_box.setFocus),
                           ("Ctrl+,", self.settings_dock.toggle)]:
            QShortcut(QKeySequence(keys), self, slot,
                      context=Qt.ShortcutContext.ApplicationShortcut)

    def _connect(self) -> None:
        self.chats.on_purged = lambda _cid: self.spawn(self.chat_list.refresh())
        self.toolbox.on_changed = self._show_tool_servers
        self.embeddings.on_changed = self._embeddings_changed
        self.models_controller.connect()
        self.disk_cache = self.models_controller.disk_cache
        self.models_folder = self.models_controller.models_folder
        self.settings_dock.visibilityChanged.connect(  # what is on disk, as the settings open
            lambda shown: shown and self.spawn(self.disk_cache.refresh_usage()))
        self.host.status_changed.connect(self._host_status_changed)
        self.host.availability_changed.connect(self.chat_tabs.show_local_sources)
        self.status.show_status(self.host.status)

    def keyPressEvent(self, event: QKeyEvent) -> None:
        """Esc that no widget used (the composer cancelling an edit, the search box clearing,
        a dialog closing) reaches the window from wherever the focus is: it stops the current
        chat's reply."""
        if event.key() == Qt.Key.Key_Escape and self.chat_tabs.stop_current_reply():
            return
        super().keyPressEvent(event)

    def changeEvent(self, event: QEvent) -> None:
        """The writing icons are drawn in the palette's colors: a theme change redraws them."""
        super().changeEvent(event)
        if event.type() == QEvent.Type.PaletteChange:
            self.chat_tabs.redraw_writing()

    def spawn(self, coro) -> asyncio.Task:
        """Run a coroutine; its failure is shown in a message box instead of a log line only."""
        task = asyncio.ensure_future(coro)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task) -> None:
        if task.cancelled() or task.exception() is None or self.closing:
            return
        exc = task.exception()
        logger.error("window task failed: %s", exc, exc_info=exc)
        self.message_box(QMessageBox.Icon.Warning, "Pagoda", str(exc))

    async def restore(self) -> None:
        """Reopen the tabs of the last session (or a new chat), show the conversation list and
        finish the deletes a crash left undoable."""
        await self.sources.load()
        await self.embeddings.load()
        await self.toolbox.load()
        self._show_tool_servers()
        await self.settings_dock.restore_defaults()
        self.models_controller.refresh_picker()
        await self.chat_list.refresh()
        await self.chats.restore()
        await self.chat_list.finish_deletes()

    def open_tools_dialog(self) -> ToolsDialog:
        """Settings → Tools, non-modal; one dialog, shown again (and raised) if open."""
        dialog = self.findChild(ToolsDialog, TOOLS_DIALOG)
        if dialog is None:
            dialog = ToolsDialog(self.toolbox, self.spawn, self)
        return _presented(dialog)

    def open_documents_dialog(self) -> DocumentsDialog:
        """Settings → Documents (the embedding server), non-modal; one dialog, raised if open."""
        dialog = self.findChild(DocumentsDialog, DOCUMENTS_DIALOG)
        if dialog is None:
            dialog = DocumentsDialog(self.embeddings, self.spawn, self)
        dialog.refresh()
        return _presented(dialog)

    def _embeddings_changed(self, state: EmbeddingsState) -> None:
        dialog = self.findChild(DocumentsDialog, DOCUMENTS_DIALOG)
        if dialog is not None:
            dialog.show_state(state)

    def _show_tool_servers(self) -> None:
        if not self.closing:
            self.settings_panel.set_tool_servers(self.toolbox.server_views())

    def _host_status_changed(self, status) -> None:
        self.status.show_memory(status.resident_bytes)
        tabs = self.chat_tabs
        for local in filter(tabs.is_local, tabs.controllers.values()):
            tabs.show_model_loading(local)
        self.models_controller.mark_loading()
        controller = tabs.current_controller()
        if controller is None or tabs.is_local(controller):
            self.status.show_status(status)

    def message_box(self, icon: QMessageBox.Icon, title: str, text: str,
                    object_name: str = "messageBox",
                    parent: QWidget | None = None) -> QMessageBox:
        """Non-blocking: never exec() a dialog while coroutines run on this loop. Over parent,
        else this window."""
        box = QMessageBox(icon, title, text, QMessageBox.StandardButton.Ok, parent or self)
        box.setObjectName(object_name)
        box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        box.open()
        return box

    def show_shortcuts(self) -> None:
        rows = "".join(f"<tr><td><b>{html.escape(k)}</b></td><td>{html.escape(v)}</td></tr>"
                       for k, v in SHORTCUTS.items())
        self.message_box(QMessageBox.Icon.Information, "Keyboard shortcuts",
                         f"<table cellspacing=6>{rows}</table>", object_name="shortcutsDialog")

    def notify_recovered(self, moved_to: Path) -> None:
        self.message_box(
            QMessageBox.Icon.Warning, "The chat database was damaged",
            f"Pagoda could not read its database, so it started a fresh one. The damaged file "
            f"was kept, untouched, at:\n{moved_to}", object_name="recoveredDialog")

    def closeEvent(self, event: QCloseEvent) -> None:
        """Keep every partial reply (as interrupted), remember the tabs, delete for good what
        could still be undone, stop the engine."""
        self.closing = True
        if self.window_layout is not None:
            self.window_layout.save(self)
        self.chats.close_all()  # queues each partial reply's ending on the store's worker
        self.toolbox.close()  # every MCP server stops; a call in flight was cancelled above
        self.embeddings.close()  # passages not embedded yet are embedded next time
        self.chats.save_now()
        deleted = self.chat_list.close()
        if deleted is not None:  # closing ends the Undo window
            self.db.submit(lambda store: store.purge(deleted))
        self.db.drain()  # the app may exit as soon as this returns
        self.disk_cache.stop()
        self.remote_servers.close()
        self.server_controller.shutdown()  # API requests end before the engine they run on
        self.host.shutdown()
        if deleted is not None:  # the engine has written all it had queued: none comes back
            self.host.forget_chat_blocks_at_exit(deleted)
        self.models_controller.close()
        event.accept()
        self.closed.emit()


def _presented(dialog: D) -> D:
    """A non-modal dialog shown, raised and given the focus, whether new or already open."""
    dialog.show()
    dialog.raise_()
    dialog.activateWindow()
    return dialog
