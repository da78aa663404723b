"""A stdio server's connection for mcp.Client: its process, and its stdout read as one JSON-RPC
message a line, in time linear in the bytes read, each message bounded to MAX_MESSAGE_BYTES.

The SDK's stdio_client joins a line's text so far to each new piece of it, so a long line costs
the square of its length (a 40 MB tool result took 38 CPU-seconds, 100 MB 234 s), and it bounds
nothing. Here a line's pieces are joined once; a line over the bound is read on without being
kept: a reply over it reaches its caller as an error giving its size, and anything else over it
is said in the server's log.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from typing import TextIO

import anyio
import mcp.types as mcp_types
from anyio.abc import ObjectReceiveStream, ObjectSendStream
from mcp.client.stdio import get_default_environment
from mcp.shared.message import SessionMessage
from pydantic import ValidationError

from pagoda.app.components.tools.config import McpServerConfig

MiB = 1024 * 1024
MAX_MESSAGE_BYTES = 16 * MiB  # far past what a chat model reads of a result (64 KiB of text)
EDGE_BYTES = 256              # kept of each end of a line over the bound: where its id is
EXIT_WAIT_S = 2.0             # for a server to leave once its stdin closes, before it is killed
# The error its caller gets for a reply refused for its size: a server error code, and data
# that tells it from a server's own error of that code.
REPLY_TOO_LARGE_CODE = -32099
REPLY_TOO_LARGE = {"pagoda": "reply too large"}

_ID = rb'(-?\d+|"(?:[^"\\]|\\.)*")'
# {"jsonrpc": "2.0", "id": 7, "result": … (the Python SDK's order) …
_ID_FIRST = re.compile(rb'\A\s*\{\s*(?:"jsonrpc"\s*:\s*"2\.0"\s*,\s*)?"id"\s*:\s*' + _ID
                       + rb'\s*,\s*"(?:result|error)"')
# … or {"result": …, "id": 7} (the id last)
_REPLY_START = re.compile(rb'\A\s*\{\s*(?:"jsonrpc"\s*:\s*"2\.0"\s*,\s*)?"(?:result|error)"')
_ID_LAST = re.compile(rb'[,{]\s*"id"\s*:\s*' + _ID + rb'\s*\}\s*\Z')

Stream = tuple[ObjectReceiveStream[SessionMessage | Exception], ObjectSendStream[SessionMessage]]


@dataclass(slots=True, frozen=True)
class OversizedLine:
    """A line longer than the bound: its length in bytes, and its first and last bytes."""

    size: int
    head: bytes
    tail: bytes


class LineSplitter:
    """Bytes in, whole lines out (without their newline), each new byte looked at once. A line
    over `max_bytes` is not kept: it comes out as an OversizedLine."""

    def __init__(self, max_bytes: int) -> None:
        self._max_bytes = max_bytes
        self._pieces: list[bytes] = []
        self._size = 0
        self._head = self._tail = b""

    def feed(self, chunk: bytes) -> list[bytes | OversizedLine]:
        lines: list[bytes | OversizedLine] = []
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            self._add(chunk[start:end])
            lines.append(self._take())
            start = end + 1
        self._add(chunk[start:])
        return lines

    def _add(self, piece: bytes) -> None:
        if not piece:
            return
        self._size += len(piece)
        if self._size <= self._max_bytes:
            self._pieces.append(piece)
        elif self._pieces or not self._head:  # the line just went over: keep its two ends
            kept = b"".join([*self._pieces, piece])
            self._pieces = []
            self._head, self._tail = kept[:EDGE_BYTES], kept[-EDGE_BYTES:]
        else:
            self._tail = (self._tail + piece[-EDGE_BYTES:])[-EDGE_BYTES:]

    def _take(self) -> bytes | OversizedLine:
        line: bytes | OversizedLine
        if self._size > self._max_bytes:
            line = OversizedLine(self._size, self._head, self._tail)
        else:
            line = b"".join(self._pieces)
        self._pieces, self._size, self._head, self._tail = [], 0, b"", b""
        return line


def reply_id(line: OversizedLine) -> int | str | None:
    """The id of the reply `line` holds, read from its ends; None: it is not a reply, or its id
    is not at either end."""
    found = _ID_FIRST.match(line.head)
    if found is None and _REPLY_START.match(line.head):
        found = _ID_LAST.search(line.tail)
    return json.loads(found.group(1)) if found is not None else None


def too_large_reply(line: OversizedLine, max_bytes: int) -> SessionMessage | None:
    """The error its caller gets in place of a reply over the bound (None: not a reply)."""
    request_id = reply_id(line)
    if request_id is None:
        return None
    return SessionMessage(too_large_error(request_id, (
        f"the server's reply was {line.size / MiB:.1f} MiB, more than the "
        f"{max_bytes / MiB:g} MiB Pagoda reads of one reply: it was not read")))


def too_large_error(request_id: int | str, words: str) -> mcp_types.JSONRPCError:
    """The JSON-RPC error the call `request_id` gets for a reply refused for its size."""
    error = mcp_types.ErrorData(code=REPLY_TOO_LARGE_CODE, data=REPLY_TOO_LARGE, message=words)
    return mcp_types.JSONRPCError(jsonrpc="2.0", id=request_id, error=error)


def parsed(line: bytes | OversizedLine, max_bytes: int,
           note: Callable[[str], None]) -> SessionMessage | Exception | None:
    """The message a line holds; a line that holds none is said in the server's log (None)."""
    if isinstance(line, OversizedLine):
        refused = too_large_reply(line, max_bytes)
        if refused is None:
            note(f"[pagoda] the server wrote a message of {line.size / MiB:.1f} MiB, more than "
                 f"the {max_bytes / MiB:g} MiB Pagoda reads of one: it was not read")
        return refused
    if not line.strip():
        return None
    try:
        return SessionMessage(mcp_types.jsonrpc_message_adapter.validate_json(line))
    except ValidationError as exc:
        text = line[:80].decode("utf-8", "replace")
        note(f"[pagoda] the server wrote a line that is not a JSON-RPC message: {text}")
        return exc


