"""What Settings → Tools reads and shows, with no Qt and no server: the add-server form made
into a server (or refused in words), a file to import, what an import replaced, the servers'
rows and states in words, and the tools each server listed."""

from __future__ import annotations

import asyncio
import json

import pytest

from pagoda.app.components.tools import McpServerConfig, McpTool, ServerStatus, ToolConfigError
from pagoda.app.components.tools.config import MAX_TEXT_BYTES, parse_mcp_servers
from pagoda.app.components.tools.errors import ToolServerError
from pagoda.app.components.tools.forms import (
    Listing,
    ServerForm,
    ToolListings,
    env_from_lines,
    headers_from_lines,
    import_words,
    read_config_file,
    server_from_form,
    server_rows,
    split_command_line,
    state_words,
    write_config_file,
)

# The add-server form ----------------------------------------------------------------------------


def test_a_command_line_is_split_into_program_and_arguments_as_a_shell_would():
    form = ServerForm(" files ", "command",
                      command_line="npx -y @scope/server-files '/home/me/My Documents'",
                      env_lines="API_KEY=abc=def\n\n  DEBUG=1  \n")
    assert server_from_form(form) == McpServerConfig(
        "files", command="npx", args=("-y", "@scope/server-files", "/home/me/My Documents"),
        env={"API_KEY": "abc=def", "DEBUG": "1  "})


def test_a_url_form_gives_a_streamable_http_server_with_its_headers():
    form = ServerForm("search", "url", url=" https://example.com/mcp ",
                      header_lines="Authorization: Bearer t:k\nX-Team:  blue")
    config = server_from_form(form)
    assert config.transport == "http" and config.url == "https://example.com/mcp"
    assert config.headers == {"Authorization": "Bearer t:k", "X-Team": "blue"}


def test_the_fields_of_the_other_transport_are_not_read():
    form = ServerForm("web", "url", command_line="node server.js", env_lines="A=1",
                      url="http://localhost:3000/mcp")
    assert server_from_form(form) == McpServerConfig("web", url="http://localhost:3000/mcp")


@pytest.mark.parametrize(("form", "words"), [
    (ServerForm("", "command", command_line="uvx x"), "give the server a name"),
    (ServerForm("a/b", "command", command_line="uvx x"), "the server name 'a/b' must be"),
    (ServerForm("x", "command", command_line="  "), "give the command that starts the server"),
    (ServerForm("x", "command", command_line="node 'unclosed"), "close the quote"),
    (ServerForm("x", "command", command_line="node", env_lines="NOVALUE"),
     "environment variable line 1 ('NOVALUE') must read KEY=VALUE"),
    (ServerForm("x", "command", command_line="node", env_lines="A=1\nA=2"),
     "the environment variable 'A' is given twice"),
    (ServerForm("x", "url", url=""), "give the server's URL"),
    (ServerForm("x", "url", url="ftp://example.com"),
     "'url' must be an http:// or https:// address, not 'ftp://example.com'"),
    (ServerForm("x", "url", url="http://h/mcp", header_lines="\nBearer t"),
     "header line 2 ('Bearer t') must read Name: value"),
    (ServerForm("x", "url", url="http://h/mcp", header_lines="Bad Name: v"),
     "the header 'Bad Name' is not a valid HTTP header"),
])
def test_a_form_that_cannot_be_a_server_is_refused_naming_the_field(form, words):
    with pytest.raises(ToolConfigError, match=words.replace("(", r"\(").replace(")", r"\)")):
        server_from_form(form)


def test_a_name_already_taken_is_refused_rather_than_replacing_that_server():
    with pytest.raises(ToolConfigError, match="a server is already named 'memory'"):
        server_from_form(ServerForm("memory", "command", command_line="uvx m"),
                         taken=["memory"])


def test_blank_lines_give_no_variables_or_headers():
    assert env_from_lines("\n  \n") == {} and headers_from_lines("") == {}


def test_quoted_words_stay_one_argument():
    assert split_command_line('python -c "print(1)"') == ["python", "-c", "print(1)"]


# Import and export ------------------------------------------------------------------------------

def test_an_exported_file_is_read_back_as_the_same_servers(tmp_path):
    servers = [McpServerConfig("a", command="uvx", args=("a-mcp",), env={"K": "v"}),
               McpServerConfig("b", url="https://example.com/mcp", enabled=False)]
    path = tmp_path / "mcp.json"
    write_config_file(path, servers)
    assert parse_mcp_servers(read_config_file(path)) == servers


def test_a_file_with_a_byte_order_mark_is_read(tmp_path):
    path = tmp_path / "claude_desktop_config.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps({"mcpServers": {}}).encode())
    assert read_config_file(path) == '{"mcpServers": {}}'


