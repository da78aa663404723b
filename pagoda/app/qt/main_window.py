"""The main window: sidebar, conversation tabs, settings panel, model picker, local server and
status bar."""

from __future__ import annotations

import asyncio
import gc
import html
import logging
from datetime import date
from pathlib import Path
from typing import TypeVar

from PySide6.QtCore import QEvent, QSize, Qt, QTimer, Signal
from PySide6.QtGui import QCloseEvent, QIcon, QKeyEvent, QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QApplication,
    QDialog,
    QDockWidget,
    QFileDialog,
    QMainWindow,
    QMessageBox,
    QPushButton,
    QScrollArea,
    QSplitter,
    QTabWidget,
    QToolBar,
    QVBoxLayout,
    QWidget,
)

from pagoda.app.backends.services.model_files import bundled_model_file
from pagoda.app.components.server.api_key import ApiKeyFile
from pagoda.app.components.shared.async_store import AsyncStore
from pagoda.app.components.settings.chat_defaults import load_chat_defaults, save_chat_defaults
from pagoda.app.components.conversations.chat_import import ChatImportError, import_chats, imported_text
from pagoda.app.components.chat.chat_session import ChatSession
from pagoda.app.components.chat.chat_sources import LOCAL, ChatSources, RemoteSource
from pagoda.app.components.shared.connections import (
    AddServerFlow,
    ConnectionKeys,
    SavedConnections,
    ServerConnection,
)
from pagoda.app.components.documents.document_embeddings import DocumentEmbeddings, EmbeddingsState
from pagoda.app.components.conversations.export_names import EXPORT_FORMATS, export_file_name, with_suffix
from pagoda.app.components.models.local_models import LocalListing, LocalModels
from pagoda.app.components.server.local_server import LocalServer
from pagoda.app.components.models.model_choices import (
    MODEL_FILE_FILTER,
    ModelChoice,
    ModelChoices,
    ModelLoadError,
    model_source_from_selection,
)
from pagoda.app.components.models.model_library import DONE, Download, ModelLibrary, NullLibraryView
from pagoda.app.components.conversations.open_chats import OpenChats
from pagoda.app.components.models.opened_models import OpenedModels
from pagoda.app.components.tools.toolbox import Toolbox
from pagoda.app.components.shared.view_models import SamplingView
from pagoda.app.qt.server.add_server import open_add_server_dialog
from pagoda.app.qt.chat.chat_tab import ChatTab
from pagoda.app.qt.chat.controller import ChatController
from pagoda.app.qt.models.disk_cache_settings import DiskCacheSettings
from pagoda.app.qt.models.engine_host import EngineHost
from pagoda.app.qt.models.models_folder_settings import ModelsFolderSettings
from pagoda.app.qt.server.server_controller import LocalServerController
from pagoda.app.qt.shared.theme import THEMES, apply_theme, icon
from pagoda.app.qt.settings.appearance_settings import AppearancePanel
from pagoda.app.qt.documents.documents_dialog import DOCUMENTS_DIALOG, DocumentsDialog
from pagoda.app.qt.models.model_library_dialog import ModelLibraryDialog
from pagoda.app.qt.models.model_picker import ModelPicker
from pagoda.app.qt.models.model_settings import ModelSettingsPanel
from pagoda.app.qt.server.server_settings import LocalServerPanel
from pagoda.app.qt.settings.settings_panel import SettingsPanel
from pagoda.app.qt.conversations.sidebar import ConversationItem, SearchResultItem, Sidebar
from pagoda.app.qt.status_bar import EngineStatusBar, loading_text, picker_loading_mark
from pagoda.app.qt.tools.tools_dialog import TOOLS_DIALOG, ToolsDialog
from pagoda.app.qt.window_layout import WindowLayout, place_first_window
from pagoda.app.store import SearchHit

logger = logging.getLogger(__name__)
D = TypeVar("D", bound=QDialog)

UNDO_SECONDS = 10
SHORTCUTS = {
    "Ctrl+N": "New chat",
    "Ctrl+W": "Close the current tab",
    "Ctrl+Tab / Ctrl+Shift+Tab": "Next / previous tab",
    "Ctrl+F": "Search all chats",
    "Ctrl+,": "Show or hide the settings panel",
    "Enter / Shift+Enter": "Send / new line",
    "Esc": "Stop the reply (or cancel an edit); in the search box, clear it",
}
# Item data of the picker's last entry; a model's entry holds its path ("" for the default).
OPEN_MODEL_ITEM = "open-model-file"
GET_MODELS_ITEM = "get-models"
ADD_SERVER_ITEM = "add-server"
REMOVE_SERVER_ITEM = "remove-server"
SERVER_ITEM_PREFIX = "server:"  # + a saved connection's id
REMOTE_STATS_INTERVAL_MS = 500
LAST_MODEL_SETTING = "last_model"
QUANTIZATION_SETTING = "quantization"
THEME_SETTING = "theme"


