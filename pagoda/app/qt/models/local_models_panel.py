"""The "On this computer" panel: a view of pagoda.app.components.models.local_models' LocalModels. It renders the models
folder, the bundled model and the models opened from elsewhere as a table (name, format,
quantization, size, last used) and forwards Load, Show in folder, Delete (asked first; only
what is in the models folder), Forget (a model opened from elsewhere; its file stays) and
Refresh."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import Qt, QUrl
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QMessageBox,
    QPushButton,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from pagoda.app.components.models.local_models import (
    BUNDLED,
    OUTSIDE,
    LocalListing,
    LocalModel,
    LocalModels,
    format_last_used,
)
from pagoda.app.components.models.model_library import format_size

COLUMNS = ["Name", "Format", "Quantization", "Size", "Last used"]


class LocalModelsPanel(QWidget):
    """`on_load(path)` loads a model (the window's load_model). Reads the folder again as it
    opens, so it shows what is on disk now; stops listening to the library when destroyed."""

    def __init__(self, library: LocalModels, on_load: Callable[[Path], None],
                 parent: QWidget | None = None) -> None:
        super().__init__(parent, objectName="localModelsPanel")
        self.library = library
        self._on_load = on_load
        self._entries: dict[str, LocalModel] = {}
        self.where = QLabel(self, objectName="localModelsFolder", wordWrap=True)
        self.where.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.table = QTreeWidget(self, objectName="localModelsTable")
        self.table.setHeaderLabels(COLUMNS)
        self.table.setRootIsDecorated(False)
        self.table.setUniformRowHeights(True)
        self.load_button = QPushButton("Load", self, objectName="loadLocalModel")
        self.show_button = QPushButton("Show in folder", self, objectName="showLocalModel")
        self.delete_button = QPushButton("Delete…", self, objectName="deleteLocalModel")
        self.forget_button = QPushButton("Forget", self, objectName="forgetLocalModel")
        self.forget_button.setToolTip("Take this model off the list and the model picker; "
                                      "its file stays where it is")
        self.refresh_button = QPushButton("Refresh", self, objectName="refreshLocalModels")
        self.status_line = QLabel(self, objectName="localModelsStatus", wordWrap=True)
        self._build()
        self._connect()
        library.attach(self)
        self.destroyed.connect(lambda _obj=None, view=self: library.detach(view))
        library.refresh()

    def _build(self) -> None:
        buttons = QHBoxLayout()
        for button in (self.load_button, self.show_button, self.delete_button,
                       self.forget_button):
            buttons.addWidget(button)
        buttons.addStretch(1)
        buttons.addWidget(self.refresh_button)
        layout = QVBoxLayout(self)
        layout.addWidget(self.where)
        layout.addWidget(self.table, 1)
        layout.addLayout(buttons)
        layout.addWidget(self.status_line)

    def _connect(self) -> None:
        self.table.currentItemChanged.connect(lambda _item, _old: self._enable_buttons())
        self.table.itemDoubleClicked.connect(lambda _item, _column: self.load_selected())
        self.load_button.clicked.connect(self.load_selected)
        self.show_button.clicked.connect(self.show_selected_in_folder)
        self.delete_button.clicked.connect(self.confirm_delete)
        self.forget_button.clicked.connect(self.forget_selected)
        self.refresh_button.clicked.connect(lambda: self.library.refresh())

    # -- input ---------------------------------------------------------------------------------

    def selected(self) -> LocalModel | None:
        item = self.table.currentItem()
        return self._entries.get(item.data(0, Qt.ItemDataRole.UserRole)) if item else None

    def select(self, path: Path) -> None:
        for index in range(self.table.topLevelItemCount()):
            item = self.table.topLevelItem(index)
            if item.data(0, Qt.ItemDataRole.UserRole) == str(path):
                self.table.setCurrentItem(item)
                return

    def load_selected(self) -> None:
        entry = self.selected()
        if entry is not None and not entry.is_partial:
            self._on_load(entry.path)

    def show_selected_in_folder(self) -> None:
        """A file in the folder that holds it, a model folder itself; with nothing selected,
        the models folder."""
        entry = self.selected()
        if entry is None:
            folder = self.library.folder
        else:
            folder = entry.path if entry.path.is_dir() else entry.path.parent
        QDesktopServices.openUrl(QUrl.fromLocalFile(str(folder)))

    def forget_selected(self) -> None:
        entry = self.selected()
        if entry is not None and entry.can_forget:
            self.library.forget(entry)

    def confirm_delete(self) -> QMessageBox | None:
        """Asks first (non-blocking); Yes deletes. Only what is in the models folder."""
        entry = self.selected()
        if entry is None or not entry.can_delete:
            return None
        what = "the unfinished download" if entry.is_partial else "the model"
        box = QMessageBox(QMessageBox.Icon.Question, "Delete from this computer",
                          f"Delete {what} {entry.name} ({format_size(entry.size)})?\n"
                          f"{entry.path} is removed from the disk; a model from the Hub can be "
                          "downloaded again.",
                          QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.Cancel,
                          self)
        box.setObjectName("deleteLocalModelDialog")
        box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        box.finished.connect(lambda answer: (answer == QMessageBox.StandardButton.Yes
                                             and self.library.delete(entry)))
        box.open()
        return box

    # -- LocalModelsView -----------------------------------------------------------------------

    def show_listing(self, listing: LocalListing) -> None:
        chosen = self.selected()
        self.table.clear()
        self._entries = {str(e.path): e for e in listing.entries}
        now = time.time()
        for entry in listing.entries:
            item = QTreeWidgetItem(self.table, [_shown_name(entry), entry.format,
                                                entry.quantization,
                                                format_size(entry.size),
                                                "" if entry.is_partial
                                                else format_last_used(entry.last_used, now)])
            item.setData(0, Qt.ItemDataRole.UserRole, str(entry.path))
            item.setToolTip(0, str(entry.path))
            if entry.is_partial:
                for column in range(len(COLUMNS)):
                    item.setForeground(column, self.palette().placeholderText())
        for column in range(len(COLUMNS)):
            self.table.resizeColumnToContents(column)
        if chosen is not None:
            self.select(chosen.path)
        self.where.setText(_folder_summary(listing))
        self._enable_buttons()

    def show_status(self, text: str, error: bool = False) -> None:
        self.status_line.setText(text)
        self.status_line.setProperty("error", error)
        self.status_line.setStyleSheet("color: #c0392b;" if error else "")

    def _enable_buttons(self) -> None:
        entry = self.selected()
        self.load_button.setEnabled(entry is not None and not entry.is_partial)
        self.delete_button.setEnabled(entry is not None and entry.can_delete)
        self.delete_button.setVisible(entry is None or not entry.can_forget)
        self.forget_button.setVisible(entry is not None and entry.can_forget)
        self.delete_button.setToolTip(
            "The bundled model comes with Pagoda and is not deleted" if entry is not None
            and entry.kind == BUNDLED else "Remove it from the disk (asked first)")


def _shown_name(entry: LocalModel) -> str:
    if entry.kind == BUNDLED:
        return f"{entry.name} (bundled)"
    if entry.kind == OUTSIDE:
        return f"{entry.name} (opened from a file)"
    return entry.name


def _folder_summary(listing: LocalListing) -> str:
    if not listing.exists:
        return f"Models folder: {listing.folder} (nothing downloaded yet)"
    count = len(listing.folder_models)
    models = "1 model" if count == 1 else f"{count} models"
    partial = len(listing.partials)
    unfinished = f", {partial} unfinished download{'s' if partial != 1 else ''}" if partial \
        else ""
    return (f"Models folder: {listing.folder} · {models}{unfinished}, "
            f"{format_size(listing.total_bytes)} in all")
