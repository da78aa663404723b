"""The model picker's controller: its entries (the models here, the saved servers, the actions),
what a pick does, loading a model (from the picker, a file, the Models dialog) and what a load
changes in the window, and the quantization and folder settings restored before the first load."""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path

from PySide6.QtCore import QObject
from PySide6.QtWidgets import QFileDialog, QMessageBox

from pagoda.app.backends.services.model_files import bundled_model_file
from pagoda.app.components.chat.chat_sources import LOCAL
from pagoda.app.components.models.local_models import LocalListing, LocalModels
from pagoda.app.components.models.model_choices import (
    MODEL_FILE_FILTER,
    ModelChoice,
    ModelChoices,
    ModelLoadError,
    model_source_from_selection,
)
from pagoda.app.components.models.model_library import DONE, Download, ModelLibrary, NullLibraryView
from pagoda.app.components.models.opened_models import OpenedModels
from pagoda.app.qt.models.disk_cache_settings import DiskCacheSettings
from pagoda.app.qt.models.engine_host import EngineHost
from pagoda.app.qt.models.model_library_dialog import ModelLibraryDialog
from pagoda.app.qt.models.model_picker import ModelPicker
from pagoda.app.qt.models.model_settings import ModelSettingsPanel
from pagoda.app.qt.models.models_folder_settings import ModelsFolderSettings
from pagoda.app.qt.shared.window_frame import WindowFrame
from pagoda.app.qt.status_bar import picker_loading_mark

# Item data of the picker's last entry; a model's entry holds its path ("" for the default).
OPEN_MODEL_ITEM = "open-model-file"
GET_MODELS_ITEM = "get-models"
ADD_SERVER_ITEM = "add-server"
REMOVE_SERVER_ITEM = "remove-server"
SERVER_ITEM_PREFIX = "server:"  # + a saved connection's id
LAST_MODEL_SETTING = "last_model"
QUANTIZATION_SETTING = "quantization"


