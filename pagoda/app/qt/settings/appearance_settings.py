"""Settings of the application's look: the theme, applied by whoever listens, not by the panel."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QComboBox, QFormLayout, QLabel, QVBoxLayout, QWidget

from pagoda.app.qt.shared.theme import THEMES, ThemeMode

THEME_LABELS: dict[ThemeMode, str] = {
    "system": "Follow the system",
    "light": "Light",
    "dark": "Dark",
}


class AppearancePanel(QWidget):
    """Emits the user's pick only: `theme_changed(str)` with one of `pagoda.app.qt.shared.theme.THEMES`."""

    theme_changed = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("appearancePanel")
        self.setAttribute(Qt.WidgetAttribute.WA_StyledBackground)
        self.theme_picker = QComboBox(objectName="themePicker")
        for mode in THEMES:
            self.theme_picker.addItem(THEME_LABELS[mode], mode)
        form = QFormLayout()
        form.addRow("Theme", self.theme_picker)
        layout = QVBoxLayout(self)
        layout.addWidget(QLabel("Appearance", objectName="appearanceTitle"))
        layout.addLayout(form)
        # activated, not currentIndexChanged: set_theme stays quiet.
        self.theme_picker.activated.connect(self._picked)

    def theme(self) -> ThemeMode:
        return self.theme_picker.currentData()

    def set_theme(self, mode: ThemeMode) -> None:
        """Show `mode` as the chosen theme without emitting."""
        index = self.theme_picker.findData(mode)
        if index < 0:
            raise ValueError(f"Unknown theme {mode!r}; choose one of {', '.join(THEMES)}.")
        self.theme_picker.setCurrentIndex(index)

    def _picked(self, index: int) -> None:
        self.theme_changed.emit(self.theme_picker.itemData(index))