def test_a_file_too_large_missing_or_not_text_is_refused_in_words(tmp_path):
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (MAX_TEXT_BYTES + 1))
    with pytest.raises(ToolConfigError, match="'big.json' is larger than 1024 KiB"):
        read_config_file(big)
    with pytest.raises(ToolConfigError, match="cannot be read"):
        read_config_file(tmp_path / "missing.json")
    binary = tmp_path / "picture.json"
    binary.write_bytes(b"\x89PNG\xff\xfe")
    with pytest.raises(ToolConfigError, match="'picture.json' is not UTF-8 text"):
        read_config_file(binary)


def test_a_folder_that_cannot_be_written_is_named(tmp_path):
    with pytest.raises(ToolConfigError, match="cannot be written"):
        write_config_file(tmp_path / "no-such-folder" / "mcp.json", [])


def test_an_import_says_what_it_added_and_what_it_replaced():
    imported = [McpServerConfig("a", command="a"), McpServerConfig("b", command="b"),
                McpServerConfig("c", command="c")]
    assert import_words(imported, existing=["b", "z"]) == (
        "Added 2 servers: a, c. Replaced 1 server of the same name: b.")
    assert import_words(imported[:1], existing=[]) == "Added 1 server: a."


# Rows and states --------------------------------------------------------------------------------

def test_rows_show_the_command_line_or_url_and_the_state_in_words():
    servers = [McpServerConfig("files", command="npx", args=("-y", "My Server")),
               McpServerConfig("web", url="https://example.com/mcp"),
               McpServerConfig("old", url="http://localhost:8000/sse", sse=True),
               McpServerConfig("off", command="uvx", enabled=False)]
    states = {"files": ServerStatus("running"), "web": ServerStatus("failed", "refused"),
              "old": ServerStatus("starting")}
    rows = server_rows(servers, lambda name: states.get(name, ServerStatus("stopped")))
    assert [(row.transport, row.enabled, row.state) for row in rows] == [
        ("npx -y 'My Server'", True, "running"),
        ("https://example.com/mcp", True, "failed: refused"),
        ("http://localhost:8000/sse (SSE)", True, "starting…"),
        ("uvx", False, "disabled"),
    ]


def test_a_stopped_server_says_why_when_there_is_a_reason():
    assert state_words(ServerStatus("stopped")) == "stopped"
    assert state_words(ServerStatus("stopped", "not configured")) == "stopped (not configured)"
    assert state_words(ServerStatus("failed")) == "failed"


# The tools each server listed -------------------------------------------------------------------

SERVER = McpServerConfig("calc", command="calc-mcp")


class FakeServers:
    """list_tools that answers when the test says, or fails in words."""

    def __init__(self) -> None:
        self.answer: asyncio.Future | None = None

    async def list_tools(self, server: str) -> list[McpTool]:
        self.answer = asyncio.get_running_loop().create_future()
        return await self.answer


async def test_a_listing_is_starting_then_shows_the_tools_with_descriptions():
    servers = FakeServers()
    listings = ToolListings(servers.list_tools)
    heard: list[Listing | None] = []
    listings.listeners.append(lambda name: heard.append(listings.get(name)))
    refresh = asyncio.ensure_future(listings.refresh(SERVER))
    assert listings.get("calc") == Listing("listing")  # at once, before the server is asked
    await asyncio.sleep(0)
    servers.answer.set_result([McpTool("calc", "add", "Add two integers.")])
    assert await refresh == Listing("listed", (("add", "Add two integers."),))
    assert heard == [Listing("listing"), Listing("listed", (("add", "Add two integers."),))]


async def test_a_server_that_cannot_start_gives_its_failure_in_words_not_an_exception():
    async def failing(server: str) -> list[McpTool]:
        raise ToolServerError(server, "the command 'calc-mcp' was not found")

    listings = ToolListings(failing)
    await listings.refresh(SERVER)
    assert listings.get("calc") == Listing("failed",
                                           error="the command 'calc-mcp' was not found")


async def test_a_refresh_keeps_the_tools_on_screen_while_the_server_is_asked_again():
    servers = FakeServers()
    listings = ToolListings(servers.list_tools)
    first = asyncio.ensure_future(listings.refresh(SERVER))
    await asyncio.sleep(0)
    servers.answer.set_result([McpTool("calc", "add")])
    await first
    again = asyncio.ensure_future(listings.refresh(SERVER))
    await asyncio.sleep(0)
    assert listings.get("calc") == Listing("listing", (("add", ""),))
    servers.answer.set_result([])
    await again


async def test_a_changed_or_removed_server_forgets_its_tools():
    async def one_tool(server: str) -> list[McpTool]:
        return [McpTool(server, "add")]

    listings = ToolListings(one_tool)
    await listings.refresh(SERVER)
    await listings.refresh(McpServerConfig("web", url="http://h/mcp"))
    listings.keep_only([McpServerConfig("calc", command="calc-mcp", args=("--v2",)),
                        McpServerConfig("web", url="http://h/mcp")])
    assert listings.get("calc") is None
    assert listings.get("web").state == "listed"
    listings.keep_only([])
    assert listings.get("web") is None
