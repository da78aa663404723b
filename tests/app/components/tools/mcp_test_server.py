"""A real MCP server for the tests of pagoda.app.components.tools, written with the SDK's MCPServer.

    python tests/app/components/tools/mcp_test_server.py      # serves over stdio

Tools: add, echo, fail (raises: the client sees isError), hang (sleeps, cancellable), freeze
(blocks the server's event loop: a hung server), log (a line on stderr), pid, clock (this
process's monotonic clock when the call arrived, for the latency bench), picture (an image).

With MCP_TEST_EXIT set, the server writes that text on stderr and exits with code 3 before it
reads anything: a server that will not start. `build_server()` gives the same server to run over
streamable HTTP in the test process.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

from mcp.server.mcpserver import Image, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

EXIT_AT_START_ENV = "MCP_TEST_EXIT"
EXIT_AT_START_CODE = 3
# The smallest valid PNG (1x1, transparent): 67 bytes.
PNG_1X1 = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000a49444154789c63000100000500010d0a2db40000000049454e44ae426082")


def build_server() -> MCPServer:
    """The test server, its tools registered."""
    server = MCPServer("pagoda-test", log_level="WARNING")

    @server.tool(description="Add two integers.")
    def add(a: int, b: int) -> int:
        return a + b

    @server.tool(description="Say the text back.")
    def echo(text: str) -> str:
        return text

    @server.tool(description="Always fails.")
    def fail() -> str:
        raise ToolError("it failed on purpose")

    @server.tool(description="Sleep for some seconds, then say so.")
    async def hang(seconds: float) -> str:
        await asyncio.sleep(seconds)
        return f"slept {seconds} s"

    @server.tool(description="Block the whole server for some seconds.")
    async def freeze(seconds: float) -> str:
        time.sleep(seconds)  # noqa: ASYNC251 - blocking the server's loop is the point
        return f"froze {seconds} s"

    @server.tool(description="Write a line on the server's stderr.")
    def log(text: str) -> str:
        print(text, file=sys.stderr, flush=True)
        return "logged"

    @server.tool(description="The server's process id.")
    def pid() -> int:
        return os.getpid()

    @server.tool(description="The server's monotonic clock when the call arrived.")
    async def clock() -> float:
        return time.monotonic()

    @server.tool(description="A text of this many mebibytes, on one line of JSON-RPC.")
    def big(mebibytes: float) -> str:
        return "x" * int(mebibytes * 1024 * 1024)

    @server.tool(description="A 1x1 PNG.")
    def picture() -> Image:
        return Image(data=PNG_1X1, format="png")

    return server


def main() -> None:
    message = os.environ.get(EXIT_AT_START_ENV)
    if message:
        print(message, file=sys.stderr, flush=True)
        sys.exit(EXIT_AT_START_CODE)
    build_server().run("stdio")


if __name__ == "__main__":
    main()
