"""Settings → Tools: a view of the window's Toolbox. It lists the MCP servers with their state,
the chosen server's tools and stderr log, and the limits of a turn's tool calls, and forwards
what the user does to the toolbox's settings. Non-modal; a failure is shown in words here."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QListWidget,
    QMessageBox,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QSplitter,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from pagoda.app.components.tools.config import McpServerConfig, mcp_servers_json, parse_mcp_servers
from pagoda.app.components.tools.errors import ToolConfigError
from pagoda.app.components.tools.forms import (
    Listing,
    ServerForm,
    ServerRow,
    ToolListings,
    import_words,
    server_from_form,
    server_rows,
    write_config_file,
)
from pagoda.app.components.tools.settings import CALL_TIMEOUT_RANGE_S, MAX_CALLS_LIMIT, ToolSettings
from pagoda.app.components.tools.toolbox import Toolbox
from pagoda.app.qt.shared.theme import ERROR_STYLE
from pagoda.app.qt.tools.mcp_server_forms import (
    JSON_FILTER,
    AddToolServerDialog,
    ImportServersDialog,
)

TOOLS_DIALOG = "toolsDialog"
REFRESH_MS = 1000  # states and the log, while the dialog is shown
SHOW_TOOLS, REFRESH_TOOLS = "Show tools", "Refresh"
NAME, TRANSPORT, STATE = range(3)


class ToolsDialog(QDialog):
    """`spawn(coro)` runs the listing of a server's tools on the window's loop."""

    def __init__(self, toolbox: Toolbox, spawn: Callable[[Coroutine[Any, Any, Any]], Any],
                 parent: QWidget | None = None) -> None:
        super().__init__(parent, objectName=TOOLS_DIALOG, windowTitle="Tools")
        self.setStyleSheet(ERROR_STYLE)
        self.resize(900, 640)
        self.toolbox = toolbox
        self._spawn = spawn
        self.listings = ToolListings(toolbox.list_tools)
        self.servers = QTreeWidget(objectName="toolServers", rootIsDecorated=False)
        self.servers.setHeaderLabels(["Server", "Started with / reached at", "State"])
        self.servers.header().setSectionResizeMode(TRANSPORT, QHeaderView.ResizeMode.Stretch)
        self.add_button = QPushButton("Add server…", objectName="addToolServer")
        self.import_button = QPushButton("Import JSON…", objectName="importToolServers")
        self.export_button = QPushButton("Export JSON…", objectName="exportToolServers")
        self.copy_button = QPushButton("Copy JSON", objectName="copyToolServers")
        self.remove_button = QPushButton("Remove", objectName="removeToolServer")
        self.notice_label = QLabel(objectName="toolsNotice", wordWrap=True)
        self.error_label = QLabel(objectName="toolsError", wordWrap=True, visible=False)
        self.error_label.setProperty("severity", "error")
        self.server_title = QLabel(objectName="toolServerTitle",
                                   textFormat=Qt.TextFormat.PlainText)
        title_font = self.server_title.font()
        title_font.setBold(True)
        self.server_title.setFont(title_font)
        self.list_button = QPushButton(SHOW_TOOLS, objectName="showTools")
        self.listing_label = QLabel(objectName="toolListing", wordWrap=True)
        self.tools = QTreeWidget(objectName="serverTools", rootIsDecorated=False)
        self.tools.setHeaderLabels(["Tool", "Description"])
        self.log_view = QPlainTextEdit(objectName="toolServerLog", readOnly=True,
                                       lineWrapMode=QPlainTextEdit.LineWrapMode.NoWrap)
        self.log_button = QPushButton("Refresh log", objectName="refreshToolLog")
        self.max_calls_spin = QSpinBox(objectName="maxToolCalls", minimum=1,
                                       maximum=MAX_CALLS_LIMIT, keyboardTracking=False)
        low, high = CALL_TIMEOUT_RANGE_S
        self.timeout_spin = QDoubleSpinBox(objectName="toolCallTimeout", minimum=low,
                                           maximum=high, decimals=0, suffix=" s",
                                           keyboardTracking=False)
        self.always_list = QListWidget(objectName="alwaysAllowedTools")
        self.revoke_button = QPushButton("Revoke", objectName="revokeAlwaysAllowed")
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        self.add_form = AddToolServerDialog(self)
        self.import_form = ImportServersDialog(self)
        self.export_dialog: QFileDialog | None = None
        self._timer = QTimer(self, interval=REFRESH_MS, timeout=self._refresh_live)
        self._build_layout()
        self._connect()

    # -- construction ----------------------------------------------------------------------------

    def _build_layout(self) -> None:
        splitter = QSplitter(Qt.Orientation.Horizontal, self)
        splitter.addWidget(self._servers_column())
        splitter.addWidget(self._details_column())
        splitter.setSizes([420, 480])
        layout = QVBoxLayout(self)
        layout.addWidget(splitter, 1)
        layout.addWidget(self.notice_label)
        layout.addWidget(self.error_label)
        layout.addWidget(self._limits_box())
        layout.addWidget(self.buttons)

    def _servers_column(self) -> QWidget:
        column = QWidget(self)
        buttons = QHBoxLayout()
        for button in (self.add_button, self.import_button, self.export_button,
                       self.copy_button, self.remove_button):
            button.setAutoDefault(False)
            buttons.addWidget(button)
        buttons.addStretch(1)
        layout = QVBoxLayout(column)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(QLabel("MCP servers: a ticked server's tools are offered to the model.",
                                wordWrap=True))
        layout.addWidget(self.servers, 1)
        layout.addLayout(buttons)
        return column

    def _details_column(self) -> QWidget:
        column = QWidget(self)
        top = QHBoxLayout()
        top.addWidget(self.server_title, 1)
        top.addWidget(self.list_button)
        log_top = QHBoxLayout()
        log_top.addWidget(QLabel("Log (what the server wrote on stderr)"), 1)
        log_top.addWidget(self.log_button)
        layout = QVBoxLayout(column)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(top)
        layout.addWidget(self.listing_label)
        layout.addWidget(self.tools, 1)
        layout.addLayout(log_top)
        layout.addWidget(self.log_view, 1)
        for button in (self.list_button, self.log_button):
            button.setAutoDefault(False)
        return column

    def _limits_box(self) -> QGroupBox:
        box = QGroupBox("Tool calls", self)
        calls = QHBoxLayout()
        calls.addWidget(QLabel("At most"))
        calls.addWidget(self.max_calls_spin)
        calls.addWidget(QLabel("tool calls per turn"))
        calls.addStretch(1)
        form = QFormLayout()
        form.addRow(calls)
        form.addRow("Time limit per call", self.timeout_spin)
        always = QVBoxLayout()
        always.addWidget(QLabel("Tools that always run, without asking:"))
        always.addWidget(self.always_list)
        always.addWidget(self.revoke_button, 0, Qt.AlignmentFlag.AlignLeft)
        self.always_list.setMaximumHeight(self.always_list.fontMetrics().lineSpacing() * 5 + 8)
        self.revoke_button.setAutoDefault(False)
        layout = QHBoxLayout(box)
        layout.addLayout(form)
        layout.addLayout(always, 1)
        return box

    def _connect(self) -> None:
        self.servers.itemSelectionChanged.connect(self._render_details)
        self.servers.itemChanged.connect(self._enabled_edited)
        self.add_button.clicked.connect(self.open_add_form)
        self.import_button.clicked.connect(self.open_import_form)
        self.export_button.clicked.connect(self.choose_export_file)
        self.copy_button.clicked.connect(self.copy_json)
        self.remove_button.clicked.connect(self.confirm_remove)
        self.list_button.clicked.connect(self.list_tools)
        self.log_button.clicked.connect(self._render_log)
        self.max_calls_spin.valueChanged.connect(
            lambda value: self._change(max_calls_per_turn=value))
        self.timeout_spin.valueChanged.connect(lambda value: self._change(call_timeout_s=value))
        self.always_list.itemSelectionChanged.connect(self._render_revoke_button)
        self.revoke_button.clicked.connect(self.revoke_always_allowed)
        self.add_form.add_requested.connect(self._add_server)
        self.import_form.import_requested.connect(self._import_servers)
        self.buttons.rejected.connect(self.close)

    # -- shown or not ----------------------------------------------------------------------------

    def showEvent(self, event) -> None:
        if self._settings_changed not in self.toolbox.settings.listeners:
            self.toolbox.settings.listeners.append(self._settings_changed)
            self.listings.listeners.append(self._listing_changed)
        self._render_all()
        self._timer.start()
        super().showEvent(event)

    def hideEvent(self, event) -> None:
        self._timer.stop()
        if self._settings_changed in self.toolbox.settings.listeners:
            self.toolbox.settings.listeners.remove(self._settings_changed)
        if self._listing_changed in self.listings.listeners:
            self.listings.listeners.remove(self._listing_changed)
        super().hideEvent(event)

    # -- render ----------------------------------------------------------------------------------

    def selected_server(self) -> McpServerConfig | None:
        item = self.servers.currentItem()
        if item is None or not item.isSelected():
            return None
        return next((config for config in self.toolbox.settings.settings.servers
                     if config.name == item.text(NAME)), None)

    def select_server(self, name: str) -> None:
        for index in range(self.servers.topLevelItemCount()):
            item = self.servers.topLevelItem(index)
            if item.text(NAME) == name:
                self.servers.setCurrentItem(item)

    def _settings_changed(self, settings: ToolSettings) -> None:
        self.listings.keep_only(settings.servers)
        self._render_all()

    def _listing_changed(self, server: str) -> None:
        selected = self.selected_server()
        if selected is not None and selected.name == server:
            self._render_details()

    def _render_all(self) -> None:
        self._render_servers()
        self._render_limits()
        self._render_details()

    def _render_servers(self) -> None:
        """The rows, updated in place while the same servers are listed: a row is not
        replaced under the click that ticked it, and the selection and scroll stay."""
        settings = self.toolbox.settings.settings
        rows = server_rows(settings.servers, self.toolbox.status)
        items = [self.servers.topLevelItem(i) for i in range(self.servers.topLevelItemCount())]
        self.servers.blockSignals(True)
        if [item.text(NAME) for item in items] != [row.name for row in rows]:
            chosen = self.selected_server()
            self.servers.clear()
            items = [QTreeWidgetItem([row.name]) for row in rows]
            for item in items:
                item.setFlags(item.flags() | Qt.ItemFlag.ItemIsUserCheckable)
            self.servers.addTopLevelItems(items)
            if chosen is not None:
                self.select_server(chosen.name)
        for item, row in zip(items, rows, strict=True):
            _render_row(item, row)
        self.servers.resizeColumnToContents(NAME)
        self.servers.blockSignals(False)
        self.export_button.setEnabled(bool(rows))
        self.copy_button.setEnabled(bool(rows))

    def _render_limits(self) -> None:
        settings = self.toolbox.settings.settings
        for spin, value in ((self.max_calls_spin, settings.max_calls_per_turn),
                            (self.timeout_spin, settings.call_timeout_s)):
            spin.blockSignals(True)
            spin.setValue(value)
            spin.blockSignals(False)
        self.always_list.clear()
        self.always_list.addItems(sorted(settings.always_allowed))
        if not settings.always_allowed:
            self.always_list.addItem("None yet: each call asks first.")
            self.always_list.item(0).setFlags(Qt.ItemFlag.NoItemFlags)
        self._render_revoke_button()

    def _render_revoke_button(self) -> None:
        self.revoke_button.setEnabled(bool(self.always_list.selectedItems()))

    def _render_details(self) -> None:
        config = self.selected_server()
        self.remove_button.setEnabled(config is not None)
        self.list_button.setEnabled(config is not None)
        self.server_title.setText(config.name if config else
                                  "Choose a server to see its tools and its log.")
        listing = self.listings.get(config.name) if config else None
        self.tools.clear()
        for name, description in listing.tools if listing else ():
            item = QTreeWidgetItem([name, " ".join(description.split())])
            item.setToolTip(1, description)
            self.tools.addTopLevelItem(item)
        self.tools.resizeColumnToContents(0)
        self._render_listing_line(listing)
        self._render_log()

    def _render_listing_line(self, listing: Listing | None) -> None:
        state = listing.state if listing else None
        self.list_button.setText(REFRESH_TOOLS if state == "listed" else SHOW_TOOLS)
        self.list_button.setEnabled(self.list_button.isEnabled() and state != "listing")
        count = len(listing.tools) if listing else 0
        words = {None: "", "listing": "starting…",
                 "listed": "1 tool" if count == 1 else f"{count} tools",
                 "failed": f"Could not list the tools: {listing.error}" if listing else ""}
        self.listing_label.setText(words[state])
        self.listing_label.setProperty("severity", "error" if state == "failed" else "")
        self.listing_label.style().unpolish(self.listing_label)
        self.listing_label.style().polish(self.listing_label)

    def _render_log(self) -> None:
        config = self.selected_server()
        text = self.toolbox.log_text(config.name) if config else ""
        if text == self.log_view.toPlainText():
            return
        bar = self.log_view.verticalScrollBar()
        at_end = bar.value() >= bar.maximum() - 2
        self.log_view.setPlainText(text)
        if at_end:
            bar.setValue(bar.maximum())

    def _refresh_live(self) -> None:
        self._render_servers()
        self._render_log()

    def show_notice(self, text: str) -> None:
        self.notice_label.setText(text)
        self.show_error(None)

    def show_error(self, text: str | None) -> None:
        self.error_label.setText(text or "")
        self.error_label.setVisible(bool(text))

    # -- input -----------------------------------------------------------------------------------

    def list_tools(self) -> None:
        config = self.selected_server()
        if config is not None:
            self._spawn(self.listings.refresh(config))

    def open_add_form(self) -> AddToolServerDialog:
        self.add_form.clear()
        self.add_form.show()
        self.add_form.raise_()
        return self.add_form

    def open_import_form(self) -> ImportServersDialog:
        self.import_form.clear()
        self.import_form.show()
        self.import_form.raise_()
        return self.import_form

    def _add_server(self, form: ServerForm) -> None:
        taken = [config.name for config in self.toolbox.settings.settings.servers]
        try:
            config = server_from_form(form, taken)
            self.toolbox.settings.add_servers([config])
        except ToolConfigError as exc:
            self.add_form.show_error(str(exc))
            return
        self.add_form.accept()
        self.select_server(config.name)
        self.show_notice(f"Added {config.name}. Show its tools to start it.")

    def _import_servers(self, text: str) -> None:
        existing = [config.name for config in self.toolbox.settings.settings.servers]
        try:
            servers = parse_mcp_servers(text)
            if not servers:
                raise ToolConfigError('paste a configuration such as {"mcpServers": {...}}')
            self.toolbox.settings.add_servers(servers)
        except ToolConfigError as exc:
            self.import_form.show_error(str(exc))
            return
        self.import_form.accept()
        self.show_notice(import_words(servers, existing))

    def choose_export_file(self) -> QFileDialog:
        """A non-blocking save dialog; the servers are written to the file chosen."""
        self.export_dialog = QFileDialog(self, "Export MCP servers",
                                         str(Path.home() / "mcp.json"), JSON_FILTER)
        self.export_dialog.setAcceptMode(QFileDialog.AcceptMode.AcceptSave)
        self.export_dialog.setDefaultSuffix("json")
        self.export_dialog.fileSelected.connect(self.export_to)
        self.export_dialog.open()
        return self.export_dialog

    def export_to(self, path: str) -> None:
        servers = self.toolbox.settings.settings.servers
        try:
            write_config_file(Path(path), servers)
        except ToolConfigError as exc:
            self.show_error(str(exc))
            return
        self.show_notice(f"Wrote {len(servers)} servers to {path}; other apps can read it.")

    def copy_json(self) -> None:
        servers = self.toolbox.settings.settings.servers
        QGuiApplication.clipboard().setText(mcp_servers_json(servers))
        self.show_notice(f"Copied {len(servers)} servers as JSON; paste it into another app's "
                         "MCP settings.")

    def confirm_remove(self) -> QMessageBox | None:
        config = self.selected_server()
        if config is None:
            return None
        box = QMessageBox(QMessageBox.Icon.Question, "Remove server",
                          f"Remove the MCP server '{config.name}'? Its tools will no longer be "
                          "offered to the model.", QMessageBox.StandardButton.Cancel, self)
        box.setObjectName("removeToolServerBox")
        remove = box.addButton("Remove", QMessageBox.ButtonRole.DestructiveRole)
        remove.setObjectName("confirmRemoveToolServer")
        remove.clicked.connect(lambda: self._remove(config.name))
        box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        box.open()
        return box

    def _remove(self, name: str) -> None:
        self._change_with(lambda: self.toolbox.settings.remove_server(name))
        self.show_notice(f"Removed {name}.")

    def _enabled_edited(self, item: QTreeWidgetItem, column: int) -> None:
        if column == NAME:
            enabled = item.checkState(NAME) == Qt.CheckState.Checked
            name = item.text(NAME)
            self._change_with(lambda: self.toolbox.settings.set_enabled(name, enabled))

    def revoke_always_allowed(self) -> None:
        chosen = {item.text() for item in self.always_list.selectedItems()}
        allowed = self.toolbox.settings.settings.always_allowed
        self._change(always_allowed=allowed - chosen)

    def _change(self, **changes: Any) -> None:
        self._change_with(lambda: self.toolbox.settings.change(**changes))

    def _change_with(self, change: Callable[[], ToolSettings]) -> None:
        try:
            change()
        except ToolConfigError as exc:
            self.show_error(str(exc))
            self._render_all()
        else:
            self.show_error(None)



def _render_row(item: QTreeWidgetItem, row: ServerRow) -> None:
    item.setCheckState(NAME, Qt.CheckState.Checked if row.enabled else Qt.CheckState.Unchecked)
    for column, text in ((TRANSPORT, row.transport), (STATE, row.state)):
        if item.text(column) != text:
            item.setText(column, text)
            item.setToolTip(column, text)
