"""One MCP server's session: its transport (stdio, HTTP), its log, how a call failed, its results."""
