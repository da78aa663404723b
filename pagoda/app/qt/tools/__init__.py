"""Settings → Tools: the MCP servers' dialog and its forms."""
