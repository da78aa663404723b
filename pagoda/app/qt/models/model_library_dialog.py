"""The "Get models" dialog: a view of pagoda.app.components.models.model_library's ModelLibrary. It renders the search
results, the chosen repository's files and the downloads, and forwards what the user does."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import (
    QDialog,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QProgressBar,
    QPushButton,
    QScrollArea,
    QTabWidget,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from pagoda.app.components.models.local_models import LocalModels
from pagoda.app.components.models.model_library import (
    DONE,
    DOWNLOADING,
    Download,
    FileChoice,
    ModelLibrary,
    format_size,
)
from pagoda.app.qt.models.local_models_panel import LocalModelsPanel

_PROGRESS_STEPS = 1000  # a bar's range; byte counts overflow a QProgressBar's int
_FIT_COLORS = {"tight": "#b9770e", "too_big": "#c0392b"}
_FILE_COLUMNS = ["File", "Quantization", "Size", "Parameters", "Memory", ""]
_MEMORY_COLUMN = _FILE_COLUMNS.index("Memory")
_NOTE_COLUMN = len(_FILE_COLUMNS) - 1  # "recommended", or why it does not run


def _show_unsupported(item: QTreeWidgetItem, reason: str) -> None:
    """Greyed, not selectable (so never downloaded), the reason in place of its fit."""
    item.setText(_MEMORY_COLUMN, "")
    item.setText(_NOTE_COLUMN, f"does not run: {reason}")
    for column in range(item.columnCount()):
        item.setToolTip(column, f"Pagoda does not run this file: {reason}")
    item.setDisabled(True)


class DownloadRow(QWidget):
    """One download: its name, a progress bar with bytes, speed and time left, Cancel, and Load
    once it is done."""

    def __init__(self, download: Download, library: ModelLibrary,
                 on_load: Callable[[Path], None], parent: QWidget) -> None:
        super().__init__(parent, objectName="downloadRow")
        self.download = download
        self.name = QLabel(f"{download.repo_id} · {download.label}", self)
        self.bar = QProgressBar(self, objectName="downloadProgress", maximum=_PROGRESS_STEPS,
                                textVisible=False)
        self.detail = QLabel(self, objectName="downloadDetail", wordWrap=True)
        self.cancel_button = QPushButton("Cancel", self, objectName="cancelDownloadButton")
        self.load_button = QPushButton("Load", self, objectName="loadDownloadButton")
        self.cancel_button.clicked.connect(lambda: library.cancel(self.download))
        self.load_button.clicked.connect(lambda: on_load(self.download.path))
        top = QHBoxLayout()
        top.addWidget(self.name, 1)
        top.addWidget(self.cancel_button)
        top.addWidget(self.load_button)
        layout = QVBoxLayout(self)
        layout.addLayout(top)
        layout.addWidget(self.bar)
        layout.addWidget(self.detail)
        self.render()

    def render(self) -> None:
        download = self.download
        if download.total:
            self.bar.setValue(int(_PROGRESS_STEPS * download.done / download.total))
        self.bar.setVisible(download.state in (DOWNLOADING, DONE))
        self.detail.setText(download.progress_text)
        self.cancel_button.setVisible(download.is_active)
        self.load_button.setVisible(download.state == DONE)


class ModelLibraryDialog(QDialog):
    """Non-modal; closing it does not stop the downloads, which the window's library keeps."""

    def __init__(self, library: ModelLibrary, on_load: Callable[[Path], None],
                 parent: QWidget | None = None, local_models: LocalModels | None = None) -> None:
        """local_models: the models folder, shown in an "On this computer" tab."""
        super().__init__(parent, objectName="modelLibraryDialog")
        self.setWindowTitle("Models")
        self.resize(760, 640)
        self.library = library
        self._on_load = on_load
        self._repo_id: str | None = None
        self._rows: dict[int, DownloadRow] = {}
        self.query = QLineEdit(self, objectName="hubSearch",
                               placeholderText="Search models, e.g. Qwen2.5 GGUF")
        self.search_button = QPushButton("Search", self, objectName="hubSearchButton")
        self.results = QListWidget(self, objectName="hubResults", wordWrap=True)
        # Rows wrap at the list's width (a recommendation's note was cut at "quick on a…"),
        # laid out again as the dialog is resized.
        self.results.setResizeMode(QListWidget.ResizeMode.Adjust)
        self.files = QTreeWidget(self, objectName="hubFiles")
        self.files.setHeaderLabels(_FILE_COLUMNS)
        self.files.setRootIsDecorated(False)
        self.download_button = QPushButton("Download", self, objectName="downloadButton",
                                           enabled=False)
        self.status_line = QLabel(self, objectName="hubStatus", wordWrap=True)
        # Indeterminate while the Hub is asked: a search can take ~20 s to fail offline.
        self.busy_bar = QProgressBar(self, objectName="hubBusy", minimum=0, maximum=0,
                                     textVisible=False, visible=False)
        self.token = QLineEdit(self, objectName="hubToken", echoMode=QLineEdit.EchoMode.Password)
        self.save_token_button = QPushButton("Save token", self, objectName="saveTokenButton")
        self.forget_token_button = QPushButton("Forget token", self,
                                               objectName="forgetTokenButton")
        self.token_status = QLabel(self, objectName="tokenStatus", wordWrap=True)
        self.tabs = QTabWidget(self, objectName="libraryTabs", documentMode=True)
        self._downloads = QWidget(self)
        self._downloads_layout = QVBoxLayout(self._downloads)
        self._downloads_layout.addStretch(1)
        self._build()
        self.local_panel = None
        if local_models is not None:
            self.local_panel = LocalModelsPanel(local_models, on_load, self.tabs)
            self.tabs.addTab(self.local_panel, "On this computer")
        self._connect()
        self._render_token()
        self.show_recommended()
        library.attach(self)

    def _build(self) -> None:
        search = QHBoxLayout()
        search.addWidget(self.query, 1)
        search.addWidget(self.search_button)
        lists = QHBoxLayout()
        lists.addWidget(self.results, 2)
        lists.addWidget(self.files, 3)
        token = QHBoxLayout()
        token.addWidget(self.token, 1)
        token.addWidget(self.save_token_button)
        token.addWidget(self.forget_token_button)
        hub = QWidget(self.tabs)
        hub_layout = QVBoxLayout(hub)
        hub_layout.addLayout(search)
        hub_layout.addWidget(self.status_line)
        hub_layout.addWidget(self.busy_bar)
        hub_layout.addLayout(lists, 1)
        hub_layout.addWidget(self.download_button, 0, Qt.AlignmentFlag.AlignRight)
        hub_layout.addLayout(token)
        hub_layout.addWidget(self.token_status)
        self.tabs.addTab(hub, "Hugging Face Hub")
        scroll = QScrollArea(self, widgetResizable=True)
        scroll.setWidget(self._downloads)
        layout = QVBoxLayout(self)
        layout.addWidget(self.tabs, 3)
        layout.addWidget(QLabel("Downloads", self))
        layout.addWidget(scroll, 1)

    def _connect(self) -> None:
        self.query.returnPressed.connect(self._search)
        self.search_button.clicked.connect(self._search)
        self.results.currentItemChanged.connect(self._repo_chosen)
        self.files.currentItemChanged.connect(
            lambda item, _old: self.download_button.setEnabled(item is not None
                                                                and not item.isDisabled()))
        self.download_button.clicked.connect(self._download_chosen)
        self.token.returnPressed.connect(self._save_token)
        self.save_token_button.clicked.connect(self._save_token)
        self.forget_token_button.clicked.connect(self._forget_token)
        self.finished.connect(lambda _result: self.library.detach(self))

    # -- input ---------------------------------------------------------------------------------

    def _search(self) -> None:
        if self.query.text().strip():
            self.library.search(self.query.text())

    def _repo_chosen(self, item: QListWidgetItem | None, _old) -> None:
        self.files.clear()
        self.download_button.setEnabled(False)
        if item is not None:
            self._repo_id = item.data(Qt.ItemDataRole.UserRole)
            self.library.choose_repo(self._repo_id)

    def _save_token(self) -> None:
        try:
            said = self.library.save_token(self.token.text())
        except ValueError as error:
            self.token_status.setText(str(error))
            return
        self.token.clear()
        self._render_token(said)

    def _forget_token(self) -> None:
        self.library.forget_token()
        self._render_token("The token is forgotten.")

    def _render_token(self, said: str = "") -> None:
        saved = self.library.has_token
        self.token.setPlaceholderText(
            "A token is saved: paste another to replace it" if saved else
            "Hugging Face token, for gated models (kept in the system keyring)")
        self.forget_token_button.setVisible(saved)
        self.token_status.setText(said)
        self.token_status.setVisible(bool(said))

    def _download_chosen(self) -> None:
        item = self.files.currentItem()
        if item is not None and self._repo_id is not None:
            self.library.download(self._repo_id, item.data(0, Qt.ItemDataRole.UserRole))

    # -- LibraryView ---------------------------------------------------------------------------

    def show_busy(self, text: str) -> None:
        """A search or file listing under way, until its answer (or its error) is shown."""
        self._set_status(text, error=False)
        self.busy_bar.setVisible(True)

    def show_status(self, text: str, error: bool = False) -> None:
        self._set_status(text, error)
        self.busy_bar.setVisible(False)

    def is_busy(self) -> bool:
        return not self.busy_bar.isHidden()

    def _set_status(self, text: str, error: bool) -> None:
        self.status_line.setText(text)
        self.status_line.setProperty("error", error)
        self.status_line.setStyleSheet("color: #c0392b;" if error else "")

    def show_recommended(self) -> None:
        """Before any search: a small, a medium and a large chat model to start from."""
        self.results.clear()
        for choice in self.library.recommended():
            item = QListWidgetItem(f"{choice.size}: {choice.name}\n{choice.repo_id} · "
                                   f"{choice.note}", self.results)
            item.setData(Qt.ItemDataRole.UserRole, choice.repo_id)
        self.status_line.setText("Recommended to start with, or search for any model.")

    def show_results(self, models) -> None:
        self.results.clear()
        self.files.clear()
        for model in models:
            formats = " + ".join(name for name, has in (("GGUF", model.has_gguf),
                                                        ("safetensors", model.has_safetensors))
                                 if has)
            text = f"{model.repo_id}\n{formats} · {model.architecture or '?'} · " \
                   f"{model.downloads:,} downloads" + (" · gated" if model.gated else "")
            if model.unsupported:
                text += f"\nDoes not run in Pagoda: {model.unsupported}"
            item = QListWidgetItem(text, self.results)
            item.setData(Qt.ItemDataRole.UserRole, model.repo_id)
            if model.unsupported:  # still listed: its files say what exists
                item.setForeground(self.palette().color(QPalette.ColorGroup.Disabled,
                                                        QPalette.ColorRole.Text))
                item.setToolTip(f"Pagoda does not run {model.repo_id}: {model.unsupported}")

    def show_files(self, repo_id: str, files: list[FileChoice]) -> None:
        if repo_id != self._repo_id:
            return
        self.files.clear()
        for choice in files:
            item = QTreeWidgetItem(self.files, [choice.label, choice.quantization or "",
                                                format_size(choice.size), choice.parameters,
                                                choice.fit,
                                                "recommended" if choice.recommended else ""])
            item.setData(0, Qt.ItemDataRole.UserRole, choice.filename)
            item.setToolTip(_MEMORY_COLUMN, choice.fit_detail)
            if choice.fit_verdict in _FIT_COLORS:
                item.setForeground(_MEMORY_COLUMN, QColor(_FIT_COLORS[choice.fit_verdict]))
            if not choice.can_download:
                _show_unsupported(item, choice.unsupported)
            elif choice.recommended:
                self.files.setCurrentItem(item)
        for column in range(self.files.columnCount()):
            self.files.resizeColumnToContents(column)
        if not files:
            self.show_status(f"{repo_id} has no GGUF file and no safetensors model folder "
                             "Pagoda can load (GGUF files split in parts are not loaded yet): "
                             "choose another repository.")
        elif not any(choice.can_download for choice in files):
            self.show_status(f"Pagoda does not run the files of {repo_id} yet: each says why.")

    def show_download(self, download: Download) -> None:
        row = self._rows.get(download.id)
        if row is None:
            row = DownloadRow(download, self.library, self._on_load, self._downloads)
            self._rows[download.id] = row
            self._downloads_layout.insertWidget(self._downloads_layout.count() - 1, row)
        row.render()
