"""Tools for the model from MCP servers (Model Context Protocol), configured as Claude Desktop,
Cursor and LM Studio configure them. Plain Python, no Qt: the window's Settings → Tools panel and
the chat session use it.

    config      McpServerConfig, parse_mcp_servers, mcp_servers_json: the {"mcpServers": ...} JSON
    catalog     McpTool, ToolCatalog: model-facing function names, ToolSpecs for a ChatRequest
    hub         McpHub: the servers' sessions on a thread of their own; EnabledTools
    data        ServerStatus, ToolResult
    errors      ToolError and its kinds

Importing this package does not import the MCP SDK; McpHub's thread does.
"""

from pagoda.app.components.tools.catalog import McpTool, ToolCatalog
from pagoda.app.components.tools.config import McpServerConfig, mcp_servers_json, parse_mcp_servers
from pagoda.app.components.tools.data import ServerStatus, ToolResult
from pagoda.app.components.tools.errors import (
    ToolConfigError,
    ToolError,
    ToolServerError,
    ToolTimeoutError,
    UnknownToolError,
)
from pagoda.app.components.tools.hub import EnabledTools, McpHub

__all__ = [
    "EnabledTools",
    "McpHub",
    "McpServerConfig",
    "McpTool",
    "ServerStatus",
    "ToolCatalog",
    "ToolConfigError",
    "ToolError",
    "ToolResult",
    "ToolServerError",
    "ToolTimeoutError",
    "UnknownToolError",
    "mcp_servers_json",
    "parse_mcp_servers",
]
