"""Settings of the model itself, shared by every chat: how its weights are kept in memory."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QComboBox, QFormLayout, QLabel, QVBoxLayout, QWidget

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


class ModelSettingsPanel(QWidget):
    """Emits `quantization_changed(str)` only for the user's edits."""

    quantization_changed = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("modelSettingsPanel")
        self.setAttribute(Qt.WidgetAttribute.WA_StyledBackground)
        self.quantization_box = QComboBox(objectName="quantization")
        for value, text in QUANTIZATION_CHOICES:
            self.quantization_box.addItem(text, value)
        self.quantization_box.setToolTip(QUANTIZATION_TOOLTIP)
        self.note = QLabel(NEXT_LOAD_NOTE, objectName="quantizationNote", wordWrap=True)
        self._build_layout()
        # activated, not currentIndexChanged: set_quantization stays quiet.
        self.quantization_box.activated.connect(
            lambda _index: self.quantization_changed.emit(self.quantization()))

    def _build_layout(self) -> None:
        title = QLabel("Model (all chats)", objectName="modelSettingsTitle")
        label = QLabel("Quantization", objectName="quantizationLabel")
        label.setToolTip(QUANTIZATION_TOOLTIP)
        label.setBuddy(self.quantization_box)
        form = QFormLayout()
        form.setRowWrapPolicy(QFormLayout.RowWrapPolicy.WrapLongRows)
        form.addRow(label, self.quantization_box)
        layout = QVBoxLayout(self)
        layout.addWidget(title)
        layout.addLayout(form)
        layout.addWidget(self.note)

    def quantization(self) -> str:
        return self.quantization_box.currentData()

    def set_quantization(self, value: str) -> None:
        index = self.quantization_box.findData(value)
        self.quantization_box.setCurrentIndex(max(index, 0))
