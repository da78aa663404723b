"""Joins the local server to its settings panel, the status bar and the app's settings."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from PySide6.QtCore import QObject, QTimer
from PySide6.QtWidgets import QWidget

from pagoda.app.components.server.local_server import DEFAULT_PORT, LocalServer
from pagoda.app.components.shared.async_store import AsyncStore
from pagoda.app.qt.server.api_key_dialog import show_new_api_key
from pagoda.app.qt.server.server_settings import MAX_PORT, MIN_PORT, LocalServerPanel
from pagoda.app.qt.status_bar import EngineStatusBar

# App settings in the database; the API key is not one of them (see pagoda/app/components/server/api_key.py).
SERVER_ENABLED_SETTING = "local_server_enabled"
SERVER_PORT_SETTING = "local_server_port"
POLL_MS = 500

Spawn = Callable[[Coroutine[Any, Any, Any]], Any]


class LocalServerController(QObject):
    """Applies the panel's edits to the server and remembers on/off and the port; while the
    server runs, refreshes the status bar's count of API requests."""

    def __init__(self, server: LocalServer, panel: LocalServerPanel, status: EngineStatusBar,
                 db: AsyncStore, spawn: Spawn, window: QWidget) -> None:
        super().__init__(window)
        self.server = server
        self.panel = panel
        self.status = status
        self.db = db
        self._window = window
        self._timer = QTimer(self, interval=POLL_MS, timeout=self.refresh)
        panel.enabled_toggled.connect(lambda on: spawn(self.set_enabled(on)))
        panel.port_chosen.connect(lambda port: spawn(self.set_port(port)))
        panel.generate_key_requested.connect(lambda: spawn(self.generate_key()))
        panel.remove_key_requested.connect(lambda: spawn(self.remove_key()))
        self.refresh()

    async def restore(self) -> None:
        """At start: the port chosen last time, and serving if it was on."""
        port = await self.db.get_setting(SERVER_PORT_SETTING, DEFAULT_PORT)
        self.server.port = port if isinstance(port, int) and MIN_PORT <= port <= MAX_PORT \
            else DEFAULT_PORT
        if await self.db.get_setting(SERVER_ENABLED_SETTING, False):
            await self.server.turn_on()
        self.refresh()

    async def set_enabled(self, on: bool) -> None:
        if on:
            await self.server.turn_on()
        else:
            await self.server.turn_off()
        self.refresh()
        await self.db.set_setting(SERVER_ENABLED_SETTING, self.server.is_running)

    async def set_port(self, port: int) -> None:
        await self.server.move_to(port)
        self.refresh()
        await self.db.set_setting(SERVER_PORT_SETTING, port)

    async def generate_key(self) -> None:
        key = await self.server.new_key()
        self.refresh()
        show_new_api_key(self._window, key)

    async def remove_key(self) -> None:
        await self.server.remove_key()
        self.refresh()

    def refresh(self) -> None:
        view = self.server.view()
        self.panel.show_server(view)
        self.status.show_server(view)
        if view.address is None:
            self._timer.stop()
        elif not self._timer.isActive():
            self._timer.start()

    def shutdown(self) -> None:
        self._timer.stop()
        self.server.shutdown()
