"""Server-sent events, as OpenAI-compatible servers stream them: the data of each event."""

from __future__ import annotations

from collections.abc import AsyncIterator


async def sse_data(lines: AsyncIterator[str]) -> AsyncIterator[str]:
    """The `data` of each event, its lines joined with newlines.

    Comment lines (": ping", a keep-alive) and the other fields (event, id, retry) are skipped;
    a blank line ends an event, and so does the end of the stream.
    """
    data: list[str] = []
    async for line in lines:
        if not line:
            if data:
                yield "\n".join(data)
                data = []
            continue
        field, _, value = line.partition(":")
        if field == "data":
            data.append(value.removeprefix(" "))
    if data:
        yield "\n".join(data)
