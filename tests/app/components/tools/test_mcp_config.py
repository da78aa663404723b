"""The plain data of the MCP tools layer, with no server: the {"mcpServers": ...} configuration
(read, written back, refused in words), the catalog's function names, how a tool's reply
becomes the text the model reads, and the bounded log of a server's stderr."""

from __future__ import annotations

import json
import re

import mcp.types as mcp_types
import pytest

from pagoda.app.backends import ToolSpec
from pagoda.app.components.tools import (
    McpServerConfig,
    McpTool,
    ToolCatalog,
    ToolConfigError,
    UnknownToolError,
    mcp_servers_json,
    parse_mcp_servers,
)
from pagoda.app.components.tools.config import (
    MAX_ARGS,
    MAX_SERVERS,
    MAX_STRING_BYTES,
    MAX_TEXT_BYTES,
)
from pagoda.app.components.tools.mcp.results import tool_result
from pagoda.app.components.tools.mcp.server_log import MAX_LINE_CHARS, LogRing

OPENAI_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def servers(**entries) -> str:
    return json.dumps({"mcpServers": entries})


# The configuration ----------------------------------------------------------------------------

def test_claude_desktop_entry_gives_a_stdio_server():
    [config] = parse_mcp_servers(servers(weather={
        "command": "uvx", "args": ["weather-mcp", "--units", "metric"],
        "env": {"API_KEY": "k"}, "cwd": "/tmp"}))
    assert config == McpServerConfig("weather", command="uvx",
                                     args=("weather-mcp", "--units", "metric"),
                                     env={"API_KEY": "k"}, cwd="/tmp")
    assert config.transport == "stdio" and config.enabled


def test_url_entry_is_streamable_http_unless_typed_sse():
    configs = parse_mcp_servers(servers(
        search={"url": "https://example.com/mcp", "headers": {"Authorization": "Bearer t"}},
        old={"type": "sse", "url": "http://localhost:8000/sse"},
        typed={"type": "streamable-http", "url": "http://localhost:9000/mcp"}))
    assert [config.transport for config in configs] == ["http", "sse", "http"]
    assert configs[0].headers == {"Authorization": "Bearer t"}


def test_servers_keep_the_documents_order():
    text = servers(b={"command": "b"}, a={"command": "a"}, c={"command": "c"})
    assert [config.name for config in parse_mcp_servers(text)] == ["b", "a", "c"]


def test_disabled_key_of_cline_turns_a_server_off():
    [config] = parse_mcp_servers(servers(git={"command": "git-mcp", "disabled": True}))
    assert not config.enabled


def test_empty_text_means_no_servers():
    assert parse_mcp_servers("  \n") == []
    assert parse_mcp_servers('{"mcpServers": {}}') == []


def test_written_configuration_reads_back_the_same():
    configs = [
        McpServerConfig("files", command="npx", args=("-y", "@mcp/files", "/home"),
                        env={"DEBUG": "1"}, cwd="/srv", description="My files"),
        McpServerConfig("search", url="https://example.com/mcp",
                        headers={"Authorization": "Bearer x"}, enabled=False),
        McpServerConfig("legacy", url="http://127.0.0.1:8000/sse", sse=True),
        McpServerConfig("bare", command="server"),
    ]
    text = mcp_servers_json(configs)
    assert parse_mcp_servers(text) == configs
    assert json.loads(text)["mcpServers"]["search"] == {
        "type": "http", "url": "https://example.com/mcp",
        "headers": {"Authorization": "Bearer x"}, "disabled": True}


def test_writing_two_servers_of_one_name_is_refused():
    with pytest.raises(ToolConfigError, match="two servers are named 'a'"):
        mcp_servers_json([McpServerConfig("a", command="x"), McpServerConfig("a", command="y")])


