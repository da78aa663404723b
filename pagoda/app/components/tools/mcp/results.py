"""A tool's reply as the text the model reads next.

Text blocks are joined by newlines; what a chat model cannot read (an image, audio, a binary
resource) is named in brackets with its type and size. A reply with no content but structured
content is that content as JSON (a reply with both carries the JSON in its text already, as the
MCP spec asks). The text is cut at MAX_RESULT_CHARS with a note saying so.
"""

from __future__ import annotations

import json

import mcp.types as mcp_types

from pagoda.app.components.tools.data import ToolResult

MAX_RESULT_CHARS = 64 * 1024


def tool_result(result: mcp_types.CallToolResult, max_chars: int = MAX_RESULT_CHARS) -> ToolResult:
    """The model-facing text of a CallToolResult, bounded to `max_chars`."""
    parts = [_block_text(block) for block in result.content]
    if not parts and result.structured_content is not None:
        parts = [json.dumps(result.structured_content, ensure_ascii=False)]
    return ToolResult(bounded_text("\n".join(parts), max_chars), bool(result.is_error))


def bounded_text(text: str, max_chars: int = MAX_RESULT_CHARS) -> str:
    """`text`, or its first `max_chars` characters and a note giving the whole length."""
    if len(text) <= max_chars:
        return text
    return (text[:max_chars]
            + f"\n[cut: the reply was {len(text)} characters; the first {max_chars} are shown]")


def _block_text(block: mcp_types.ContentBlock) -> str:
    if isinstance(block, mcp_types.TextContent):
        return block.text
    if isinstance(block, mcp_types.ImageContent | mcp_types.AudioContent):
        return f"[{block.type}: {block.mime_type}, {_base64_size(block.data)} bytes]"
    if isinstance(block, mcp_types.EmbeddedResource):
        return _resource_text(block.resource)
    if isinstance(block, mcp_types.ResourceLink):
        return f"[resource link: {block.uri}]"
    return f"[{getattr(block, 'type', 'unknown')} content]"


def _resource_text(
        resource: mcp_types.TextResourceContents | mcp_types.BlobResourceContents) -> str:
    if isinstance(resource, mcp_types.TextResourceContents):
        return resource.text
    mime = resource.mime_type or "application/octet-stream"
    return f"[resource {resource.uri}: {mime}, {_base64_size(resource.blob)} bytes]"


def _base64_size(data: str) -> int:
    """The decoded size of base64 text, without decoding it."""
    stripped = data.strip()
    return len(stripped) * 3 // 4 - stripped[-2:].count("=")
