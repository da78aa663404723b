"""The "Add a server" dialog: an OpenAI-compatible server's address and key, then its model."""

from __future__ import annotations

from collections.abc import Sequence

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from pagoda.app.qt.shared.theme import ERROR_STYLE

EXPLANATION = ("A server with OpenAI's API (vLLM, SGLang, llama.cpp's server, Ollama, another "
               "Pagoda). Connect to list the models it serves, choose one, then Add.")
CONNECT_TEXT, CONNECTING_TEXT = "Connect", "Connecting…"


class AddServerDialog(QDialog):
    """Renders what it is told and emits what the user asks: `probe_requested(url, key)` on
    Connect (or Enter in a field), `add_requested(url, key, model)` on Add. Editing the address
    or the key clears the models listed, which belonged to the server asked before."""

    probe_requested = Signal(str, str)
    add_requested = Signal(str, str, str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent, objectName="addServerDialog", windowTitle="Add a server")
        self.setStyleSheet(ERROR_STYLE)
        self._busy = False
        self.url_edit = QLineEdit(objectName="serverUrl", placeholderText="http://gpu-box:8000/v1")
        self.key_edit = QLineEdit(objectName="serverApiKey", placeholderText="optional",
                                  echoMode=QLineEdit.EchoMode.Password)
        self.connect_button = QPushButton(CONNECT_TEXT, objectName="connectServer",
                                          autoDefault=False)
        self.model_box = QComboBox(objectName="serverModel", enabled=False,
                                   placeholderText="Connect to list the models")
        self.error_label = QLabel(objectName="serverError", wordWrap=True, visible=False)
        self.error_label.setProperty("severity", "error")
        self.notice_label = QLabel(objectName="keyringNotice", wordWrap=True, visible=False)
        self.notice_label.setProperty("muted", True)
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Cancel)
        self.add_button = self.buttons.addButton("Add", QDialogButtonBox.ButtonRole.ActionRole)
        self.add_button.setObjectName("addServer")
        self._build_layout()
        self.connect_button.clicked.connect(self._request_probe)
        self.url_edit.returnPressed.connect(self._request_probe)
        self.key_edit.returnPressed.connect(self._request_probe)
        self.url_edit.textEdited.connect(lambda _text: self.show_models([]))
        self.key_edit.textEdited.connect(lambda _text: self.show_models([]))
        self.model_box.currentIndexChanged.connect(lambda _index: self._update_add_button())
        self.add_button.clicked.connect(self._request_add)
        self.buttons.rejected.connect(self.reject)
        self._update_add_button()

    def _build_layout(self) -> None:
        address = QHBoxLayout()
        address.addWidget(self.url_edit, 1)
        address.addWidget(self.connect_button)
        form = QFormLayout()
        form.addRow("Address", address)
        form.addRow("API key", self.key_edit)
        form.addRow("Model", self.model_box)
        layout = QVBoxLayout(self)
        layout.addWidget(QLabel(EXPLANATION, wordWrap=True))
        layout.addLayout(form)
        layout.addWidget(self.error_label)
        layout.addWidget(self.notice_label)
        layout.addWidget(self.buttons)
        self.url_edit.setMinimumWidth(self.url_edit.fontMetrics().horizontalAdvance("x" * 40))

    # -- render -----------------------------------------------------------------------------

    def show_models(self, models: Sequence[str], chosen: str | None = None) -> None:
        """List `models`; `chosen` is selected, else none until the user picks one."""
        self.model_box.blockSignals(True)
        self.model_box.clear()
        self.model_box.addItems(list(models))
        self.model_box.setCurrentIndex(self.model_box.findText(chosen) if chosen else -1)
        self.model_box.blockSignals(False)
        self.model_box.setEnabled(bool(models) and not self._busy)
        self.model_box.setPlaceholderText("Choose a model" if models
                                          else "Connect to list the models")
        self._update_add_button()

    def show_error(self, text: str | None) -> None:
        """The error in words, in red; None hides it."""
        self.error_label.setText(text or "")
        self.error_label.setVisible(bool(text))

    def show_notice(self, text: str | None) -> None:
        """A note that is not an error (where the API key is kept); None hides it."""
        self.notice_label.setText(text or "")
        self.notice_label.setVisible(bool(text))

    def set_busy(self, busy: bool) -> None:
        """While the server is being asked: no second Connect, no Add."""
        self._busy = busy
        self.connect_button.setEnabled(not busy)
        self.connect_button.setText(CONNECTING_TEXT if busy else CONNECT_TEXT)
        self.model_box.setEnabled(not busy and self.model_box.count() > 0)
        self._update_add_button()

    # -- input ------------------------------------------------------------------------------

    def _request_probe(self) -> None:
        if not self._busy and self.url_edit.text().strip():
            self.probe_requested.emit(self.url_edit.text(), self.key_edit.text())

    def _request_add(self) -> None:
        if self.add_button.isEnabled():
            self.add_requested.emit(self.url_edit.text(), self.key_edit.text(),
                                    self.model_box.currentText())

    def _update_add_button(self) -> None:
        self.add_button.setEnabled(not self._busy and self.model_box.currentIndex() >= 0)