@pytest.mark.parametrize(("entry", "words"), [
    ({"command": "x", "timeout": 60}, r"'timeout' \(other apps read it in seconds or in milli"),
    ({"command": "x", "autoApprove": []}, r"'autoApprove' \(Pagoda does not read approval"),
    ({"command": "x", "envFile": ".env"}, r"'envFile' \(put the variables in 'env'"),
    ({"command": "x", "colour": "red"}, r"does not read 'colour' \(Pagoda reads command, args"),
    ({"command": "x", "type": "websocket"}, r"'type' is 'websocket'; it must be one of"),
    ({"command": "x", "args": "--fast"}, r"'args' must be a list of strings"),
    ({"command": "x", "args": ["a", 1]}, r"'args' must be a list of strings"),
    ({"command": "x", "env": {"N": 1}}, r"'env' must be an object whose values are strings"),
    ({"command": "x", "env": {"A=B": "1"}}, r"a name in 'env' is empty or holds '='"),
    ({"command": "x", "disabled": "yes"}, r"'disabled' must be true or false"),
    ({"command": "x", "cwd": 3}, r"'cwd' must be a string or null"),
    ({"command": "x", "url": "http://h/mcp"}, r"'url' does not apply to a server started from"),
    ({"url": "http://h/mcp", "args": []}, r"'args' does not apply to a server reached at 'url'"),
    ({"url": "ftp://h/mcp"}, r"'url' must be an http:// or https:// address"),
    ({"url": "http://h/mcp", "headers": {"X": "a\r\nb"}}, r"the header 'X' is not a valid"),
    ({"type": "stdio"}, r"give either 'command' \(a program to start\) or 'url'"),
    ({"command": "x", "args": ["a"] * (MAX_ARGS + 1)}, rf"at most {MAX_ARGS} strings"),
    ({"command": "x" * (MAX_STRING_BYTES + 1)}, r"a string in 'command' is longer than 8 KiB"),
    ({"command": "x", "args": ["é" * (MAX_STRING_BYTES // 2 + 1)]}, r"in 'args' is longer"),
    ({"command": "x\u0000"}, r"a string in 'command' holds a NUL"),
    (["x"], r"must be an object such as"),
])
def test_a_bad_server_entry_is_refused_naming_the_server_and_field(entry, words):
    with pytest.raises(ToolConfigError, match="MCP server 'weather': .*" + words):
        parse_mcp_servers(servers(weather=entry))


@pytest.mark.parametrize(("text", "words"), [
    ('{"mcpServers": {', r"not valid JSON: .* at line 1, column"),
    ("[]", r"must be a JSON object"),
    ('{"servers": {}}', r"remove 'servers' \(VS Code's 'servers' is called 'mcpServers' here\)"),
    ('{"mcpServers": {}, "globalShortcut": ""}', r"reads only 'mcpServers' here; remove"),
    ('{"mcpServers": []}', r"'mcpServers' must be an object"),
    ('{"mcpServers": {"a": {"command": "x"}, "a": {"command": "y"}}}',
     r"the key 'a' is written twice"),
    ('{"mcpServers": {"a/b": {"command": "x"}}}', r"the server name 'a/b' must be 1 to 64"),
    ('{"mcpServers": {" a": {"command": "x"}}}', r"must not start or end with a space"),
    ("[" * 100_000 + "]" * 100_000, r"nests too deeply"),
])
def test_a_bad_document_is_refused_in_words(text, words):
    with pytest.raises(ToolConfigError, match=words):
        parse_mcp_servers(text)


def test_sizes_are_bounded_before_parsing():
    with pytest.raises(ToolConfigError, match="larger than 1024 KiB"):
        parse_mcp_servers(" " * (MAX_TEXT_BYTES + 1))
    many = servers(**{f"s{i}": {"command": "x"} for i in range(MAX_SERVERS + 1)})
    with pytest.raises(ToolConfigError, match=f"at most {MAX_SERVERS} can be"):
        parse_mcp_servers(many)
    with pytest.raises(ToolConfigError, match="must be 1 to 64"):
        parse_mcp_servers(servers(**{"n" * 65: {"command": "x"}}))


def test_a_config_made_in_code_is_checked_as_a_parsed_one():
    with pytest.raises(ToolConfigError, match="MCP server 'x': give either 'command'"):
        McpServerConfig("x")
    with pytest.raises(ToolConfigError, match="'args', 'env' and 'cwd' apply only"):
        McpServerConfig("x", url="http://h/mcp", env={"A": "1"})


# The catalog ----------------------------------------------------------------------------------

def tool(server: str, name: str) -> McpTool:
    return McpTool(server, name, f"{name} of {server}", {"type": "object"})


def test_a_unique_valid_tool_name_is_kept():
    catalog = ToolCatalog([tool("weather", "forecast"), tool("files", "read_file")])
    assert catalog.function_name("weather", "forecast") == "forecast"
    assert catalog.resolve("read_file") == tool("files", "read_file")


def test_tools_of_one_name_on_two_servers_are_prefixed_with_their_server():
    catalog = ToolCatalog([tool("web", "search"), tool("docs", "search"), tool("web", "fetch")])
    assert catalog.function_name("web", "search") == "web_search"
    assert catalog.function_name("docs", "search") == "docs_search"
    assert catalog.function_name("web", "fetch") == "fetch"
    assert catalog.resolve("docs_search").server == "docs"


def test_invalid_characters_become_underscores():
    catalog = ToolCatalog([tool("my server", "get.weather")])
    assert catalog.function_name("my server", "get.weather") == "my_server_get_weather"


def test_long_names_are_cut_with_a_hash_and_stay_unique():
    long_a, long_b = "x" * 70 + "a", "x" * 70 + "b"
    catalog = ToolCatalog([tool("s", long_a), tool("s", long_b)])
    names = catalog.function_names()
    assert len(set(names)) == 2
    assert all(OPENAI_NAME.match(name) for name in names)
    assert catalog.resolve(catalog.function_name("s", long_b)).name == long_b


def test_a_prefixed_name_never_takes_another_tools_own_name():
    catalog = ToolCatalog([tool("a", "b_c"), tool("a_b", "c"), tool("x", "c")])
    names = catalog.function_names()
    assert "b_c" in names and len(set(names)) == 3
    assert all(OPENAI_NAME.match(name) for name in names)


def test_names_and_order_do_not_depend_on_the_order_servers_answered():
    tools = [tool("web", "search"), tool("docs", "search"), tool("web", "fetch"),
             tool("my server", "get.weather")]
    one, other = ToolCatalog(tools), ToolCatalog(reversed(tools))
    assert one.specs() == other.specs()
    assert one.function_names() == other.function_names()


def test_specs_carry_description_and_schema_for_the_backend():
    catalog = ToolCatalog([tool("weather", "forecast"), McpTool("clock", "now", "", {})])
    assert catalog.specs() == (
        ToolSpec("now", "", {"type": "object", "properties": {}}),
        ToolSpec("forecast", "forecast of weather", {"type": "object"}),
    )


def test_a_made_up_function_name_is_refused_listing_the_real_ones():
    catalog = ToolCatalog([tool("weather", "forecast")])
    with pytest.raises(UnknownToolError, match="no tool named 'forcast'; the tools are: forecast"):
        catalog.resolve("forcast")


# A tool's reply as text -----------------------------------------------------------------------

def test_text_blocks_are_joined_and_an_image_is_named_with_its_size():
    result = mcp_types.CallToolResult(content=[
        mcp_types.TextContent(text="line one"),
        mcp_types.ImageContent(data="iVBORw0KGgo=", mime_type="image/png"),
        mcp_types.TextContent(text="line two")])
    assert tool_result(result).text == "line one\n[image: image/png, 8 bytes]\nline two"


def test_structured_content_alone_is_given_as_json():
    result = mcp_types.CallToolResult(content=[], structured_content={"temp": 21.5})
    assert tool_result(result).text == '{"temp": 21.5}'


def test_an_error_result_is_marked():
    result = mcp_types.CallToolResult(content=[mcp_types.TextContent(text="no")], is_error=True)
    assert tool_result(result).is_error


def test_a_long_reply_is_cut_with_a_note():
    result = mcp_types.CallToolResult(content=[mcp_types.TextContent(text="y" * 1000)])
    text = tool_result(result, max_chars=100).text
    assert text.startswith("y" * 100 + "\n[cut: the reply was 1000 characters; the first 100")


# A server's log ---------------------------------------------------------------------------------

def test_the_log_keeps_only_the_last_lines_within_its_bounds():
    ring = LogRing(max_lines=3, max_chars=1000)
    ring.write("one\ntwo\nthree\nfour\nfi")
    ring.write("ve\n")
    assert ring.text() == "three\nfour\nfive"
    by_chars = LogRing(max_lines=100, max_chars=10)
    by_chars.write("aaaa\nbbbb\ncccc\n")
    assert by_chars.text() == "bbbb\ncccc"


def test_an_endless_line_is_cut_instead_of_held():
    ring = LogRing()
    ring.write("x" * (MAX_LINE_CHARS * 3))
    assert all(len(line) <= MAX_LINE_CHARS + 2 for line in ring.text().split("\n"))


def test_the_last_line_is_one_the_server_wrote_since_its_latest_start():
    ring = LogRing()
    ring.note("[pagoda] starting 'srv' with 0 arguments")
    ring.write("listening\n")
    ring.note("[pagoda] stopped")
    assert ring.last_line() == "listening"
    ring.note("[pagoda] starting 'srv' with 0 arguments")
    assert ring.last_line() == ""
