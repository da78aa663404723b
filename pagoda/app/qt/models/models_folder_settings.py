"""The models folder, as the settings show it: where "Get models" downloads to and what "On this
computer" lists. A folder the user chose ("Change…") is kept as the app setting `models_folder`
and wins; without one it is default_models_dir(): $PAGODA_MODELS_DIR when set, else `models` in
the user data folder. So the variable changes the default only, never a choice made in the app."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from pagoda.app.backends.services.model_files import default_models_dir
from pagoda.app.components.models.local_models import LocalModels
from pagoda.app.components.models.model_library import ModelLibrary
from pagoda.app.components.shared.async_store import AsyncStore
from pagoda.app.qt.models.model_settings import ModelSettingsPanel

MODELS_FOLDER_SETTING = "models_folder"


class ModelsFolderSettings:
    """Wires the panel's models folder row to the store, the Hub library's downloads and the
    local library; `say(text)` tells the user what happened (the status bar)."""

    def __init__(self, panel: ModelSettingsPanel, downloads: ModelLibrary, local: LocalModels,
                 db: AsyncStore, spawn: Callable[[Coroutine[Any, Any, Any]], Any],
                 say: Callable[[str], None]) -> None:
        self.panel, self.downloads, self.local, self.db = panel, downloads, local, db
        self._spawn, self._say = spawn, say
        panel.show_models_folder(str(local.folder))
        panel.models_folder_chosen.connect(self.choose)

    @property
    def folder(self) -> Path:
        return self.local.folder

    async def restore(self) -> None:
        """At start: the folder chosen last time, else the default. What it holds is listed in
        the background: the first load does not wait for a walk of a big folder."""
        stored = await self.db.get_setting(MODELS_FOLDER_SETTING, None)
        chosen = Path(stored).expanduser() if isinstance(stored, str) and stored.strip() \
            else default_models_dir()
        self._use(chosen)

    def choose(self, folder: str) -> None:
        if not folder or Path(folder) == self.folder:
            return
        self._use(Path(folder))
        self._spawn(self.db.set_setting(MODELS_FOLDER_SETTING, folder))
        self._say(f"Models now download to {folder}; the models in the old folder stay there.")

    def _use(self, folder: Path) -> asyncio.Task:
        """At once for the next download; the task lists the folder."""
        self.downloads.dest_dir = folder
        self.panel.show_models_folder(str(folder))
        return self.local.set_folder(folder)
