"""The prefix cache kept on disk, as the settings show it: its size (kept as the app setting
`disk_cache_bytes`, applied when a model next loads), what it holds now, and "Clear the cache"."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from PySide6.QtCore import QTimer

from pagoda.app.components.shared.async_store import AsyncStore
from pagoda.app.qt.models.engine_host import EngineHost
from pagoda.app.qt.models.model_settings import ModelSettingsPanel

DISK_CACHE_SETTING = "disk_cache_bytes"
# The engine writes blocks as replies end, on its own thread: while the settings are shown,
# what is on disk is read again this often (off the GUI thread, one walk at a time).
USAGE_REFRESH_MS = 3000


class DiskCacheSettings:
    """Wires the panel's disk cache row to the host and the store; `say(text)` tells the user
    what happened (the status bar). While the panel is shown, its size on disk follows what the
    engine writes."""

    def __init__(self, panel: ModelSettingsPanel, host: EngineHost, db: AsyncStore,
                 spawn: Callable[[Coroutine[Any, Any, Any]], Any],
                 say: Callable[[str], None]) -> None:
        self.panel, self.host, self.db = panel, host, db
        self._spawn, self._say = spawn, say
        if host.disk_cache_dir is not None:
            panel.show_disk_cache_folder(str(host.disk_cache_dir))
        panel.set_disk_cache_bytes(host.disk_cache_bytes)
        panel.disk_cache_bytes_changed.connect(self.set_capacity)
        panel.clear_disk_cache_requested.connect(lambda: self._spawn(self.clear()))
        self._counting = False
        self._timer = QTimer(panel, interval=USAGE_REFRESH_MS, timeout=self._refresh_if_shown)
        self._timer.start()

    async def restore(self) -> None:
        """Before the first load: the size the user chose last time, and what is on disk."""
        stored = await self.db.get_setting(DISK_CACHE_SETTING, self.host.disk_cache_bytes)
        if isinstance(stored, int) and not isinstance(stored, bool) and stored >= 0:
            self.host.disk_cache_bytes = stored
        self.panel.set_disk_cache_bytes(self.host.disk_cache_bytes)
        await self.refresh_usage()

    def set_capacity(self, num_bytes: int) -> None:
        if num_bytes == self.host.disk_cache_bytes:
            return
        self.host.disk_cache_bytes = num_bytes
        self._spawn(self.db.set_setting(DISK_CACHE_SETTING, num_bytes))
        what = "off" if num_bytes == 0 else "resized"
        self._say(f"The disk cache is {what} when a model next loads: pick the model again to "
                  "reload it.")

    async def clear(self) -> None:
        left = await self.host.clear_disk_cache()
        self.panel.show_disk_cache_usage(left)
        self._say("The disk cache is cleared." if left == 0 else
                  "Some of the disk cache could not be removed: see the log.")

    async def refresh_usage(self) -> None:
        self._counting = True
        try:
            self.panel.show_disk_cache_usage(await self.host.disk_cache_usage())
        finally:
            self._counting = False

    def stop(self) -> None:
        """No more reads of the folder (the window closes, the host's threads stop)."""
        self._timer.stop()

    def _refresh_if_shown(self) -> None:
        if self.panel.isVisible() and not self._counting:
            self._spawn(self.refresh_usage())