class ModelsController(QObject):
    """Joins the window's model picker and model settings to the engine host, the models
    folder (`local_models`) and the Hub (`model_library`)."""

    def __init__(self, window: WindowFrame, host: EngineHost, picker: ModelPicker,
                 settings: ModelSettingsPanel) -> None:
        super().__init__(window)
        self.window = window
        self.host = host
        self.picker = picker
        self.model_settings = settings
        self.choices = ModelChoices(host.engine_config)
        self.library = ModelLibrary(keys=window.sources.saved.keys,
                                    quantization=lambda: host.quantization)
        self.library.attach(_DownloadsInPicker(self))
        self.local_models = LocalModels(loaded_model=lambda: host.model_path,
                                        downloading=self.library.active_folders,
                                        bundled=bundled_model_file,
                                        opened=OpenedModels.default())
        self.local_models.attach(_LocalModelsInPicker(self))
        self._library_dialog: ModelLibraryDialog | None = None
        self._describing: asyncio.Task | None = None
        self._picker_choices: list[ModelChoice] = []
        self.render_picker([self.choices.known(None, host.quantization)])

    def connect(self) -> None:
        w, settings = self.window, self.model_settings
        self.picker.activated.connect(self.picked)
        settings.quantization_changed.connect(self.set_quantization)
        self.disk_cache = DiskCacheSettings(settings, self.host, w.db, w.spawn, self._say)
        self.models_folder = ModelsFolderSettings(settings, self.library, self.local_models,
                                                  w.db, w.spawn, self._say)
        self.host.model_loaded.connect(self._model_loaded)
        self.host.load_failed.connect(self._model_failed)

    def _say(self, text: str) -> None:
        self.window.status.showMessage(text, 10_000)

    def picked(self, index: int) -> None:
        data = self.picker.itemData(index) or ""
        servers = self.window.remote_servers
        if data == OPEN_MODEL_ITEM:
            self.open_model_dialog()
        elif data == GET_MODELS_ITEM:
            self.open_model_library()
        elif data == ADD_SERVER_ITEM:
            servers.open_add_server_dialog()
        elif data == REMOVE_SERVER_ITEM:
            servers.confirm_remove_server()
        elif data.startswith(SERVER_ITEM_PREFIX):
            servers.use_source_in_current_chat(data.removeprefix(SERVER_ITEM_PREFIX))
        else:
            servers.use_source_in_current_chat(LOCAL)
            if ((data or None) != self.host.model_path or not self.host.is_ready
                    or self._quantization_differs_from_running()):
                self.load_model(data or None)
        self.refresh_picker()  # until a new model loads, the picker shows the running one

    def _quantization_differs_from_running(self) -> bool:
        return self.host.quantization != self.host.loaded_quantization

    def open_model_dialog(self) -> QFileDialog:
        """Non-blocking: a .gguf file, or a model folder chosen by its config.json."""
        dialog = QFileDialog(self.window,
                             "Open a model: a .gguf file, or a model folder's config.json",
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
                self.library, lambda path: self.load_model(str(path)), self.window,
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
            self.window.message_box(QMessageBox.Icon.Warning, "Not a model", str(error),
                                    object_name="modelErrorDialog")
            return
        self.load_model(source)

    def refresh_picker(self) -> None:
        """Show the models as far as they are known, then describe them off the GUI thread."""
        sources, quantization = self._picker_sources(), self.host.quantization
        self.render_picker([self.choices.known(s, quantization) for s in sources])
        if self._describing is not None:
            self._describing.cancel()  # superseded: it would show an older list
        self._describing = self.window.spawn(self._describe_models(sources, quantization))

    def _picker_sources(self) -> list[str | None]:
        """The bundled model, the running one when it is another, the models folder's most
        recently used, and this run's downloads."""
        sources: list[str | None] = [None]
        loading = self.host.loading_model if self.host.is_loading else None
        for path in [self.host.model_path, loading, *map(str, self.local_models.recent()),
                     *map(str, self.library.finished_paths())]:
            if path is not None and path not in sources:
                sources.append(path)
        return sources

    async def _describe_models(self, sources: list[str | None], quantization: str) -> None:
        self.render_picker([await self.choices.describe(s, quantization) for s in sources])

    def render_picker(self, choices: list[ModelChoice] | None = None) -> None:
        """The local models (`choices`, or the last ones shown), the saved servers, and the
        actions; the entry of the current chat's source selected."""
        if choices is None:
            choices = self._picker_choices
        self._picker_choices = choices
        picker = self.picker
        picker.blockSignals(True)
        picker.clear()
        for choice in choices:
            picker.add_entry(choice.text, choice.source or "", choice.tooltip)
        for connection in self.window.sources.saved.list():
            picker.add_entry(f"{connection.label} · server", SERVER_ITEM_PREFIX + connection.id,
                             f"{connection.model} on the server at {connection.base_url}")
        picker.insertSeparator(picker.count())
        picker.add_entry("Open model file…", OPEN_MODEL_ITEM,
                         "A .gguf file, or a Hugging Face model folder")
        picker.add_entry("Get models…", GET_MODELS_ITEM,
                         "Search the Hugging Face Hub and download GGUF models")
        picker.add_entry("Add a server…", ADD_SERVER_ITEM,
                         "An OpenAI-compatible server: vLLM, SGLang, llama.cpp, Ollama, "
                         "or another Pagoda")
        if self._current_source_id() not in (None, LOCAL):
            picker.add_entry("Remove this chat's server…", REMOVE_SERVER_ITEM,
                             "Forget the server and its key; its chats are kept")
        picker.blockSignals(False)
        self.mark_loading()
        self._select_current()

    def _current_source_id(self) -> str | None:
        """Where the current chat's replies come from (LOCAL: here); None without a chat."""
        tabs = self.window.chat_tabs
        controller = tabs.current_controller()
        if controller is None:
            return None
        return LOCAL if tabs.is_local(controller) else \
            self.window.sources.id_of(controller.session.source)

    def mark_loading(self) -> None:
        """The entry of the model loading now says so, and how far it has got."""
        if self.host.is_loading:
            self.picker.mark_loading(self.host.loading_model or "",
                                     picker_loading_mark(self.host.status.load))
        else:
            self.picker.mark_loading(None)

    def _select_current(self) -> None:
        """The current chat's source: its server, or the model running here (the one loading
        while none runs)."""
        source_id = self._current_source_id()
        if source_id not in (None, LOCAL):
            data = SERVER_ITEM_PREFIX + source_id
        elif self.host.is_ready or not self.host.is_loading:
            data = self.host.model_path or ""
        else:
            data = self.host.loading_model or ""
        self.picker.setCurrentIndex(max(self.picker.findData(data), 0))

    async def restore_model_settings(self) -> None:
        """Before the first load: the quantization and the models folder the user chose last
        time."""
        quantization = self.host.known_quantization(
            await self.window.db.get_setting(QUANTIZATION_SETTING, "auto"))
        self.host.quantization = quantization
        self.model_settings.set_quantization(quantization)
        self.refresh_picker()
        await self.disk_cache.restore()
        await self.models_folder.restore()

    def set_quantization(self, quantization: str) -> None:
        """Kept for the next load; the picker shows each model's memory under it."""
        self.host.quantization = quantization
        self.window.spawn(self.window.db.set_setting(QUANTIZATION_SETTING, quantization))
        self.refresh_picker()
        if self.host.is_ready and self._quantization_differs_from_running():
            self.window.status.showMessage(f"Quantization {quantization} applies when a model "
                                           "next loads: pick the model again to reload it.",
                                           10_000)

    def load_model(self, path: str | None) -> None:
        if self.host.is_loading:
            self.window.message_box(QMessageBox.Icon.Information, "Pagoda",
                                    "A model is already loading: wait for it to finish.")
            return
        self.host.load(path)  # availability_changed: the local tabs stop sending meanwhile

    def _model_loaded(self, name: str) -> None:
        w = self.window
        settle_the_heap()
        w.settings_panel.set_max_tokens_limit(self.host.max_model_len)
        self.refresh_picker()
        w.spawn(w.db.set_setting(LAST_MODEL_SETTING, self.host.model_path))
        self.local_models.record_use(self.host.model_path)
        w.spawn(self.disk_cache.refresh_usage())
        w.chat_tabs.ready_tabs()
        w.chat_tabs.show_thinking_switch()

    def _model_failed(self, message: str) -> None:
        self.window.chat_tabs.ready_tabs()
        # Over the Models dialog while it is open: the model was picked there, and a box
        # behind it would go unseen.
        library = self._library_dialog
        self.window.message_box(QMessageBox.Icon.Critical, "Could not load the model", message,
                                object_name="modelErrorDialog",
                                parent=library if library is not None and library.isVisible()
                                else None)

    def close(self) -> None:
        if self._describing is not None:
            self._describing.cancel()
        self.choices.close()
        self.library.close()  # a running download keeps its partial file for next time
        self.local_models.close()


class _DownloadsInPicker(NullLibraryView):
    """A finished download joins the model picker."""

    def __init__(self, models: ModelsController) -> None:
        self._models = models

    def show_download(self, download: Download) -> None:
        if download.state == DONE:
            self._models.refresh_picker()
            self._models.local_models.refresh()


class _LocalModelsInPicker:
    """The models folder's most recently used models join the picker."""

    def __init__(self, models: ModelsController) -> None:
        self._models = models
        self._shown: list[Path] = []

    def show_listing(self, listing: LocalListing) -> None:
        recent = [m.path for m in listing.recent()]
        if recent != self._shown:
            self._shown = recent
            self._models.refresh_picker()

    def show_status(self, text: str, error: bool = False) -> None: ...


def settle_the_heap() -> None:
    """Collect once, then keep the objects alive now (torch's, the model's, the app's: about
    half a million once a model is loaded) out of every later collection. A full collection
    scans them all with the GIL held, which froze the window for 270-330 ms now and then while
    replies streamed (bench/gui_responsiveness.py); after a load the user waits anyway."""
    gc.collect()
    gc.freeze()
