"""Running the API: a checked bind address, and uvicorn in the foreground or on its own thread."""

from __future__ import annotations

import asyncio
import gc
import signal
import socket
import threading
import time

import uvicorn
from fastapi import FastAPI

from pagoda.engine.errors import PagodaError
from pagoda.engine.server.connections import ConnectionLimits
from pagoda.engine.server.security import is_loopback

# How long a stopping server lets its aborted replies send their last chunk.
DRAIN_SECONDS = 5.0


class ServeError(PagodaError):
    """The server cannot start where it was asked to. `errno` is the OS's reason, when there
    was one (errno.EADDRINUSE: another program has the port)."""

    def __init__(self, message: str, errno: int | None = None) -> None:
        super().__init__(message)
        self.errno = errno


class BindRefused(ServeError, ValueError):
    """Serving on a reachable address without an API key."""


def settle_the_heap() -> None:
    """Once the model has loaded: collect once, then keep every object alive now (torch's, the
    model's, the tokenizer's: hundreds of thousands) out of all later collections, as vLLM's
    engine does. A serving process allocates per request and per token, and each collection
    that reaches the older generations scans them all with the GIL held. In a 32-stream
    bench/server.py run on the default model (its clients' process and the load counted too)
    the collector's share of samples fell from ~3.0% to ~2.3%."""
    gc.collect()
    gc.freeze()


def check_bind_address(host: str, api_key: str | None) -> None:
    """Only this machine may reach a server without a key."""
    if not is_loopback(host) and not api_key:
        raise BindRefused(
            f"refusing to serve on {host} without an API key: any machine that can reach this "
            "address could use the model. Pass --api-key KEY (or set PAGODA_API_KEY), or bind "
            "127.0.0.1 to serve this machine only")


def bind(host: str, port: int) -> socket.socket:
    """A listening socket; port 0 picks a free one (read it back with getsockname)."""
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    # IPPROTO_TCP named, not 0: asyncio turns Nagle off (TCP_NODELAY) only on sockets that say
    # they are TCP. Without it a keep-alive client waits ~40 ms (delayed ACK) on every answer.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as exc:
        sock.close()
        raise ServeError(f"cannot listen on {host}:{port}: {exc.strerror} (another program "
                         "may be using that port: choose another)", exc.errno) from None
    sock.listen(2048)
    return sock


def _loop_factory():
    """uvloop where it is installed (its callbacks and socket writes cost a fraction of
    asyncio's, which shows at dozens of streams); asyncio's own loop otherwise."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def _serve(server: uvicorn.Server, sock: socket.socket) -> None:
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        runner.run(server.serve(sockets=[sock]))


class _Server(uvicorn.Server):
    """uvicorn's server, stopping so that no reply is cut and nothing is logged.

    On a stop (SIGINT, SIGTERM, `should_exit`) it stops accepting, ends the app's requests in
    the engine (each stream then sends its last chunk, finish_reason "abort", and [DONE]),
    gives them `DRAIN_SECONDS` to be sent, and then drops the connections still open (a client
    that reads nothing). uvicorn's own stop would wait, then cancel the tasks and log each
    CancelledError's traceback.
    """

    def __init__(self, config: uvicorn.Config, app: FastAPI) -> None:
        super().__init__(config)
        self._app = app

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for server in self.servers:
            server.close()
        end_requests = getattr(self._app.state, "end_requests", None)
        if end_requests is not None:
            end_requests()
        await self._drain()
        await super().shutdown(sockets)

    async def _drain(self) -> None:
        deadline = time.monotonic() + DRAIN_SECONDS
        while self.server_state.tasks and not self.force_exit and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        if self.server_state.tasks:
            for connection in list(self.server_state.connections):
                connection.transport.abort()  # its request sees a disconnect and ends


def _server(app: FastAPI, limits: ConnectionLimits) -> uvicorn.Server:
    config = uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False,
                            timeout_graceful_shutdown=2, http=limits.protocol(), ws="none")
    return _Server(config, app)


def serve_forever(app: FastAPI, sock: socket.socket,
                  limits: ConnectionLimits | None = None) -> None:
    """Serve until interrupted (Ctrl-C or SIGTERM): a clean stop, not an error."""
    # uvicorn shuts down on either signal, then raises it again for the handler it found: make
    # that one end the run quietly, so the caller still shuts the engine down and exits 0.
    previous = signal.signal(signal.SIGTERM, _stop_quietly)
    try:
        _serve(_server(app, limits or ConnectionLimits()), sock)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)


def _stop_quietly(_signum, _frame) -> None:
    raise KeyboardInterrupt


class ServerThread:
    """The API on a daemon thread with its own event loop: the app's server, and tests'."""

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0,
                 limits: ConnectionLimits | None = None) -> None:
        self.app = app
        self._sock = bind(host, port)
        self.host, self.port = self._sock.getsockname()[:2]
        self._server = _server(app, limits or ConnectionLimits())
        # uvicorn installs signal handlers only on the main thread; this one is not.
        self._thread = threading.Thread(target=self._run, name="pagoda-api", daemon=True)
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self, timeout: float = 10.0) -> ServerThread:
        self._thread.start()
        for _ in range(int(timeout / 0.01)):
            if self._server.started or self._error is not None or not self._thread.is_alive():
                break
            time.sleep(0.01)
        if not self._server.started:
            self.stop()
            raise RuntimeError(f"the API server did not start: {self._error!r}")
        return self

    def stop(self, timeout: float = DRAIN_SECONDS + 5.0) -> None:
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout)
        self._sock.close()

    def _run(self) -> None:
        try:
            _serve(self._server, self._sock)
        except BaseException as exc:  # noqa: BLE001 - reported by start()
            self._error = exc