@asynccontextmanager
async def stdio_streams(config: McpServerConfig, errlog: TextIO, note: Callable[[str], None],
                        on_process: Callable[[int], None],
                        max_message_bytes: int = MAX_MESSAGE_BYTES) -> AsyncIterator[Stream]:
    """Start `config`'s command, its stderr into `errlog`; the streams mcp.Client reads and
    writes. `on_process` hears the process id as soon as it runs; leaving closes the server's
    stdin, waits EXIT_WAIT_S for it to leave, then kills its process tree."""
    process = await _spawn(config, errlog)
    on_process(process.pid)
    incoming_writer, incoming = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    outgoing, outgoing_reader = anyio.create_memory_object_stream[SessionMessage](0)
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(_read, process, incoming_writer, note, max_message_bytes)
        tasks.start_soon(_write, process, outgoing_reader, incoming_writer)
        try:
            yield incoming, outgoing
        finally:
            with anyio.CancelScope(shield=True):
                await _stop(process)
            tasks.cancel_scope.cancel()
    for stream in (incoming, outgoing, incoming_writer, outgoing_reader):
        await stream.aclose()


async def _spawn(config: McpServerConfig, errlog: TextIO):
    """The server's process, in a process group (POSIX) or job (Windows) of its own, with the
    SDK's short list of inherited environment variables and the configured `env` over them."""
    env = get_default_environment() | dict(config.env)
    if sys.platform == "win32":
        from mcp.os.win32.utilities import create_windows_process, get_windows_executable_command
        command = await anyio.to_thread.run_sync(get_windows_executable_command, config.command)
        return await create_windows_process(command, list(config.args), env, errlog, config.cwd)
    return await anyio.open_process([config.command, *config.args], env=env, stderr=errlog,
                                    cwd=config.cwd, start_new_session=True)


async def _read(process, sink: ObjectSendStream[SessionMessage | Exception],
                note: Callable[[str], None], max_bytes: int) -> None:
    """The server's stdout, a message a line, into `sink`; once the session has gone, read on
    (and drop) until the server closes it, so that a server writing a long reply can leave."""
    splitter = LineSplitter(max_bytes)
    delivering = True
    async with sink:
        with suppress(anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError,
                      OSError):
            while True:
                for line in splitter.feed(await process.stdout.receive()):
                    message = parsed(line, max_bytes, note)
                    if message is None or not delivering:
                        continue
                    try:
                        await sink.send(message)
                    except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                        delivering = False


async def _write(process, source: ObjectReceiveStream[SessionMessage],
                 sink: ObjectSendStream[SessionMessage | Exception]) -> None:
    """The session's messages to the server's stdin, a line each; when the server takes no
    more, the session is told its connection ended (its calls fail, rather than wait)."""
    async with source:
        try:
            async for message in source:
                text = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                await process.stdin.send((text + "\n").encode())
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            await sink.aclose()


async def _stop(process) -> None:
    """Close the server's stdin, give it EXIT_WAIT_S to leave, then kill its process tree."""
    with suppress(anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
        await process.stdin.aclose()
    with anyio.move_on_after(EXIT_WAIT_S):
        while process.returncode is None:
            await anyio.sleep(0.01)
    if process.returncode is None:
        await _kill_tree(process)
    with suppress(anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
        await process.stdout.aclose()


async def _kill_tree(process) -> None:
    if sys.platform == "win32":
        from mcp.os.win32.utilities import close_process_job, terminate_windows_process_tree
        await terminate_windows_process_tree(process)
        close_process_job(process)
    else:
        from mcp.os.posix.utilities import terminate_posix_process_tree
        await terminate_posix_process_tree(process, EXIT_WAIT_S)
