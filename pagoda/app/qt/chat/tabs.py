"""The tabs render OpenChats: a ChatTab and its ChatController per open chat, the current one's
title, settings and source shown around it, and whether each tab's chat can send now."""

from __future__ import annotations

import asyncio

from PySide6.QtCore import QObject
from PySide6.QtGui import QIcon

from pagoda.app.components.chat.chat_session import ChatSession
from pagoda.app.qt.chat.chat_tab import ChatTab
from pagoda.app.qt.chat.controller import ChatController
from pagoda.app.qt.shared.theme import icon
from pagoda.app.qt.shared.window_frame import WindowFrame
from pagoda.app.qt.status_bar import loading_text


class ChatTabs(QObject):
    """`controllers` by conversation id, one per open tab of the window's QTabWidget."""

    def __init__(self, window: WindowFrame) -> None:
        super().__init__(window)
        self.window = window
        self.tabs = window.tabs
        self.controllers: dict[int, ChatController] = {}
        chats = window.chats
        self.tabs.tabCloseRequested.connect(self.close_tab)
        self.tabs.currentChanged.connect(self._tab_changed)
        self.tabs.tabBar().tabMoved.connect(
            lambda *_: chats.move([t.conversation_id for t in self.open_tabs()]))
        chats.on_opened = self._add_tab
        chats.on_closed = self._remove_tab
        chats.on_current = self._show_tab

    async def new_chat(self) -> None:
        """A new chat answers from where the current one does."""
        await self.window.chats.new_chat()
        await self.window.chat_list.refresh()

    async def open_conversation(self, cid: int) -> ChatTab:
        await self.window.chats.open(cid)
        return self.controllers[cid].view

    async def show_message(self, cid: int, message_id: int = 0) -> None:
        """Open a conversation; for a search hit, on the branch that holds the message."""
        await self.open_conversation(cid)
        controller = self.controllers[cid]
        if message_id and message_id not in {m.id for m in controller.path}:
            await controller.show_branch_of(message_id)

    def close_tab(self, index: int) -> asyncio.Task | None:
        tab = self.tabs.widget(index)
        return self.window.chats.close(tab.conversation_id) if isinstance(tab, ChatTab) else None

    def open_tabs(self) -> list[ChatTab]:
        return [self.tabs.widget(i) for i in range(self.tabs.count())]

    def current_controller(self) -> ChatController | None:
        current = self.window.chats.current
        return self.controllers.get(current) if current is not None else None

    def shown_conversation(self) -> int | None:
        tab = self.tabs.currentWidget()
        return tab.conversation_id if isinstance(tab, ChatTab) else None

    def stop_current_reply(self) -> bool:
        """Stop the current chat's reply; False when none is being written."""
        controller = self.current_controller()
        if controller is None or not controller.is_streaming:
            return False
        controller.stop()
        return True

    def cycle(self, step: int) -> None:
        if self.tabs.count():
            self.tabs.setCurrentIndex((self.tabs.currentIndex() + step) % self.tabs.count())

    def is_local(self, controller: ChatController) -> bool:
        return controller.session.source is self.window.host

    def _add_tab(self, session: ChatSession) -> None:
        cid = session.conversation_id
        tab = ChatTab(cid)
        controller = ChatController(session, tab, parent=self.window)
        self.controllers[cid] = controller
        self.show_source(controller)
        tab.title_changed.connect(lambda title, t=tab: self._retitle(t, title))
        controller.conversation_changed.connect(
            lambda _cid: self.window.spawn(self.window.chat_list.refresh()))
        controller.streaming_changed.connect(
            lambda writing, t=tab: self._show_writing(t, writing))
        self.tabs.addTab(tab, "New chat")

    def _show_writing(self, tab: ChatTab, writing: bool) -> None:
        """A chat writing a reply says so on its tab and its row in the list, whichever chat is
        shown."""
        index = self.tabs.indexOf(tab)
        if index >= 0:
            self.tabs.setTabIcon(index, icon("writing") if writing else QIcon())
        self.window.sidebar.show_writing(tab.conversation_id, writing)

    def redraw_writing(self) -> None:
        """The writing icons are drawn in the palette's colors: a theme change redraws them."""
        for controller in self.controllers.values():
            if controller.is_streaming:
                self._show_writing(controller.view, True)

    def _remove_tab(self, cid: int) -> None:
        controller = self.controllers.pop(cid)
        self.window.sidebar.show_writing(cid, False)
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

    def show_source(self, controller: ChatController) -> None:
        """The tab's label and whether it can send, as its source says now (asked again each
        time the engine's availability changes: a local chat waits for the model to load)."""
        tab, source = controller.view, controller.session.source
        tab.show_source(self.window.sources.describe(source))
        tab.composer.set_send_blocked(controller.session.unable_to_send())
        self.show_model_loading(controller)

    def show_model_loading(self, controller: ChatController) -> None:
        """A local chat says, above its message box, how the model's load goes while it does;
        its source reads "loading", not "no model loaded", until the first model is in."""
        host = self.window.host
        status = host.status
        loading = self.is_local(controller) and host.is_loading
        controller.view.show_model_loading(loading_text(status) if loading else None,
                                           status.load)
        if loading and not host.is_ready:
            controller.view.show_source(f"{status.model or 'the model'} · loading")

    def show_local_sources(self) -> None:
        for controller in self.controllers.values():
            if self.is_local(controller):
                self.show_source(controller)

    def ready_tabs(self) -> None:
        """A load ended: the local tabs can send (or say why not) and count their chat again."""
        for controller in self.controllers.values():
            if self.is_local(controller):
                self.show_source(controller)
                self.window.spawn(controller.refresh_context_meter())

    def _retitle(self, tab: ChatTab, title: str) -> None:
        index = self.tabs.indexOf(tab)
        if index >= 0:
            self.tabs.setTabText(index, _elide(title))
            self.tabs.setTabToolTip(index, title)
        if tab is self.tabs.currentWidget():
            self._show_chat_title(title)

    def _show_chat_title(self, title: str) -> None:
        """The window and the settings panel name the current chat."""
        self.window.setWindowTitle(f"{title} · Pagoda")
        self.window.settings_panel.set_target(title)

    def _tab_changed(self, _index: int) -> None:
        tab = self.tabs.currentWidget()
        w = self.window
        if isinstance(tab, ChatTab) and not w.closing:
            w.chats.select(tab.conversation_id)
            w.settings_panel.set_settings(tab.settings)
            self._show_chat_title(tab.title)
            w.sidebar.select_conversation(tab.conversation_id)
            w.models_controller.render_picker()
            w.remote_servers.show_backend_status()
            self.show_thinking_switch()

    def show_thinking_switch(self) -> None:
        """The chat settings' Thinking choice applies where the current chat's model has one."""
        controller = self.current_controller()
        backend = controller.session.source.backend if controller is not None else None
        self.window.settings_panel.set_thinking_switch(
            backend is not None and backend.thinking_switch)

    def edit_current_settings(self, settings) -> None:
        """The settings panel's edit goes to the current chat."""
        tab = self.tabs.currentWidget()
        if isinstance(tab, ChatTab):
            tab.settings = settings
            tab.settings_changed.emit(settings)


def _elide(title: str, limit: int = 28) -> str:
    return title if len(title) <= limit else title[: limit - 1] + "…"