class MainWindow(QMainWindow):
    """`closed` fires once every partial reply is saved and the engine has stopped.
    `window_layout` keeps its size, place and Settings' state for the next start; without one
    it opens as on a first start, and nothing is kept."""

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
        self.controllers: dict[int, ChatController] = {}
        self.sources = ChatSources(host, SavedConnections(db, connection_keys or ConnectionKeys()),
                                   db)
        self.toolbox = Toolbox(db)
        self.embeddings = DocumentEmbeddings(db, self.sources.saved)
        self.chats = OpenChats(db, self.sources, self.toolbox.for_chat, self.embeddings)
        self.sidebar = Sidebar(self)
        self.tabs = QTabWidget(self, objectName="chatTabs", tabsClosable=True, movable=True,
                               documentMode=True)
        self.settings_panel = SettingsPanel(self)
        self.model_settings = ModelSettingsPanel(self)
        self.server_panel = LocalServerPanel(self)
        self.appearance_panel = AppearancePanel(self)
        self.model_choices = ModelChoices(host.engine_config)
        self.model_library = ModelLibrary(keys=self.sources.saved.keys,
                                          quantization=lambda: self.host.quantization)
        self.model_library.attach(_DownloadsInPicker(self))
        self.local_models = LocalModels(loaded_model=lambda: self.host.model_path,
                                        downloading=self.model_library.active_folders,
                                        bundled=bundled_model_file,
                                        opened=OpenedModels.default())
        self.local_models.attach(_LocalModelsInPicker(self))
        self._library_dialog: ModelLibraryDialog | None = None
        self._describing: asyncio.Task | None = None
        self._picker_choices: list[ModelChoice] = []
        self.status = EngineStatusBar(self)
        self.model_picker = ModelPicker(self)
        self._undo_button = QPushButton("Undo", self, objectName="undoButton")
        self._undo_timer = QTimer(self, singleShot=True, interval=UNDO_SECONDS * 1000)
        self._undo_connection = None
        self._undoable_delete: int | None = None  # the conversation Undo would bring back
        self._remote_stats_timer = QTimer(self, interval=REMOTE_STATS_INTERVAL_MS,
                                          timeout=self._show_remote_stats)
        self._closing = False
        self._build()
        self._connect()
        if window_layout is not None:
            window_layout.restore(self)
        else:
            place_first_window(self)
        self.local_server = LocalServer(host, api_key_file or ApiKeyFile.default())
        self.server_controller = LocalServerController(self.local_server, self.server_panel,
                                                       self.status, db, self.spawn, self)

    # -- construction ----------------------------------------------------------------------------

    def _build(self) -> None:
        splitter = QSplitter(Qt.Orientation.Horizontal, self)
        splitter.addWidget(self.sidebar)
        splitter.addWidget(self.tabs)
        splitter.setStretchFactor(1, 1)
        splitter.setSizes([260, 940])
        self.setCentralWidget(splitter)
        dock = QDockWidget("Settings", self, objectName="settingsDock")
        dock.setWidget(self._settings_column())
        self.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, dock)
        self.settings_dock = dock
        self.setStatusBar(self.status)
        self.status.addPermanentWidget(self._undo_button)
        self._undo_button.hide()
        self._build_toolbar()
        self._build_shortcuts()

    def _settings_column(self) -> QScrollArea:
        """This chat's settings above the model's and the local server's, which every chat
        shares; they scroll, so that however much they hold (tools, a note after Reset) the
        window keeps fitting the screen."""
        column = QWidget(self, objectName="settingsColumn")
        layout = QVBoxLayout(column)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.settings_panel)
        layout.addWidget(self.model_settings)
        layout.addWidget(self.server_panel)
        layout.addWidget(self.appearance_panel)
        layout.addStretch(1)
        return _VerticalScroll(column, self)

    def _build_toolbar(self) -> None:
        toolbar = QToolBar("Model", self, objectName="modelToolbar", movable=False)
        self._render_model_picker([self.model_choices.known(None, self.host.quantization)])
        toolbar.addWidget(self.model_picker)
        toolbar.addSeparator()
        toolbar.addAction("Settings", self.toggle_settings)
        toolbar.addAction("Tools", self.open_tools_dialog)
        toolbar.addAction("Documents", self.open_documents_dialog)
        toolbar.addAction("Shortcuts", self.show_shortcuts)
        self.addToolBar(toolbar)

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

    def _build_shortcuts(self) -> None:
        for keys, slot in [("Ctrl+N", lambda: self.spawn(self.new_chat())),
                           ("Ctrl+W", lambda: self.close_tab(self.tabs.currentIndex())),
                           ("Ctrl+Tab", lambda: self._cycle_tabs(1)),
                           ("Ctrl+Shift+Tab", lambda: self._cycle_tabs(-1)),
                           ("Ctrl+F", self.sidebar.search_box.setFocus),
                           ("Ctrl+,", self.toggle_settings)]:
            QShortcut(QKeySequence(keys), self, slot,
                      context=Qt.ShortcutContext.ApplicationShortcut)

    def keyPressEvent(self, event: QKeyEvent) -> None:
        """Esc that no widget used (the composer cancelling an edit, the search box clearing,
        a dialog closing) reaches the window from wherever the focus is: it stops the current
        chat's reply."""
        if event.key() == Qt.Key.Key_Escape and self.stop_current_reply():
            return
        super().keyPressEvent(event)

    def stop_current_reply(self) -> bool:
        """Stop the current chat's reply; False when none is being written."""
        controller = self.current_controller()
        if controller is None or not controller.is_streaming:
            return False
        controller.stop()
        return True

    def _connect(self) -> None:
        s = self.sidebar
        s.new_requested.connect(lambda: self.spawn(self.new_chat()))
        s.open_requested.connect(lambda cid, mid: self.spawn(self.show_message(cid, mid)))
        s.search_requested.connect(lambda q: self.spawn(self.search(q)))
        s.rename_requested.connect(lambda cid, t: self.spawn(self.rename(cid, t)))
        s.pin_requested.connect(lambda cid, p: self.spawn(self.pin(cid, p)))
        s.archive_requested.connect(lambda cid, a: self.spawn(self.archive(cid, a)))
        s.show_archived_changed.connect(lambda _on: self.spawn(self.refresh_conversations()))
        s.delete_requested.connect(lambda cid: self.spawn(self.delete(cid)))
        s.export_requested.connect(
            lambda cid: self.export_conversation(cid, self.sidebar.title_of(cid)))
        s.import_requested.connect(self.import_chats)
        self.tabs.tabCloseRequested.connect(self.close_tab)
        self.tabs.currentChanged.connect(self._tab_changed)
        self.tabs.tabBar().tabMoved.connect(
            lambda *_: self.chats.move([t.conversation_id for t in self.open_tabs()]))
        self.chats.on_opened = self._add_tab
        self.chats.on_closed = self._remove_tab
        self.chats.on_current = self._show_tab
        self.chats.on_purged = lambda _cid: self.spawn(self.refresh_conversations())
        self.toolbox.on_changed = self._show_tool_servers
        self.embeddings.on_changed = self._embeddings_changed
        self.settings_panel.settings_changed.connect(self._settings_edited)
        self.settings_panel.defaults_requested.connect(
            lambda settings: self.spawn(self.use_as_defaults(settings)))
        self.settings_panel.built_in_defaults_requested.connect(
            lambda: self.spawn(save_chat_defaults(self.db, SamplingView())))
        self.model_picker.activated.connect(self._model_picked)
        self.model_settings.quantization_changed.connect(self.set_quantization)
        self.disk_cache = DiskCacheSettings(self.model_settings, self.host, self.db, self.spawn,
                                            lambda text: self.status.showMessage(text, 10_000))
        self.models_folder = ModelsFolderSettings(
            self.model_settings, self.model_library, self.local_models, self.db, self.spawn,
            lambda text: self.status.showMessage(text, 10_000))
        self.settings_dock.visibilityChanged.connect(  # what is on disk, as the settings open
            lambda shown: shown and self.spawn(self.disk_cache.refresh_usage()))
        self.appearance_panel.theme_changed.connect(self.set_theme)
        self._undo_timer.timeout.connect(self._undo_expired)
        self.host.status_changed.connect(self._host_status_changed)
        self.host.availability_changed.connect(self._show_local_sources)
        self.host.model_loaded.connect(self._model_loaded)
        self.host.load_failed.connect(self._model_failed)
        self.status.show_status(self.host.status)

    def spawn(self, coro) -> asyncio.Task:
        """Run a coroutine; its failure is shown in a message box instead of a log line only."""
        task = asyncio.ensure_future(coro)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task) -> None:
        if task.cancelled() or task.exception() is None or self._closing:
            return
        exc = task.exception()
        logger.error("window task failed: %s", exc, exc_info=exc)
        self._message_box(QMessageBox.Icon.Warning, "Pagoda", str(exc))

    # -- start-up and tabs -----------------------------------------------------------------------

    async def restore(self) -> None:
        """Reopen the tabs of the last session (or a new chat), show the conversation list and
        finish the deletes a crash left undoable."""
        await self.sources.load()
        await self.embeddings.load()
        await self.toolbox.load()
        self._show_tool_servers()
        self.settings_panel.set_defaults(await load_chat_defaults(self.db))
        self.refresh_model_picker()
        await self.refresh_conversations()
        await self.chats.restore()
        await self._finish_deletes()

    async def new_chat(self) -> None:
        """A new chat answers from where the current one does."""
        await self.chats.new_chat()
        await self.refresh_conversations()

    async def open_conversation(self, cid: int) -> ChatTab:
        await self.chats.open(cid)
        return self.controllers[cid].view

    async def show_message(self, cid: int, message_id: int = 0) -> None:
        """Open a conversation; for a search hit, on the branch that holds the message."""
        await self.open_conversation(cid)
        controller = self.controllers[cid]
        if message_id and message_id not in {m.id for m in controller.path}:
            await controller.show_branch_of(message_id)

    def close_tab(self, index: int) -> asyncio.Task | None:
        tab = self.tabs.widget(index)
        return self.chats.close(tab.conversation_id) if isinstance(tab, ChatTab) else None

    # -- the tabs render OpenChats ------------------------------------------------------------------

    def _add_tab(self, session: ChatSession) -> None:
        cid = session.conversation_id
        tab = ChatTab(cid)
        controller = ChatController(session, tab, parent=self)
        self.controllers[cid] = controller
        self._show_source(controller)
        tab.title_changed.connect(lambda title, t=tab: self._retitle(t, title))
        controller.conversation_changed.connect(lambda _cid: self.spawn(self.refresh_conversations()))
        controller.streaming_changed.connect(
            lambda writing, t=tab: self._show_writing(t, writing))
        self.tabs.addTab(tab, "New chat")

    def _show_writing(self, tab: ChatTab, writing: bool) -> None:
        """A chat writing a reply says so on its tab and its row in the list, whichever chat is
        shown."""
        index = self.tabs.indexOf(tab)
        if index >= 0:
            self.tabs.setTabIcon(index, icon("writing") if writing else QIcon())
        self.sidebar.show_writing(tab.conversation_id, writing)

    def changeEvent(self, event: QEvent) -> None:
        """The writing icons are drawn in the palette's colors: a theme change redraws them."""
        super().changeEvent(event)
        if event.type() == QEvent.Type.PaletteChange:
            for controller in self.controllers.values():
                if controller.is_streaming:
                    self._show_writing(controller.view, True)

    def _remove_tab(self, cid: int) -> None:
        controller = self.controllers.pop(cid)
        self.sidebar.show_writing(cid, False)
        self.tabs.removeTab(self.tabs.indexOf(controller.view))
        controller.view.deleteLater()

    def _show_tab(self, cid: int) -> None:
        """Make the chat's tab current; when it already was (a tab just opened), show its
        settings and title again through the same path, now that its session has them."""
        tab = self.controllers[cid].view
        if self.tabs.currentWidget() is tab:
            self._tab_changed(self.tabs.currentIndex())
        else:
            self.tabs.setCurrentWidget(tab)  # currentChanged -> _tab_changed
        tab.composer.focus_input()

    def open_tabs(self) -> list[ChatTab]:
        return [self.tabs.widget(i) for i in range(self.tabs.count())]

    def current_controller(self) -> ChatController | None:
        current = self.chats.current
        return self.controllers.get(current) if current is not None else None

    def _is_local(self, controller: ChatController) -> bool:
        return controller.session.source is self.host

    def _show_source(self, controller: ChatController) -> None:
        """The tab's label and whether it can send, as its source says now (asked again each
        time the engine's availability changes: a local chat waits for the model to load)."""
        tab, source = controller.view, controller.session.source
        tab.show_source(self.sources.describe(source))
        tab.composer.set_send_blocked(controller.session.unable_to_send())
        self._show_model_loading(controller)

    def _show_model_loading(self, controller: ChatController) -> None:
        """A local chat says, above its message box, how the model's load goes while it does;
        its source reads "loading", not "no model loaded", until the first model is in."""
        status = self.host.status
        loading = self._is_local(controller) and self.host.is_loading
        controller.view.show_model_loading(loading_text(status) if loading else None,
                                           status.load)
        if loading and not self.host.is_ready:
            controller.view.show_source(f"{status.model or 'the model'} · loading")

    async def save_open_tabs(self) -> None:
        await self.chats.save()

    def _retitle(self, tab: ChatTab, title: str) -> None:
        index = self.tabs.indexOf(tab)
        if index >= 0:
            self.tabs.setTabText(index, _elide(title))
            self.tabs.setTabToolTip(index, title)
        if tab is self.tabs.currentWidget():
            self._show_chat_title(title)

    def _show_chat_title(self, title: str) -> None:
        """The window and the settings panel name the current chat."""
        self.setWindowTitle(f"{title} · Pagoda")
        self.settings_panel.set_target(title)

    def _cycle_tabs(self, step: int) -> None:
        if self.tabs.count():
            self.tabs.setCurrentIndex((self.tabs.currentIndex() + step) % self.tabs.count())

    def _tab_changed(self, _index: int) -> None:
        tab = self.tabs.currentWidget()
        if isinstance(tab, ChatTab) and not self._closing:
            self.chats.select(tab.conversation_id)
            self.settings_panel.set_settings(tab.settings)
            self._show_chat_title(tab.title)
            self.sidebar.select_conversation(tab.conversation_id)
            self._render_model_picker()
            self._show_backend_status()
            self._show_thinking_switch()

    def _show_thinking_switch(self) -> None:
        """The chat settings' Thinking choice applies where the current chat's model has one."""
        controller = self.current_controller()
        backend = controller.session.source.backend if controller is not None else None
        self.settings_panel.set_thinking_switch(backend is not None and backend.thinking_switch)

    def _show_tool_servers(self) -> None:
        if not self._closing:
            self.settings_panel.set_tool_servers(self.toolbox.server_views())

    def _settings_edited(self, settings) -> None:
        tab = self.tabs.currentWidget()
        if isinstance(tab, ChatTab):
            tab.settings = settings
            tab.settings_changed.emit(settings)

    async def use_as_defaults(self, settings) -> None:
        """New chats start with these settings (the store keeps them); chats keep their own."""
        await save_chat_defaults(self.db, settings)
        self.settings_panel.set_defaults(settings)
        self.status.showMessage("New chats will start with these settings.", 5000)

    def toggle_settings(self) -> None:
        self.settings_dock.setVisible(not self.settings_dock.isVisible())

    # -- the conversation list -------------------------------------------------------------------

    async def refresh_conversations(self) -> None:
        archived = self.sidebar.show_archived.isChecked()
        conversations = await self.db.list_conversations(include_archived=archived)
        self.sidebar.set_conversations([
            ConversationItem(c.id, c.title or "New chat", c.updated_at, c.pinned, c.archived)
            for c in conversations if not self.chats.unlisted(c)])
        current = self.tabs.currentWidget()
        if isinstance(current, ChatTab):
            self.sidebar.select_conversation(current.conversation_id)

    async def search(self, query: str) -> None:
        if not query:
            return
        hits = await self.db.search(query)
        if query == self.sidebar.search_box.text().strip():
            self.sidebar.set_search_results([_result_item(h) for h in hits])

    async def rename(self, cid: int, title: str) -> None:
        await self.db.rename(cid, title)
        if cid in self.controllers:
            self.controllers[cid].session.rename(title)
        await self.refresh_conversations()

    async def pin(self, cid: int, pinned: bool) -> None:
        await self.db.set_pinned(cid, pinned)
        await self.refresh_conversations()

    async def archive(self, cid: int, archived: bool) -> None:
        """Archive a chat (its tab closes, the list leaves it out until "Show archived chats"),
        or bring it back. A new chat never written to is gone once its tab closes."""
        if archived:
            closing = self.chats.close(cid)
            if closing is not None:
                await closing
                if not await self._exists(cid):
                    await self.refresh_conversations()
                    return
        await self.db.set_archived(cid, archived)
        await self.refresh_conversations()
        title = (await self.db.get_conversation(cid)).title or "New chat"
        self.status.showMessage(
            f"Archived “{title}”: “Show archived chats” lists it." if archived
            else f"“{title}” is back in the list.", 5000)

    async def _exists(self, cid: int) -> bool:
        return cid in {c.id for c in await self.db.list_conversations(include_archived=True)}

    async def delete(self, cid: int) -> None:
        closing = self.chats.close(cid)
        if closing is not None:
            await closing  # an untouched new chat is gone after this: nothing to delete
            if not await self._exists(cid):
                await self.refresh_conversations()
                return
        conversation = await self.db.get_conversation(cid)
        await self.db.delete(cid)
        await self.refresh_conversations()
        self._offer_undo(cid, conversation.title or "New chat")

    def _offer_undo(self, cid: int, title: str) -> None:
        self.status.showMessage(f"Deleted “{title}”.", UNDO_SECONDS * 1000)
        if self._undoable_delete is not None:  # only the newest delete can be undone
            self.spawn(self.delete_for_good(self._undoable_delete))
        self._undoable_delete = cid
        if self._undo_connection is not None:
            self._undo_button.clicked.disconnect(self._undo_connection)
        self._undo_connection = self._undo_button.clicked.connect(
            lambda: self.spawn(self.undo_delete(cid)))
        self._undo_button.show()
        self._undo_timer.start()

    def _undo_expired(self) -> None:
        self._undo_button.hide()
        if self._undoable_delete is not None:
            self.spawn(self.delete_for_good(self._undoable_delete))
            self._undoable_delete = None

    async def delete_for_good(self, cid: int) -> None:
        """Once it can no longer be undone: the conversation leaves the store, and the blocks
        of it the prefix cache keeps on disk that no other chat used leave the disk."""
        await self.db.purge(cid)
        await self.host.forget_chat_blocks(cid)

    async def _finish_deletes(self) -> None:
        """Chats deleted in a run that ended before their Undo window did (a crash) are deleted
        for good now."""
        for cid in await self.db.deleted_conversation_ids():
            await self.delete_for_good(cid)

    async def undo_delete(self, cid: int) -> None:
        self._undo_timer.stop()
        self._undoable_delete = None
        self._undo_button.hide()
        self.status.clearMessage()
        await self.db.undo_delete(cid)
        await self.refresh_conversations()
        await self.open_conversation(cid)

    def export_conversation(self, cid: int, title: str | None = None) -> QFileDialog:
        """Non-blocking; the file name suggested is the chat's title and today's date."""
        dialog = QFileDialog(self, "Export chat", str(Path.home()), ";;".join(EXPORT_FORMATS))
        dialog.setObjectName("exportDialog")
        dialog.setAcceptMode(QFileDialog.AcceptMode.AcceptSave)
        dialog.setDefaultSuffix("md")
        dialog.selectFile(export_file_name(title, date.today()))
        dialog.filterSelected.connect(lambda name: _follow_export_format(dialog, name))
        dialog.fileSelected.connect(lambda path: self.spawn(self._export_to(cid, path)))
        dialog.open()
        return dialog

    async def _export_to(self, cid: int, path: str) -> None:
        if path.endswith(".json"):
            text = await self.db.export_json([cid])
        else:
            text = await self.db.export_markdown(cid)
        await asyncio.get_running_loop().run_in_executor(
            self.host.executor, lambda: Path(path).write_text(text, encoding="utf-8"))
        self.status.showMessage(f"Exported to {path}", 5000)

    def import_chats(self) -> QFileDialog:
        """Non-blocking: the chats of a Pagoda export (a .json file) join the sidebar."""
        dialog = QFileDialog(self, "Import chats", str(Path.home()),
                             "Pagoda export (*.json);;All files (*)")
        dialog.setFileMode(QFileDialog.FileMode.ExistingFile)
        dialog.fileSelected.connect(lambda path: self.spawn(self.import_from(Path(path))))
        dialog.open()
        return dialog

    async def import_from(self, path: Path) -> None:
        try:
            cids = await import_chats(self.db, path, self.host.executor)
        except ChatImportError as error:
            self._message_box(QMessageBox.Icon.Warning, "Could not import chats", str(error),
                              object_name="importErrorDialog")
            return
        await self.refresh_conversations()
        self.status.showMessage(imported_text(path, len(cids)), 10_000)

    # -- the model -------------------------------------------------------------------------------

    def _model_picked(self, index: int) -> None:
        data = self.model_picker.itemData(index) or ""
        if data == OPEN_MODEL_ITEM:
            self.open_model_dialog()
        elif data == GET_MODELS_ITEM:
            self.open_model_library()
        elif data == ADD_SERVER_ITEM:
            self.open_add_server_dialog()
        elif data == REMOVE_SERVER_ITEM:
            self.confirm_remove_server()
        elif data.startswith(SERVER_ITEM_PREFIX):
            self.use_source_in_current_chat(data.removeprefix(SERVER_ITEM_PREFIX))
        else:
            self.use_source_in_current_chat(LOCAL)
            if ((data or None) != self.host.model_path or not self.host.is_ready
                    or self._quantization_differs_from_running()):
                self.load_model(data or None)
        self.refresh_model_picker()  # until a new model loads, the picker shows the running one

    def use_source_in_current_chat(self, source_id: str) -> None:
        """Answer the current chat from the engine here (LOCAL) or a saved server."""
        controller = self.current_controller()
        if controller is None:
            return
        source = self.sources.source(source_id)
        if source is controller.session.source or not controller.session.use_source(source):
            return
        self._show_source(controller)
        self._render_model_picker()
        self._show_backend_status()
        self._show_thinking_switch()
        self.spawn(self.sources.choose(controller.conversation_id, source_id))

    def open_add_server_dialog(self):
        """Non-blocking: the server's address, its key, and one of its models."""
        return open_add_server_dialog(self, AddServerFlow(self.sources.saved),
                                      self._server_added)

    def confirm_remove_server(self) -> QMessageBox | None:
        """Asks first (non-blocking); removing forgets the server, its key and which chats used
        it (they answer from this computer again). The chats themselves are kept."""
        controller = self.current_controller()
        source = controller.session.source if controller is not None else None
        if not isinstance(source, RemoteSource):
            return None
        box = QMessageBox(QMessageBox.Icon.Question, "Remove the server",
                          f"Remove {source.connection.label}? Its API key is forgotten and the "
                          "chats that used it answer from this computer again. No chat is "
                          "deleted.", QMessageBox.StandardButton.Yes
                          | QMessageBox.StandardButton.Cancel, self)
        box.setObjectName("removeServerDialog")
        box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        box.finished.connect(lambda answer, cid=source.connection.id: (
            answer == QMessageBox.StandardButton.Yes and self.spawn(self.remove_server(cid))))
        box.open()
        return box

    async def remove_server(self, source_id: str) -> None:
        using = [c for c in self.controllers.values()
                 if self.sources.id_of(c.session.source) == source_id]
        if any(c.is_streaming for c in using):
            self._message_box(QMessageBox.Icon.Information, "Pagoda",
                              "A reply from that server is still being written: stop it or let "
                              "it finish, then remove the server.")
            return
        for controller in using:
            controller.session.use_source(self.host)
            self._show_source(controller)
        await self.sources.remove(source_id)
        self.refresh_model_picker()
        self._show_backend_status()

    def _server_added(self, connection: ServerConnection) -> None:
        self.sources.forget(connection.id)  # a server added again may have a new key
        self.use_source_in_current_chat(connection.id)
        self.refresh_model_picker()
        self.status.showMessage(f"Added {connection.label}: this chat now answers from it.",
                                5000)

    def _quantization_differs_from_running(self) -> bool:
        return self.host.quantization != self.host.loaded_quantization

    def open_model_dialog(self) -> QFileDialog:
        """Non-blocking: a .gguf file, or a model folder chosen by its config.json."""
        dialog = QFileDialog(self, "Open a model: a .gguf file, or a model folder's config.json",
                             str(Path.home()), MODEL_FILE_FILTER)
        dialog.setFileMode(QFileDialog.FileMode.ExistingFile)
        dialog.setObjectName("modelDialog")
        dialog.fileSelected.connect(self.open_model_file)
        dialog.open()
        return dialog

    def open_model_library(self) -> ModelLibraryDialog:
        """Non-blocking; one dialog, shown again if open. Its downloads go on when it closes."""
        if self._library_dialog is None:
            self._library_dialog = ModelLibraryDialog(
                self.model_library, lambda path: self.load_model(str(path)), self,
                self.local_models)
            self._library_dialog.finished.connect(self._library_closed)
        self._library_dialog.show()
        self._library_dialog.raise_()
        return self._library_dialog

    def _library_closed(self, _result: int) -> None:
        self._library_dialog.deleteLater()
        self._library_dialog = None

    def open_model_file(self, selected: str) -> None:
        try:
            source = model_source_from_selection(selected)
        except ModelLoadError as error:
            self._message_box(QMessageBox.Icon.Warning, "Not a model", str(error),
                              object_name="modelErrorDialog")
            return
        self.load_model(source)

    def refresh_model_picker(self) -> None:
        """Show the models as far as they are known, then describe them off the GUI thread."""
        sources, quantization = self._picker_sources(), self.host.quantization
        self._render_model_picker([self.model_choices.known(s, quantization) for s in sources])
        if self._describing is not None:
            self._describing.cancel()  # superseded: it would show an older list
        self._describing = self.spawn(self._describe_models(sources, quantization))

    def _picker_sources(self) -> list[str | None]:
        """The bundled model, the running one when it is another, the models folder's most
        recently used, and this run's downloads."""
        sources: list[str | None] = [None]
        loading = self.host.loading_model if self.host.is_loading else None
        for path in [self.host.model_path, loading, *map(str, self.local_models.recent()),
                     *map(str, self.model_library.finished_paths())]:
            if path is not None and path not in sources:
                sources.append(path)
        return sources

    async def _describe_models(self, sources: list[str | None], quantization: str) -> None:
        self._render_model_picker(
            [await self.model_choices.describe(s, quantization) for s in sources])

    def _render_model_picker(self, choices: list[ModelChoice] | None = None) -> None:
        """The local models (`choices`, or the last ones shown), the saved servers, and the
        actions; the entry of the current chat's source selected."""
        if choices is None:
            choices = self._picker_choices
        self._picker_choices = choices
        picker = self.model_picker
        picker.blockSignals(True)
        picker.clear()
        for choice in choices:
            self._add_picker_item(choice.text, choice.source or "", choice.tooltip)
        for connection in self.sources.saved.list():
            self._add_picker_item(f"{connection.label} · server",
                                  SERVER_ITEM_PREFIX + connection.id,
                                  f"{connection.model} on the server at {connection.base_url}")
        picker.insertSeparator(picker.count())
        self._add_picker_item("Open model file…", OPEN_MODEL_ITEM,
                              "A .gguf file, or a Hugging Face model folder")
        self._add_picker_item("Get models…", GET_MODELS_ITEM,
                              "Search the Hugging Face Hub and download GGUF models")
        self._add_picker_item("Add a server…", ADD_SERVER_ITEM,
                              "An OpenAI-compatible server: vLLM, SGLang, llama.cpp, Ollama, "
                              "or another Pagoda")
        controller = self.current_controller()
        if controller is not None and not self._is_local(controller):
            self._add_picker_item("Remove this chat's server…", REMOVE_SERVER_ITEM,
                                  "Forget the server and its key; its chats are kept")
        picker.blockSignals(False)
        self._mark_loading_in_picker()
        self._select_in_picker()

    def _mark_loading_in_picker(self) -> None:
        """The entry of the model loading now says so, and how far it has got."""
        if self.host.is_loading:
            self.model_picker.mark_loading(self.host.loading_model or "",
                                           picker_loading_mark(self.host.status.load))
        else:
            self.model_picker.mark_loading(None)

    def _add_picker_item(self, text: str, data: str, tooltip: str) -> None:
        self.model_picker.add_entry(text, data, tooltip)

    def _select_in_picker(self) -> None:
        """The current chat's source: its server, or the model running here (the one loading
        while none runs)."""
        controller = self.current_controller()
        if controller is not None and not self._is_local(controller):
            data = SERVER_ITEM_PREFIX + self.sources.id_of(controller.session.source)
        elif self.host.is_ready or not self.host.is_loading:
            data = self.host.model_path or ""
        else:
            data = self.host.loading_model or ""
        self.model_picker.setCurrentIndex(max(self.model_picker.findData(data), 0))

    async def restore_appearance(self, for_this_run: str | None = None) -> None:
        """The theme chosen in Settings last time, unless the start flag chose one for this run
        (which is not saved)."""
        stored = await self.db.get_setting(THEME_SETTING, "system")
        mode = for_this_run or (stored if stored in THEMES else "system")
        apply_theme(QApplication.instance(), mode)
        self.appearance_panel.set_theme(mode)

    def set_theme(self, mode: str) -> None:
        """The user's pick in Settings: applied at once and kept for the next start."""
        apply_theme(QApplication.instance(), mode)
        self.spawn(self.db.set_setting(THEME_SETTING, mode))

    async def restore_model_settings(self) -> None:
        """Before the first load: the quantization and the models folder the user chose last
        time."""
        quantization = self.host.known_quantization(
            await self.db.get_setting(QUANTIZATION_SETTING, "auto"))
        self.host.quantization = quantization
        self.model_settings.set_quantization(quantization)
        self.refresh_model_picker()
        await self.disk_cache.restore()
        await self.models_folder.restore()

    def set_quantization(self, quantization: str) -> None:
        """Kept for the next load; the picker shows each model's memory under it."""
        self.host.quantization = quantization
        self.spawn(self.db.set_setting(QUANTIZATION_SETTING, quantization))
        self.refresh_model_picker()
        if self.host.is_ready and self._quantization_differs_from_running():
            self.status.showMessage(f"Quantization {quantization} applies when a model next "
                                    "loads: pick the model again to reload it.", 10_000)

    def load_model(self, path: str | None) -> None:
        if self.host.is_loading:
            self._message_box(QMessageBox.Icon.Information, "Pagoda",
                              "A model is already loading: wait for it to finish.")
            return
        self.host.load(path)  # availability_changed: the local tabs stop sending meanwhile

    def _model_loaded(self, name: str) -> None:
        settle_the_heap()
        self.settings_panel.set_max_tokens_limit(self.host.max_model_len)
        self.refresh_model_picker()
        self.spawn(self.db.set_setting(LAST_MODEL_SETTING, self.host.model_path))
        self.local_models.record_use(self.host.model_path)
        self.spawn(self.disk_cache.refresh_usage())
        self._ready_tabs()
        self._show_thinking_switch()

    def _model_failed(self, message: str) -> None:
        self._ready_tabs()
        # Over the Models dialog while it is open: the model was picked there, and a box
        # behind it would go unseen.
        library = self._library_dialog
        self._message_box(QMessageBox.Icon.Critical, "Could not load the model", message,
                          object_name="modelErrorDialog",
                          parent=library if library is not None and library.isVisible()
                          else None)

    def _show_local_sources(self) -> None:
        for controller in self.controllers.values():
            if self._is_local(controller):
                self._show_source(controller)

    def _ready_tabs(self) -> None:
        for controller in self.controllers.values():
            if self._is_local(controller):
                self._show_source(controller)
                self.spawn(controller.refresh_context_meter())

    # -- the status bar: the current chat's backend ----------------------------------------------

    def _host_status_changed(self, status) -> None:
        self.status.show_memory(status.resident_bytes)
        for local in filter(self._is_local, self.controllers.values()):
            self._show_model_loading(local)
        self._mark_loading_in_picker()
        controller = self.current_controller()
        if controller is None or self._is_local(controller):
            self.status.show_status(status)

    def _show_backend_status(self) -> None:
        """The engine's figures for a local chat; what we measure of the server for a remote one."""
        controller = self.current_controller()
        if controller is None or self._is_local(controller):
            self._remote_stats_timer.stop()
            self.status.show_status(self.host.status)
        else:
            self._show_remote_stats()
            self._remote_stats_timer.start()

    def _show_remote_stats(self) -> None:
        controller = self.current_controller()
        source = controller.session.source if controller is not None else None
        if not isinstance(source, RemoteSource) or source.backend is None:
            self._remote_stats_timer.stop()
            return
        self.status.show_remote(source.connection.label, source.backend.stats())

    def _message_box(self, icon: QMessageBox.Icon, title: str, text: str,
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
        self._message_box(QMessageBox.Icon.Information, "Keyboard shortcuts",
                          f"<table cellspacing=6>{rows}</table>", object_name="shortcutsDialog")

    # -- closing ---------------------------------------------------------------------------------

    def closeEvent(self, event: QCloseEvent) -> None:
        """Keep every partial reply (as interrupted), remember the tabs, delete for good what
        could still be undone, stop the engine."""
        self._closing = True
        if self.window_layout is not None:
            self.window_layout.save(self)
        self.chats.close_all()  # queues each partial reply's ending on the store's worker
        self.toolbox.close()  # every MCP server stops; a call in flight was cancelled above
        self.embeddings.close()  # passages not embedded yet are embedded next time
        self.chats.save_now()
        deleted, self._undoable_delete = self._undoable_delete, None
        if deleted is not None:  # closing ends the Undo window
            self.db.submit(lambda store: store.purge(deleted))
        self.db.drain()  # the app may exit as soon as this returns
        self._remote_stats_timer.stop()
        self.disk_cache.stop()
        self.sources.shutdown()  # remote replies end; their partial text is already kept
        self.server_controller.shutdown()  # API requests end before the engine they run on
        self.host.shutdown()
        if deleted is not None:  # the engine has written all it had queued: none comes back
            self.host.forget_chat_blocks_at_exit(deleted)
        if self._describing is not None:
            self._describing.cancel()
        self.model_choices.close()
        self.model_library.close()  # a running download keeps its partial file for next time
        self.local_models.close()
        event.accept()
        self.closed.emit()

    def notify_recovered(self, moved_to: Path) -> None:
        self._message_box(
            QMessageBox.Icon.Warning, "The chat database was damaged",
            f"Pagoda could not read its database, so it started a fresh one. The damaged file "
            f"was kept, untouched, at:\n{moved_to}", object_name="recoveredDialog")


class _VerticalScroll(QScrollArea):
    """`content` at the scroll area's width, scrolled up and down: as wide as the content needs
    (never cut on the right), and as low as the window needs (what does not fit scrolls)."""

    def __init__(self, content: QWidget, parent: QWidget) -> None:
        super().__init__(parent, objectName="settingsScroll", widgetResizable=True)
        self.setFrameShape(QScrollArea.Shape.NoFrame)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setWidget(content)

    def _width_for(self, content_width: int) -> int:
        return content_width + self.verticalScrollBar().sizeHint().width() + 2 * self.frameWidth()

    def sizeHint(self) -> QSize:
        return QSize(self._width_for(self.widget().sizeHint().width()), super().sizeHint().height())

    def minimumSizeHint(self) -> QSize:
        return QSize(self._width_for(self.widget().minimumSizeHint().width()),
                     super().minimumSizeHint().height())


class _DownloadsInPicker(NullLibraryView):
    """A finished download joins the model picker."""

    def __init__(self, window: MainWindow) -> None:
        self._window = window

    def show_download(self, download: Download) -> None:
        if download.state == DONE:
            self._window.refresh_model_picker()
            self._window.local_models.refresh()


class _LocalModelsInPicker:
    """The models folder's most recently used models join the picker."""

    def __init__(self, window: MainWindow) -> None:
        self._window = window
        self._shown: list[Path] = []

    def show_listing(self, listing: LocalListing) -> None:
        recent = [m.path for m in listing.recent()]
        if recent != self._shown:
            self._shown = recent
            self._window.refresh_model_picker()

    def show_status(self, text: str, error: bool = False) -> None: ...


def _follow_export_format(dialog: QFileDialog, name_filter: str) -> None:
    """The suggested name's suffix follows the format picked."""
    suffix = EXPORT_FORMATS.get(name_filter, "md")
    dialog.setDefaultSuffix(suffix)
    chosen = dialog.selectedFiles()
    if chosen:
        dialog.selectFile(with_suffix(Path(chosen[0]).name, suffix))


def settle_the_heap() -> None:
    """Collect once, then keep the objects alive now (torch's, the model's, the app's: about
    half a million once a model is loaded) out of every later collection. A full collection
    scans them all with the GIL held, which froze the window for 270-330 ms now and then while
    replies streamed (bench/gui_responsiveness.py); after a load the user waits anyway."""
    gc.collect()
    gc.freeze()


def _elide(title: str, limit: int = 28) -> str:
    return title if len(title) <= limit else title[: limit - 1] + "…"


def _result_item(hit: SearchHit) -> SearchResultItem:
    """The store's snippet is already HTML-escaped, with matches in <b>…</b>."""
    return SearchResultItem(hit.conversation_id, hit.message_id,
                            hit.conversation_title or "New chat", hit.snippet)


def _presented(dialog: D) -> D:
    """A non-modal dialog shown, raised and given the focus, whether new or already open."""
    dialog.show()
    dialog.raise_()
    dialog.activateWindow()
    return dialog
