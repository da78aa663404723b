"""How long a tool call takes to reach its MCP server (target: < 50 ms), through McpHub.

Starts the tests' MCP server (tests/app/components/tools/mcp_test_server.py) over stdio, warms it up,
then times calls of its `clock` tool from an event loop other than the hub's, as the window's
calls go: "reach" is from just before `await hub.call_tool(...)` to the server's monotonic clock
when its tool ran (one clock for every process of a machine), "round trip" to the answer.
Not a test: results go to docs/BENCHMARKS.md.

    .venv/bin/python bench/mcp_call_latency.py [--calls 50]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

from cpu_info import cpu_name

from pagoda.app.components.tools import McpHub, McpServerConfig

TEST_SERVER = Path(__file__).resolve().parents[1] / "tests/app/components/tools/mcp_test_server.py"
WARM_UP_CALLS = 5
CALL_TIMEOUT_S = 10.0


async def timed_calls(hub: McpHub, calls: int) -> tuple[list[float], list[float]]:
    """Milliseconds until the server ran the tool, and until the answer came, per call."""
    reach, round_trip = [], []
    for _ in range(calls):
        sent = time.monotonic()
        result = await hub.call_tool("bench", "clock", {}, timeout_s=CALL_TIMEOUT_S)
        answered = time.monotonic()
        reach.append((float(result.text) - sent) * 1000)
        round_trip.append((answered - sent) * 1000)
    return reach, round_trip


async def measure(calls: int) -> tuple[list[float], list[float]]:
    hub = McpHub()
    try:
        hub.configure([McpServerConfig("bench", command=sys.executable, args=(str(TEST_SERVER),))])
        await hub.list_tools("bench")
        await timed_calls(hub, WARM_UP_CALLS)
        return await timed_calls(hub, calls)
    finally:
        await asyncio.to_thread(hub.close)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=50)
    args = parser.parse_args()
    reach, round_trip = asyncio.run(measure(args.calls))
    print(f"CPU: {cpu_name()}")
    print(f"{args.calls} calls of a running stdio MCP server, from another event loop:")
    print(f"  reach the server: median {statistics.median(reach):.2f} ms, max {max(reach):.2f} ms")
    print(f"  round trip:       median {statistics.median(round_trip):.2f} ms, "
          f"max {max(round_trip):.2f} ms")


if __name__ == "__main__":
    main()
