"""The two small forms of Settings → Tools: "Add server…" (a command line or a URL) and
"Import JSON…" (a pasted or opened {"mcpServers": ...} document). Each emits what was typed and
shows the refusal it is told, in words, under its fields."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QButtonGroup,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QRadioButton,
    QVBoxLayout,
    QWidget,
)

from pagoda.app.components.tools.errors import ToolConfigError
from pagoda.app.components.tools.forms import ServerForm, read_config_file
from pagoda.app.qt.shared.theme import ERROR_STYLE

JSON_FILTER = "JSON (*.json);;All files (*)"
IMPORT_EXAMPLE = ('{"mcpServers": {\n  "memory": {"command": "npx", "args": ["-y", '
                  '"@modelcontextprotocol/server-memory"]}\n}}')


def _error_label(object_name: str) -> QLabel:
    label = QLabel(objectName=object_name, wordWrap=True, visible=False)
    label.setProperty("severity", "error")
    return label


def _lines_edit(object_name: str, placeholder: str) -> QPlainTextEdit:
    edit = QPlainTextEdit(objectName=object_name, placeholderText=placeholder,
                          tabChangesFocus=True)
    edit.setFixedHeight(edit.fontMetrics().lineSpacing() * 4 + 12)
    return edit


class AddToolServerDialog(QDialog):
    """Emits `add_requested(ServerForm)` on Add; stays open until told it was added."""

    add_requested = Signal(object)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent, objectName="addToolServerDialog",
                         windowTitle="Add an MCP server")
        self.setStyleSheet(ERROR_STYLE)
        self.name_edit = QLineEdit(objectName="toolServerName", placeholderText="memory")
        self.command_choice = QRadioButton("Command (stdio)", objectName="commandChoice",
                                           checked=True)
        self.url_choice = QRadioButton("URL (streamable HTTP)", objectName="urlChoice")
        self._choices = QButtonGroup(self)
        self._choices.addButton(self.command_choice)
        self._choices.addButton(self.url_choice)
        self.command_edit = QLineEdit(
            objectName="toolServerCommand",
            placeholderText="npx -y @modelcontextprotocol/server-memory")
        self.env_edit = _lines_edit("toolServerEnv", "KEY=VALUE, one a line (optional)")
        self.url_edit = QLineEdit(objectName="toolServerUrl",
                                  placeholderText="https://example.com/mcp")
        self.headers_edit = _lines_edit("toolServerHeaders",
                                        "Authorization: Bearer …, one a line (optional)")
        self.error_label = _error_label("addToolServerError")
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Cancel)
        self.add_button = self.buttons.addButton("Add", QDialogButtonBox.ButtonRole.ActionRole)
        self.add_button.setObjectName("addToolServerButton")
        self._build_layout()
        self.command_choice.toggled.connect(self._show_transport)
        self.add_button.clicked.connect(self._request_add)
        self.buttons.rejected.connect(self.reject)
        self._show_transport()

    def _build_layout(self) -> None:
        choices = QHBoxLayout()
        choices.addWidget(self.command_choice)
        choices.addWidget(self.url_choice)
        choices.addStretch(1)
        form = QFormLayout()
        form.addRow("Name", self.name_edit)
        form.addRow("Reached by", choices)
        form.addRow("Command line", self.command_edit)
        form.addRow("Environment", self.env_edit)
        form.addRow("URL", self.url_edit)
        form.addRow("Headers", self.headers_edit)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(self.error_label)
        layout.addWidget(self.buttons)
        self.command_edit.setMinimumWidth(
            self.command_edit.fontMetrics().horizontalAdvance("x" * 50))

    def clear(self) -> None:
        for edit in (self.name_edit, self.command_edit, self.url_edit):
            edit.clear()
        self.env_edit.clear()
        self.headers_edit.clear()
        self.command_choice.setChecked(True)
        self.show_error(None)

    def show_error(self, text: str | None) -> None:
        self.error_label.setText(text or "")
        self.error_label.setVisible(bool(text))

    def form(self) -> ServerForm:
        return ServerForm(self.name_edit.text(),
                          "command" if self.command_choice.isChecked() else "url",
                          command_line=self.command_edit.text(),
                          env_lines=self.env_edit.toPlainText(),
                          url=self.url_edit.text(),
                          header_lines=self.headers_edit.toPlainText())

    def _show_transport(self) -> None:
        by_command = self.command_choice.isChecked()
        for edit in (self.command_edit, self.env_edit):
            edit.setEnabled(by_command)
        for edit in (self.url_edit, self.headers_edit):
            edit.setEnabled(not by_command)

    def _request_add(self) -> None:
        self.add_requested.emit(self.form())


class ImportServersDialog(QDialog):
    """Emits `import_requested(text)` on Import. "From file…" reads a file (1 MiB at most)
    into the text box, or says why it could not."""

    import_requested = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent, objectName="importToolServersDialog",
                         windowTitle="Import MCP servers")
        self.setStyleSheet(ERROR_STYLE)
        self.resize(560, 420)
        self.text_edit = QPlainTextEdit(objectName="importJson", placeholderText=IMPORT_EXAMPLE)
        self.file_button = QPushButton("From file…", objectName="importFromFile",
                                       autoDefault=False)
        self.error_label = _error_label("importError")
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Cancel)
        self.import_button = self.buttons.addButton("Import",
                                                    QDialogButtonBox.ButtonRole.ActionRole)
        self.import_button.setObjectName("importButton")
        self.file_dialog: QFileDialog | None = None
        layout = QVBoxLayout(self)
        layout.addWidget(QLabel('Paste the {"mcpServers": …} JSON of Claude Desktop, Cursor or '
                                'LM Studio. A server with the name of one you have replaces it.',
                                wordWrap=True))
        layout.addWidget(self.text_edit, 1)
        layout.addWidget(self.error_label)
        bottom = QHBoxLayout()
        bottom.addWidget(self.file_button)
        bottom.addStretch(1)
        bottom.addWidget(self.buttons)
        layout.addLayout(bottom)
        self.file_button.clicked.connect(self.choose_file)
        self.import_button.clicked.connect(
            lambda: self.import_requested.emit(self.text_edit.toPlainText()))
        self.buttons.rejected.connect(self.reject)

    def clear(self) -> None:
        self.text_edit.clear()
        self.show_error(None)

    def show_error(self, text: str | None) -> None:
        self.error_label.setText(text or "")
        self.error_label.setVisible(bool(text))

    def choose_file(self) -> QFileDialog:
        """A non-blocking file dialog; the file chosen fills the text box."""
        self.file_dialog = QFileDialog(self, "Import MCP servers", str(Path.home()), JSON_FILTER)
        self.file_dialog.setFileMode(QFileDialog.FileMode.ExistingFile)
        self.file_dialog.fileSelected.connect(self.load_file)
        self.file_dialog.open()
        return self.file_dialog

    def load_file(self, path: str) -> None:
        try:
            self.text_edit.setPlainText(read_config_file(Path(path)))
        except ToolConfigError as exc:
            self.show_error(str(exc))
        else:
            self.show_error(None)
