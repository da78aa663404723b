"""Settings → Tools: MCP servers added by command or URL or from pasted JSON, their tools and
log, removed and switched off, and the limits of a turn's tool calls, kept in the store. The
servers that start are the real test server (tests/app/components/tools/mcp_test_server.py)."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QPushButton, QToolBar

from pagoda.app.components.tools import McpServerConfig, parse_mcp_servers
from pagoda.app.qt.tools.tools_dialog import ToolsDialog

TEST_SERVER = str(Path(__file__).parents[2] / "components" / "tools" / "mcp_test_server.py")
WAIT_MS = 20_000


@pytest.fixture
def window(window_on, tmp_path):
    return window_on(tmp_path / "chats.db")


@pytest.fixture
def dialog(window) -> ToolsDialog:
    return window.open_tools_dialog()


def stored_tools(window) -> dict:
    window.db.drain()
    return window.db.store.get_setting("tools")


def stored_servers(window) -> list[McpServerConfig]:
    return parse_mcp_servers(stored_tools(window)["mcpServers"])


def server_names(dialog: ToolsDialog) -> list[str]:
    return [dialog.servers.topLevelItem(i).text(0)
            for i in range(dialog.servers.topLevelItemCount())]


def add_by_form(qtbot, dialog: ToolsDialog, name: str, command_line: str = "",
                url: str = "", env: str = "") -> None:
    form = dialog.open_add_form()
    qtbot.keyClicks(form.name_edit, name)
    if url:
        form.url_choice.setChecked(True)
        qtbot.keyClicks(form.url_edit, url)
    else:
        qtbot.keyClicks(form.command_edit, command_line)
        form.env_edit.setPlainText(env)
    form.add_button.click()


def import_text(dialog: ToolsDialog, text: str) -> None:
    form = dialog.open_import_form()
    form.text_edit.setPlainText(text)
    form.import_button.click()


def tools_shown(dialog: ToolsDialog) -> list[tuple[str, str]]:
    return [(dialog.tools.topLevelItem(i).text(0), dialog.tools.topLevelItem(i).text(1))
            for i in range(dialog.tools.topLevelItemCount())]


def test_the_tools_button_opens_one_non_modal_dialog(window):
    toolbar = window.findChild(QToolBar, "modelToolbar")
    [action] = [action for action in toolbar.actions() if action.text() == "Tools"]
    action.trigger()
    dialog = window.findChild(ToolsDialog, "toolsDialog")
    assert dialog.isVisible() and not dialog.isModal()
    assert dialog.windowTitle() == "Tools"
    dialog.close()
    assert window.open_tools_dialog() is dialog and dialog.isVisible()


def test_a_server_added_by_command_lists_its_tools_and_keeps_its_log(window, dialog, qtbot,
                                                                     run_async):
    add_by_form(qtbot, dialog, "calc", shlex.join([sys.executable, TEST_SERVER]),
                env="PAGODA_TOOLS_TEST=on")
    assert not dialog.add_form.isVisible()
    assert server_names(dialog) == ["calc"]
    assert dialog.servers.topLevelItem(0).text(1) == shlex.join([sys.executable, TEST_SERVER])
    assert dialog.selected_server().name == "calc"
    dialog.list_button.click()
    assert dialog.listing_label.text() == "starting…"
    assert not dialog.list_button.isEnabled()
    qtbot.waitUntil(lambda: ("add", "Add two integers.") in tools_shown(dialog),
                    timeout=WAIT_MS)
    assert dialog.list_button.text() == "Refresh"
    qtbot.waitUntil(lambda: dialog.servers.topLevelItem(0).text(2) == "running", timeout=3000)

    run_async(window.toolbox.hub.call_tool("calc", "log", {"text": "cache warmed: 42"}, 5))
    qtbot.waitUntil(lambda: "cache warmed: 42" in dialog.log_view.toPlainText(), timeout=3000)
    assert dialog.log_view.isReadOnly()
    [stored] = stored_servers(window)
    assert (stored.args, stored.env) == ((TEST_SERVER,), {"PAGODA_TOOLS_TEST": "on"})
    window.close()  # stops the server


def test_a_server_that_cannot_start_shows_its_failure_in_the_dialog(window, dialog, qtbot):
    add_by_form(qtbot, dialog, "missing", "no-such-mcp-server-command --stdio")
    dialog.list_button.click()
    qtbot.waitUntil(lambda: "not found" in dialog.listing_label.text(), timeout=WAIT_MS)
    assert dialog.listing_label.text().startswith("Could not list the tools: the command "
                                                  "'no-such-mcp-server-command' was not found")
    assert dialog.listing_label.property("severity") == "error"
    assert dialog.list_button.isEnabled() and dialog.list_button.text() == "Show tools"
    qtbot.waitUntil(lambda: dialog.servers.topLevelItem(0).text(2).startswith("failed: "),
                    timeout=3000)


def test_a_url_server_is_added_and_a_bad_url_is_refused_in_words(window, dialog, qtbot):
    add_by_form(qtbot, dialog, "web", url="ftp://example.com/mcp")
    assert dialog.add_form.isVisible()
    assert dialog.add_form.error_label.isVisible()
    assert "'url' must be an http:// or https:// address" in dialog.add_form.error_label.text()
    assert server_names(dialog) == []

    dialog.add_form.url_edit.setText("https://example.com/mcp")
    dialog.add_form.headers_edit.setPlainText("Authorization: Bearer secret")
    dialog.add_form.add_button.click()
    assert not dialog.add_form.isVisible()
    assert server_names(dialog) == ["web"]
    assert dialog.toolbox.settings.settings.servers == (
        McpServerConfig("web", url="https://example.com/mcp",
                        headers={"Authorization": "Bearer secret"}),)


def test_pasted_json_adds_two_servers_and_says_which_it_replaced(window, dialog):
    window.toolbox.settings.add_servers([McpServerConfig("memory", command="old-memory")])
    import_text(dialog, json.dumps({"mcpServers": {
        "memory": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-memory"]},
        "search": {"url": "https://example.com/mcp"}}}))
    assert not dialog.import_form.isVisible()
    assert server_names(dialog) == ["memory", "search"]
    assert dialog.notice_label.text() == ("Added 1 server: search. Replaced 1 server of the "
                                          "same name: memory.")
    assert "npx -y @modelcontextprotocol/server-memory" in [
        dialog.servers.topLevelItem(i).text(1) for i in range(2)]


def test_invalid_json_is_refused_with_the_error_shown_and_nothing_added(window, dialog):
    import_text(dialog, '{"mcpServers": {"a": {"command": "x", "timeout": 30}}}')
    assert dialog.import_form.isVisible()
    assert "Pagoda does not read 'timeout'" in dialog.import_form.error_label.text()
    import_text(dialog, '{"mcpServers": {')
    assert "not valid JSON" in dialog.import_form.error_label.text()
    import_text(dialog, "   ")
    assert "paste a configuration" in dialog.import_form.error_label.text()
    assert server_names(dialog) == []


def test_a_file_chosen_to_import_fills_the_box_and_a_huge_one_is_refused(dialog, tmp_path):
    path = tmp_path / "claude_desktop_config.json"
    path.write_text('{"mcpServers": {"a": {"command": "uvx"}}}')
    form = dialog.open_import_form()
    form.load_file(str(path))
    assert form.text_edit.toPlainText() == '{"mcpServers": {"a": {"command": "uvx"}}}'
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (1024 * 1024 + 1))
    form.load_file(str(big))
    assert "'big.json' is larger than 1024 KiB" in form.error_label.text()


def test_the_servers_are_exported_and_copied_as_the_json_other_apps_read(window, dialog,
                                                                         tmp_path):
    servers = [McpServerConfig("a", command="uvx", args=("a-mcp",)),
               McpServerConfig("b", url="https://example.com/mcp")]
    window.toolbox.settings.add_servers(servers)
    dialog.export_to(str(tmp_path / "mcp.json"))
    assert parse_mcp_servers((tmp_path / "mcp.json").read_text()) == servers
    dialog.copy_json()
    assert parse_mcp_servers(QGuiApplication.clipboard().text()) == servers
    dialog.export_to(str(tmp_path / "missing-folder" / "mcp.json"))
    assert "cannot be written" in dialog.error_label.text()


def test_remove_asks_first_then_removes_the_server(window, dialog, qtbot):
    window.toolbox.settings.add_servers([McpServerConfig("a", command="uvx"),
                                         McpServerConfig("b", command="uvx")])
    dialog.select_server("a")
    box = dialog.confirm_remove()
    assert "Remove the MCP server 'a'?" in box.text()
    box.button(box.StandardButton.Cancel).click()
    assert server_names(dialog) == ["a", "b"]
    dialog.select_server("a")
    box = dialog.confirm_remove()
    box.findChild(QPushButton, "confirmRemoveToolServer").click()
    assert server_names(dialog) == ["b"]
    assert [server.name for server in stored_servers(window)] == ["b"]


def test_unticking_a_server_disables_it(window, dialog):
    window.toolbox.settings.add_servers([McpServerConfig("a", command="uvx")])
    dialog.servers.topLevelItem(0).setCheckState(0, Qt.CheckState.Unchecked)
    assert not window.toolbox.settings.settings.servers[0].enabled
    assert dialog.servers.topLevelItem(0).text(2) == "disabled"
    assert not stored_servers(window)[0].enabled


def test_the_limits_of_a_turn_are_kept_in_the_store(window, dialog):
    dialog.max_calls_spin.setValue(3)
    dialog.timeout_spin.setValue(30)
    assert stored_tools(window)["max_calls_per_turn"] == 3
    assert stored_tools(window)["call_timeout_s"] == 30
    assert (dialog.max_calls_spin.minimum(), dialog.max_calls_spin.maximum()) == (1, 64)


def test_a_tool_that_always_runs_can_be_made_to_ask_again(window, dialog):
    window.toolbox.settings.allow_always("calc/add")
    window.toolbox.settings.allow_always("files/read")
    items = [dialog.always_list.item(i).text() for i in range(dialog.always_list.count())]
    assert items == ["calc/add", "files/read"]
    assert not dialog.revoke_button.isEnabled()
    dialog.always_list.item(0).setSelected(True)
    dialog.revoke_button.click()
    assert stored_tools(window)["always_allowed"] == ["files/read"]


def test_the_dialog_stops_listening_to_the_settings_once_closed(window, dialog):
    listeners = len(window.toolbox.settings.listeners)
    dialog.close()
    assert len(window.toolbox.settings.listeners) == listeners - 1
    window.open_tools_dialog()
    assert len(window.toolbox.settings.listeners) == listeners
