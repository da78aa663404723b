"""What the window's feature controllers (chat tabs, chat list, models, remote servers, the
settings dock) use of the window and of each other. MainWindow makes them and is a WindowFrame;
they cannot import it (it imports them), nor one another's feature, so each peer is named here
by the few methods the others call on it."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Mapping
from concurrent.futures import Executor
from typing import Any, Protocol

from PySide6.QtWidgets import QDialog, QMessageBox, QTabWidget, QWidget

from pagoda.app.backends import BackendStats
from pagoda.app.components.chat.chat_session import ChatSession
from pagoda.app.components.chat.chat_sources import ChatSources
from pagoda.app.components.chat.seams import BackendSource
from pagoda.app.components.conversations.open_chats import OpenChats
from pagoda.app.components.shared.async_store import AsyncStore
from pagoda.app.components.shared.view_models import EngineStatusView, SamplingView


class StatusLine(Protocol):
    """The window's status bar (qt/status_bar's EngineStatusBar)."""

    def showMessage(self, message: str, timeout: int = 0) -> None: ...
    def clearMessage(self) -> None: ...
    def show_status(self, status: EngineStatusView) -> None: ...
    def show_remote(self, label: str, stats: BackendStats) -> None: ...


class LocalHost(BackendSource, Protocol):
    """The engine host (qt/models' EngineHost) as a source of replies, and what the chat tabs,
    the chat list and the remote servers read of it."""

    executor: Executor  # the host's threads, for file work off the loop

    @property
    def status(self) -> EngineStatusView: ...
    @property
    def is_loading(self) -> bool: ...
    @property
    def is_ready(self) -> bool: ...

    async def forget_chat_blocks(self, conversation_id: int) -> int: ...


class OpenChat(Protocol):
    """One open tab's chat (qt/chat's ChatController)."""

    session: ChatSession

    @property
    def conversation_id(self) -> int: ...


class OpenTabs(Protocol):
    """The chat tabs (qt/chat's ChatTabs): `controllers` by conversation id."""

    @property
    def controllers(self) -> Mapping[int, OpenChat]: ...

    def current_controller(self) -> OpenChat | None: ...
    def shown_conversation(self) -> int | None: ...
    def is_local(self, controller: OpenChat) -> bool: ...
    def show_source(self, controller: OpenChat) -> None: ...
    def show_thinking_switch(self) -> None: ...
    def ready_tabs(self) -> None: ...
    def edit_current_settings(self, settings: SamplingView) -> None: ...
    async def new_chat(self) -> None: ...
    async def open_conversation(self, cid: int) -> QWidget: ...
    async def show_message(self, cid: int, message_id: int = 0) -> None: ...


class ChatListing(Protocol):
    """The chat list's controller (qt/conversations' ChatList)."""

    async def refresh(self) -> None: ...


class ChatRows(Protocol):
    """The sidebar (qt/conversations' Sidebar), as the chat tabs mark its rows."""

    def show_writing(self, conversation_id: int, writing: bool) -> None: ...
    def select_conversation(self, conversation_id: int | None) -> None: ...


class ChatSettings(Protocol):
    """This chat's settings panel (qt/settings' SettingsPanel), as the tabs and models fill it."""

    def set_target(self, title: str) -> None: ...
    def set_settings(self, settings: SamplingView) -> None: ...
    def set_thinking_switch(self, available: bool) -> None: ...
    def set_max_tokens_limit(self, limit: int) -> None: ...


class ModelPicking(Protocol):
    """The model picker's controller (qt/models' ModelsController)."""

    def refresh_picker(self) -> None: ...
    def render_picker(self) -> None: ...


class ServerChoice(Protocol):
    """The saved servers' controller (qt/server's RemoteServers)."""

    def show_backend_status(self) -> None: ...
    def use_source_in_current_chat(self, source_id: str) -> None: ...
    def open_add_server_dialog(self) -> QDialog: ...
    def confirm_remove_server(self) -> QMessageBox | None: ...


class WindowFrame(Protocol):
    """The main window as its feature controllers see it. It is also the QWidget they parent
    their dialogs and message boxes to (a Protocol cannot name a base class)."""

    db: AsyncStore
    sources: ChatSources
    chats: OpenChats
    host: LocalHost
    closing: bool
    tabs: QTabWidget
    status: StatusLine
    sidebar: ChatRows
    settings_panel: ChatSettings
    chat_tabs: OpenTabs
    chat_list: ChatListing
    models_controller: ModelPicking
    remote_servers: ServerChoice

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task: ...
    def message_box(self, icon: QMessageBox.Icon, title: str, text: str,
                    object_name: str = "messageBox",
                    parent: QWidget | None = None) -> QMessageBox: ...
    def setWindowTitle(self, title: str) -> None: ...
