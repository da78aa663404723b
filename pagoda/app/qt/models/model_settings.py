"""Settings of the model itself, shared by every chat: how its weights are kept in memory, the
prefix cache on disk, and the folder models are downloaded to."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QComboBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

# (EngineConfig.quantization, what the user reads)
QUANTIZATION_CHOICES = [
    ("auto", "Auto: as the model file is"),
    ("none", "None: full precision (most memory)"),
    ("int8", "int8"),
    ("int4", "int4 (least memory)"),
]
QUANTIZATION_TOOLTIP = ("How the weights are kept in memory. Auto keeps a GGUF file's own "
                        "quantization and loads a model folder as it is.")
NEXT_LOAD_NOTE = "Applies the next time a model loads: pick the model again to reload it."
GIB = 1 << 30
MAX_DISK_CACHE_GIB = 1024
DISK_CACHE_TOOLTIP = (
    "Keeps the model's work on your chats (its keys and values, computed from their text) on "
    "disk, so a long chat reopened after a restart answers at once instead of reading its "
    "history again. Stored in {folder}; the oldest is removed past this size. 0 turns it off.")
MODELS_FOLDER_TOOLTIP = ("Where \"Get models\" downloads to, and the folder \"On this computer\" "
                         "lists. Models already there stay when you choose another.")


class ModelSettingsPanel(QWidget):
    """Emits `quantization_changed(str)` and `disk_cache_bytes_changed(int)` only for the
    user's edits, `clear_disk_cache_requested()` for "Clear the cache", and
    `models_folder_chosen(str)` for a folder chosen with "Change…"."""

    quantization_changed = Signal(str)
    disk_cache_bytes_changed = Signal(int)
    clear_disk_cache_requested = Signal()
    models_folder_chosen = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("modelSettingsPanel")
        self.setAttribute(Qt.WidgetAttribute.WA_StyledBackground)
        self.quantization_box = QComboBox(objectName="quantization")
        for value, text in QUANTIZATION_CHOICES:
            self.quantization_box.addItem(text, value)
        self.quantization_box.setToolTip(QUANTIZATION_TOOLTIP)
        self.note = QLabel(NEXT_LOAD_NOTE, objectName="quantizationNote", wordWrap=True)
        self.disk_cache_box = QDoubleSpinBox(objectName="diskCacheSize", suffix=" GiB",
                                             decimals=1, singleStep=0.5,
                                             maximum=MAX_DISK_CACHE_GIB)
        self.disk_cache_box.setSpecialValueText("Off")
        self.disk_cache_usage = QLabel("", objectName="diskCacheUsage")
        self.clear_disk_cache_button = QPushButton("Clear the cache", objectName="clearDiskCache")
        self.show_disk_cache_folder("the cache folder")
        self.models_folder = QLabel("", objectName="modelsFolder", wordWrap=True)
        self.models_folder.setToolTip(MODELS_FOLDER_TOOLTIP)
        self.models_folder.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.change_models_folder_button = QPushButton("Change…", objectName="changeModelsFolder")
        self._build_layout()
        # activated and editingFinished, not the value signals: the setters stay quiet.
        self.quantization_box.activated.connect(
            lambda _index: self.quantization_changed.emit(self.quantization()))
        self.disk_cache_box.editingFinished.connect(
            lambda: self.disk_cache_bytes_changed.emit(self.disk_cache_bytes()))
        self.clear_disk_cache_button.clicked.connect(self.clear_disk_cache_requested)
        self.change_models_folder_button.clicked.connect(self.choose_models_folder)

    def _build_layout(self) -> None:
        title = QLabel("Model (all chats)", objectName="modelSettingsTitle")
        label = QLabel("Quantization", objectName="quantizationLabel")
        label.setToolTip(QUANTIZATION_TOOLTIP)
        label.setBuddy(self.quantization_box)
        form = QFormLayout()
        form.setRowWrapPolicy(QFormLayout.RowWrapPolicy.WrapLongRows)
        form.addRow(label, self.quantization_box)
        disk_label = QLabel("Disk cache", objectName="diskCacheLabel")
        disk_label.setBuddy(self.disk_cache_box)
        form.addRow(disk_label, self.disk_cache_box)
        usage = QHBoxLayout()
        usage.addWidget(self.disk_cache_usage, 1)
        usage.addWidget(self.clear_disk_cache_button)
        form.addRow(usage)
        folder_label = QLabel("Models folder", objectName="modelsFolderLabel")
        folder_label.setToolTip(MODELS_FOLDER_TOOLTIP)
        folder_label.setBuddy(self.change_models_folder_button)
        folder = QHBoxLayout()
        folder.addWidget(self.models_folder, 1)
        folder.addWidget(self.change_models_folder_button)
        form.addRow(folder_label, folder)
        layout = QVBoxLayout(self)
        layout.addWidget(title)
        layout.addLayout(form)
        layout.addWidget(self.note)

    def quantization(self) -> str:
        return self.quantization_box.currentData()

    def set_quantization(self, value: str) -> None:
        index = self.quantization_box.findData(value)
        self.quantization_box.setCurrentIndex(max(index, 0))

    def disk_cache_bytes(self) -> int:
        return round(self.disk_cache_box.value() * GIB)

    def set_disk_cache_bytes(self, value: int) -> None:
        self.disk_cache_box.setValue(value / GIB)

    def show_disk_cache_folder(self, folder: str) -> None:
        tooltip = DISK_CACHE_TOOLTIP.format(folder=folder)
        for widget in (self.disk_cache_box, self.disk_cache_usage):
            widget.setToolTip(tooltip)

    def show_disk_cache_usage(self, num_bytes: int) -> None:
        self.disk_cache_usage.setText(f"{format_bytes(num_bytes)} on disk")
        self.clear_disk_cache_button.setEnabled(num_bytes > 0)

    def show_models_folder(self, folder: str) -> None:
        self.models_folder.setText(folder)

    def choose_models_folder(self) -> QFileDialog:
        """Non-blocking (no dialog runs its own loop while coroutines run on this one)."""
        dialog = QFileDialog(self, "Choose the models folder", self.models_folder.text())
        dialog.setObjectName("modelsFolderDialog")
        dialog.setFileMode(QFileDialog.FileMode.Directory)
        dialog.setOption(QFileDialog.Option.ShowDirsOnly)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.fileSelected.connect(self.models_folder_chosen)
        dialog.open()
        return dialog


def format_bytes(num_bytes: int) -> str:
    """"0 bytes", "512 KiB", "1.5 GiB": what a cache holds, to one decimal past a MiB."""
    if num_bytes < 1024:
        return f"{num_bytes} bytes"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20)):
        if num_bytes >= size:
            return f"{num_bytes / size:.1f} {unit}"
    return f"{num_bytes // 1024} KiB"
