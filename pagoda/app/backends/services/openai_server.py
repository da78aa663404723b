"""The window's engine served over OpenAI's API to other apps on this computer (pagoda.engine.server),
on a thread of its own: what pagoda.app.components.server.local_server turns on and off.

Importing the server takes fastapi and uvicorn (not light): each function here imports it on the
caller's worker thread, under ENGINE_IMPORT_LOCK the first time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from pagoda.app.backends.protocol import ChatBackend
from pagoda.app.backends.services.engine_import import ENGINE_IMPORT_LOCK

if TYPE_CHECKING:
    from pagoda.engine.server.runner import ServerThread
    from pagoda.engine.server.served import ServedModel


class PortUnavailableError(Exception):
    """The port is taken by another program, or not ours to bind."""


def key_digest(key: str) -> str:
    """What the server keeps of an API key (it checks requests against the digest)."""
    with ENGINE_IMPORT_LOCK:
        from pagoda.engine.server.security import key_digest as digest
    return digest(key)


def served_model(backend: ChatBackend) -> ServedModel | None:
    """The model the server answers with through `backend`; None when its replies are written
    elsewhere (a remote server): there is no engine here to serve."""
    from pagoda.app.backends.chat.local import (
        LocalBackend,  # imported with the engine behind `backend`
    )

    if not isinstance(backend, LocalBackend):
        return None
    from pagoda.engine.server.served import ServedModel

    return ServedModel(backend.model_name, backend.engine, backend.max_model_len,
                       created=backend.engine.model_created)


def start_server(served: Callable[[], ServedModel | None], api_key_sha256: str | None,
                 host: str, port: int) -> ServerThread:
    """Serve `served()` (looked up on every request: None answers 503) on host:port, with a key
    when a digest is given. Raises PortUnavailableError, or the engine's error in its words."""
    with ENGINE_IMPORT_LOCK:
        from pagoda.engine.server.api import ServerSettings, build_app
        from pagoda.engine.server.runner import ServeError, ServerThread
    app = build_app(served, ServerSettings(api_key_sha256=api_key_sha256))
    try:
        return ServerThread(app, host, port).start()
    except ServeError as error:
        raise PortUnavailableError(str(error)) from error


def running_requests(thread: ServerThread) -> int:
    """The requests the server is answering now."""
    from pagoda.engine.server.api import running_requests as running  # imported by start_server

    return running(thread.app)
