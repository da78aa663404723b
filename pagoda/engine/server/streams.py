"""Running a request's choices as engine streams: merged in arrival order, aborted on disconnect."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from starlette.requests import Request

from pagoda.engine.outputs import RequestOutput

_DONE = object()


class ClientDisconnected(Exception):
    """The client went away before its reply was complete."""


async def merge(streams: Sequence[AsyncIterator[RequestOutput]],
                ) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Outputs of several streams as they come, tagged with the stream's index.

    Each stream is read by its own task, so closing this generator (the client went away) cancels
    them and the engine aborts every request at once, freeing their KV blocks.
    """
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(index: int, stream: AsyncIterator[RequestOutput]) -> None:
        try:
            async for out in stream:
                queue.put_nowait((index, out))
        except Exception as exc:  # noqa: BLE001 - handed to the reader, who raises it
            queue.put_nowait((index, exc))
        finally:
            queue.put_nowait((index, _DONE))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(tasks)
        while remaining:
            index, item = await queue.get()
            if item is _DONE:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def tagged(stream: AsyncIterator[RequestOutput]) -> AsyncIterator[tuple[int, RequestOutput]]:
    """One stream's outputs tagged as choice 0, read by whoever reads this: closing it (the
    client went away) closes the stream, which aborts the request."""
    try:
        async for out in stream:
            yield 0, out
    finally:
        await stream.aclose()


async def peek(stream: AsyncIterator[Any]) -> tuple[Any, AsyncIterator[Any]]:
    """The first item (raising what the request raised) and a stream that yields it again."""
    first = await anext(stream)

    async def replay() -> AsyncIterator[Any]:
        try:
            yield first
            async for item in stream:
                yield item
        finally:
            await stream.aclose()

    return first, replay()


async def until_disconnected(request: Request, work: Callable[[], Any]) -> Any:
    """Await `work()` unless the client disconnects first; then cancel it (aborting its
    requests) and raise ClientDisconnected."""
    task = asyncio.ensure_future(work())
    watcher = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    if task in done:
        return task.result()
    raise ClientDisconnected


async def _wait_for_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
