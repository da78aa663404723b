"""The app's local server: the window's own engine behind the OpenAI API on 127.0.0.1, so API
clients and tabs batch together in one engine."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Protocol, TypeVar

from pagoda.app.backends import ChatBackend, ModelLoadingError
from pagoda.app.backends.services.local_engine import EngineError
from pagoda.app.backends.services.openai_server import (
    PortUnavailableError,
    running_requests,
    served_model,
    start_server,
)
from pagoda.app.components.server.api_key import ApiKeyError, ApiKeyFile
from pagoda.app.components.shared.view_models import LocalServerView

if TYPE_CHECKING:
    from pagoda.app.backends.services.openai_server import ServedModel, ServerThread

logger = logging.getLogger(__name__)

LOCAL_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
T = TypeVar("T")


class EngineHost(Protocol):
    """What the server asks of the window's engine host (qt.engine_host.EngineHost, in the
    room above): the backend a request starts on now."""

    def backend_for_new_request(self) -> ChatBackend:
        """Raises ModelLoadingError while there is none."""


class LocalServer:
    """Serves the host's engine on 127.0.0.1:`port` while on; thread-safe.

    The model behind the API is looked up on every request (`served`): while the host loads a
    model, or an old engine shuts down, there is none and requests get 503. The API serves the
    engine itself, the one behind the host's LocalBackend, so its requests and the tabs' batch
    together. A key, when one is set, is read from `key_file` at each start. A failed start
    leaves the server off and says why in `error`.

    `turn_on`, `turn_off`, `new_key` and `remove_key` wait on sockets and threads: they run, in
    the order called, on the server's own worker thread.
    """

    def __init__(self, host: EngineHost, key_file: ApiKeyFile, port: int = DEFAULT_PORT) -> None:
        self.key_file = key_file
        self.port = port
        self.error = ""
        self._host = host
        self._thread: ServerThread | None = None
        self._key_set = key_file.is_set()
        self._lock = threading.Lock()
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pagoda-server")

    # -- what it serves --------------------------------------------------------------------------

    def served(self) -> ServedModel | None:
        """The model to answer a request with now; None while none can take one."""
        try:
            backend = self._host.backend_for_new_request()
        except ModelLoadingError:
            return None
        return served_model(backend)

    @property
    def is_running(self) -> bool:
        return self._thread is not None

    @property
    def address(self) -> str | None:
        thread = self._thread
        return thread.url if thread is not None else None

    @property
    def running_requests(self) -> int:
        thread = self._thread
        return 0 if thread is None else running_requests(thread)

    def view(self) -> LocalServerView:
        return LocalServerView(port=self.port, address=self.address,
                               running_requests=self.running_requests, error=self.error,
                               key_set=self._key_set)

    # -- on and off, here and now ----------------------------------------------------------------

    def start(self) -> bool:
        """(Re)start on `port`; False when it could not, with the reason in `error`."""
        with self._lock:  # on the server's worker thread: the first start imports fastapi
            self._stop()
            try:
                self._thread = start_server(self.served, self.key_file.digest(), LOCAL_HOST,
                                            self.port)
            except PortUnavailableError as error:
                logger.warning("local server: %s", error)
                self.error = (f"Port {self.port} is in use by another program (or not allowed): "
                              "choose another port.")
                return False
            except (EngineError, ApiKeyError, RuntimeError) as error:
                logger.warning("local server: %s", error)
                self.error = f"The local server did not start: {error}"
                return False
            self.error = ""
            logger.info("local server on %s", self._thread.url)
            return True

    def stop(self) -> None:
        with self._lock:
            self._stop()

    def _stop(self) -> None:
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.stop()
            logger.info("local server on %s stopped", thread.url)

    def shutdown(self) -> None:
        """At exit: wait for pending work, then stop serving."""
        self._worker.shutdown(wait=True, cancel_futures=True)
        self.stop()

    # -- from the GUI's loop ---------------------------------------------------------------------

    async def turn_on(self, port: int | None = None) -> bool:
        """Serve (on `port` when given, restarting if it already serves elsewhere)."""
        if port is not None:
            self.port = port
        return await self._in_worker(self.start)

    async def turn_off(self) -> None:
        self.error = ""
        await self._in_worker(self.stop)

    async def move_to(self, port: int) -> None:
        """Use `port` from now on; a running server restarts there."""
        self.port = port
        if self.is_running:
            await self._in_worker(self.start)
        else:
            self.error = ""  # it was about the old port

    async def new_key(self) -> str:
        """A new key, which from now on every /v1 request needs; the old one stops working."""
        key = await self._in_worker(self.key_file.replace)
        await self._key_changed()
        return key

    async def remove_key(self) -> None:
        await self._in_worker(self.key_file.remove)
        await self._key_changed()

    async def _key_changed(self) -> None:
        # The key is part of the server's app: a running server restarts with the new one.
        # The view says the key changed only once the server checks the new one.
        if self.is_running:
            await self._in_worker(self.start)
        self._key_set = self.key_file.is_set()

    async def _in_worker(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._worker, fn)
