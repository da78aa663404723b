"""Settings of the local server: the loaded model over OpenAI's API, on this computer only."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QAbstractSpinBox,
    QCheckBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from pagoda.app.components.shared.view_models import LocalServerView
from pagoda.app.qt.shared.theme import ERROR_STYLE

MIN_PORT, MAX_PORT = 1024, 65535
ENABLED_TOOLTIP = ("Answer OpenAI-compatible requests (/v1/chat/completions, /v1/completions, "
                   "/v1/models) from programs on this computer with the loaded model; they "
                   "share the engine with the chats.")
NO_KEY_TEXT = "No API key: any program on this computer can use the server."
KEY_SET_TEXT = "An API key is set: requests must send it (Authorization: Bearer …)."


class LocalServerPanel(QWidget):
    """Emits the user's edits only: `enabled_toggled(bool)`, `port_chosen(int)`,
    `generate_key_requested()`, `remove_key_requested()`."""

    enabled_toggled = Signal(bool)
    port_chosen = Signal(int)
    generate_key_requested = Signal()
    remove_key_requested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("localServerPanel")
        self.setAttribute(Qt.WidgetAttribute.WA_StyledBackground)
        self.setStyleSheet(ERROR_STYLE)
        self.enabled_box = QCheckBox("Serve the model on this computer", objectName="serverEnabled",
                                     toolTip=ENABLED_TOOLTIP)
        self.port_box = _port_spin()
        self.state_label = QLabel(objectName="serverState", wordWrap=True,
                                  textInteractionFlags=Qt.TextInteractionFlag.TextSelectableByMouse)
        self.key_label = QLabel(NO_KEY_TEXT, objectName="apiKeyState", wordWrap=True)
        self.key_label.setProperty("muted", True)
        self.generate_button = QPushButton("Generate key", objectName="generateApiKey")
        self.remove_button = QPushButton("Remove key", objectName="removeApiKey")
        self._shown: LocalServerView | None = None
        self._build_layout()
        # clicked and editingFinished, not toggled and valueChanged: show_server stays quiet.
        self.enabled_box.clicked.connect(lambda checked: self.enabled_toggled.emit(checked))
        self.port_box.editingFinished.connect(self._port_edited)
        self.generate_button.clicked.connect(lambda: self.generate_key_requested.emit())
        self.remove_button.clicked.connect(lambda: self.remove_key_requested.emit())

    def _build_layout(self) -> None:
        title = QLabel("Local server (OpenAI API)", objectName="localServerTitle")
        form = QFormLayout()
        form.addRow("Port", self.port_box)
        buttons = QHBoxLayout()
        buttons.addWidget(self.generate_button)
        buttons.addWidget(self.remove_button)
        buttons.addStretch(1)
        layout = QVBoxLayout(self)
        layout.addWidget(title)
        layout.addWidget(self.enabled_box)
        layout.addLayout(form)
        layout.addWidget(self.state_label)
        layout.addWidget(self.key_label)
        layout.addLayout(buttons)

    def port(self) -> int:
        return self.port_box.value()

    def show_server(self, view: LocalServerView) -> None:
        """Show whether it serves, where, why not, and whether a key is set."""
        # Always: a click that failed again, with the same message, left the box checked.
        self.enabled_box.setChecked(view.address is not None)
        if view == self._shown:
            return
        self._shown = view
        if not self.port_box.hasFocus():
            self.port_box.setValue(view.port)
        self._show_state(view)
        self.key_label.setText(KEY_SET_TEXT if view.key_set else NO_KEY_TEXT)
        self.generate_button.setText("Generate a new key" if view.key_set else "Generate key")
        self.remove_button.setVisible(view.key_set)

    def _show_state(self, view: LocalServerView) -> None:
        if view.error:
            text, severity = view.error, "error"
        elif view.address is not None:
            text, severity = f"Serving at {view.address}/v1", ""
        else:
            text, severity = "", ""
        self.state_label.setText(text)
        self.state_label.setVisible(bool(text))
        if self.state_label.property("severity") != severity:
            self.state_label.setProperty("severity", severity)
            self.state_label.style().unpolish(self.state_label)
            self.state_label.style().polish(self.state_label)

    def _port_edited(self) -> None:
        if self._shown is None or self.port() != self._shown.port:
            self.port_chosen.emit(self.port())


def _port_spin() -> QSpinBox:
    box = QSpinBox(objectName="serverPort")
    box.setRange(MIN_PORT, MAX_PORT)
    box.setKeyboardTracking(False)
    box.lineEdit().setTextMargins(6, 0, 0, 0)  # as the settings panel's spin boxes
    box.setCorrectionMode(QAbstractSpinBox.CorrectionMode.CorrectToNearestValue)
    box.setToolTip("The TCP port on 127.0.0.1 the server listens on")
    return box
