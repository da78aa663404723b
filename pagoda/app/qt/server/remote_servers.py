"""Saved servers in the window: a chat answering from one (or from this computer again), adding
and removing one, and the status bar's figures for the current chat's server."""

from __future__ import annotations

from PySide6.QtCore import QObject, Qt, QTimer
from PySide6.QtWidgets import QMessageBox

from pagoda.app.components.chat.chat_sources import RemoteSource
from pagoda.app.components.shared.connections import AddServerFlow, ServerConnection
from pagoda.app.qt.server.add_server import open_add_server_dialog
from pagoda.app.qt.server.add_server_dialog import AddServerDialog
from pagoda.app.qt.shared.window_frame import WindowFrame

REMOTE_STATS_INTERVAL_MS = 500


class RemoteServers(QObject):
    """Where the current chat's replies come from, as the user chooses it in the picker."""

    def __init__(self, window: WindowFrame) -> None:
        super().__init__(window)
        self.window = window
        self.sources = window.sources
        self._stats_timer = QTimer(self, interval=REMOTE_STATS_INTERVAL_MS,
                                   timeout=self._show_remote_stats)

    def use_source_in_current_chat(self, source_id: str) -> None:
        """Answer the current chat from the engine here (LOCAL) or a saved server."""
        w = self.window
        controller = w.chat_tabs.current_controller()
        if controller is None:
            return
        source = self.sources.source(source_id)
        if source is controller.session.source or not controller.session.use_source(source):
            return
        w.chat_tabs.show_source(controller)
        w.models_controller.render_picker()
        self.show_backend_status()
        w.chat_tabs.show_thinking_switch()
        w.spawn(self.sources.choose(controller.conversation_id, source_id))

    def open_add_server_dialog(self) -> AddServerDialog:
        """Non-blocking: the server's address, its key, and one of its models."""
        return open_add_server_dialog(self.window, AddServerFlow(self.sources.saved),
                                      self._server_added)

    def confirm_remove_server(self) -> QMessageBox | None:
        """Asks first (non-blocking); removing forgets the server, its key and which chats used
        it (they answer from this computer again). The chats themselves are kept."""
        controller = self.window.chat_tabs.current_controller()
        source = controller.session.source if controller is not None else None
        if not isinstance(source, RemoteSource):
            return None
        box = QMessageBox(QMessageBox.Icon.Question, "Remove the server",
                          f"Remove {source.connection.label}? Its API key is forgotten and the "
                          "chats that used it answer from this computer again. No chat is "
                          "deleted.", QMessageBox.StandardButton.Yes
                          | QMessageBox.StandardButton.Cancel, self.window)
        box.setObjectName("removeServerDialog")
        box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        box.finished.connect(lambda answer, cid=source.connection.id: (
            answer == QMessageBox.StandardButton.Yes
            and self.window.spawn(self.remove_server(cid))))
        box.open()
        return box

    async def remove_server(self, source_id: str) -> None:
        w = self.window
        using = [c for c in w.chat_tabs.controllers.values()
                 if self.sources.id_of(c.session.source) == source_id]
        if any(c.is_streaming for c in using):
            w.message_box(QMessageBox.Icon.Information, "Pagoda",
                          "A reply from that server is still being written: stop it or let "
                          "it finish, then remove the server.")
            return
        for controller in using:
            controller.session.use_source(w.host)
            w.chat_tabs.show_source(controller)
        await self.sources.remove(source_id)
        w.models_controller.refresh_picker()
        self.show_backend_status()

    def _server_added(self, connection: ServerConnection) -> None:
        self.sources.forget(connection.id)  # a server added again may have a new key
        self.use_source_in_current_chat(connection.id)
        self.window.models_controller.refresh_picker()
        self.window.status.showMessage(
            f"Added {connection.label}: this chat now answers from it.", 5000)

    def show_backend_status(self) -> None:
        """The engine's figures for a local chat; what we measure of the server for a remote one."""
        w = self.window
        controller = w.chat_tabs.current_controller()
        if controller is None or w.chat_tabs.is_local(controller):
            self._stats_timer.stop()
            w.status.show_status(w.host.status)
        else:
            self._show_remote_stats()
            self._stats_timer.start()

    def _show_remote_stats(self) -> None:
        controller = self.window.chat_tabs.current_controller()
        source = controller.session.source if controller is not None else None
        if not isinstance(source, RemoteSource) or source.backend is None:
            self._stats_timer.stop()
            return
        self.window.status.show_remote(source.connection.label, source.backend.stats())

    def close(self) -> None:
        self._stats_timer.stop()
        self.sources.shutdown()  # remote replies end; their partial text is already kept
