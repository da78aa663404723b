"""Saved connections to OpenAI-compatible servers, for the model picker.

A connection's address and model are one app setting in the database; its API key lives in the
system keyring (service "Pagoda", user = the connection's id), or, where there is none, in this
process's memory until Pagoda closes. A key never goes to the database, a log or a file.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from pagoda.app.backends.errors import (
    BackendError,
    MalformedStreamError,
    ModelNotFoundError,
    UnauthorizedError,
)
from pagoda.app.backends.remote.endpoint import CONNECT_TIMEOUT_S, Endpoint, api_base
from pagoda.app.backends.remote.openai_remote import OpenAIBackend
from pagoda.app.backends.remote.openai_request import Flavor, flavor_of
from pagoda.app.store import StoreError

logger = logging.getLogger(__name__)

CONNECTIONS_SETTING = "server_connections"
KEYRING_SERVICE = "Pagoda"
NO_KEYRING_NOTICE = ("No system keyring was found: the API key is kept in memory until Pagoda "
                     "closes, and must be entered again after that.")
# GET /models is answered at once by every server we know; a chat's 300 s would only hide a hang.
PROBE_RESPONSE_TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True)
class ServerConnection:
    """A saved server and the model to use there. `has_key`: an API key was given for it (the
    key itself is in ConnectionKeys)."""

    id: str
    base_url: str
    model: str
    has_key: bool

    @property
    def label(self) -> str:
        """The picker's entry: "llama-3-8b · gpu-box:8000"."""
        url = httpx.URL(self.base_url)
        host = f"[{url.host}]" if ":" in url.host else url.host
        port = url.port or (443 if url.scheme == "https" else 80)
        return f"{self.model} · {host}:{port}"


class KeyringLike(Protocol):
    """What ConnectionKeys uses of a keyring: the `keyring` module and its backends have it."""

    def get_password(self, service: str, username: str) -> str | None: ...
    def set_password(self, service: str, username: str, password: str) -> None: ...
    def delete_password(self, service: str, username: str) -> None: ...


class ConnectionKeys:
    """API keys by connection id, in the system keyring. With no usable keyring (none found, or
    one that fails when used) they stay in memory for this process only: `persistent` is then
    False and `notice` says so in words.

    keyring: the keyring to use (a test's fake); None looks for the system's.
    """

    def __init__(self, keyring: KeyringLike | None = None, *, system: bool = True) -> None:
        if keyring is None and system:
            keyring = _system_keyring()
        self._keyring = keyring
        self._memory: dict[str, str] = {}

    @classmethod
    def in_memory(cls) -> ConnectionKeys:
        """Keys for this process only, never the system keyring (benches, screenshots)."""
        return cls(system=False)

    @property
    def persistent(self) -> bool:
        return self._keyring is not None

    @property
    def notice(self) -> str | None:
        return None if self.persistent else NO_KEYRING_NOTICE

    def get(self, connection_id: str) -> str | None:
        if connection_id in self._memory or self._keyring is None:
            return self._memory.get(connection_id)
        try:
            return self._keyring.get_password(KEYRING_SERVICE, connection_id)
        except Exception as exc:  # noqa: BLE001 - any backend's failure (D-Bus, locked, ...)
            self._give_up(exc)
            return None

    def set(self, connection_id: str, key: str) -> None:
        if self._keyring is not None:
            try:
                self._keyring.set_password(KEYRING_SERVICE, connection_id, key)
                return
            except Exception as exc:  # noqa: BLE001 - see get
                self._give_up(exc)
        self._memory[connection_id] = key

    def delete(self, connection_id: str) -> None:
        """Forget the key; nothing happens when there is none."""
        self._memory.pop(connection_id, None)
        if self._keyring is None:
            return
        try:
            if self._keyring.get_password(KEYRING_SERVICE, connection_id) is not None:
                self._keyring.delete_password(KEYRING_SERVICE, connection_id)
        except Exception as exc:  # noqa: BLE001 - see get
            self._give_up(exc)

    def _give_up(self, exc: Exception) -> None:
        logger.warning("The system keyring failed (%s): API keys are kept in memory until "
                       "Pagoda closes.", type(exc).__name__)
        self._keyring = None


def _system_keyring() -> KeyringLike | None:
    """The system's keyring backend, or None when keyring found only its fail or null one."""
    try:
        import keyring
        from keyring.backends import fail, null

        backend = keyring.get_keyring()
    except Exception as exc:  # noqa: BLE001 - a broken keyring configuration is no keyring
        logger.warning("No usable system keyring (%s)", type(exc).__name__)
        return None
    if isinstance(backend, (fail.Keyring, null.Keyring)):
        logger.info("No system keyring: API keys are kept in memory until Pagoda closes.")
        return None
    return backend


class SettingsStore(Protocol):
    """The part of AsyncStore SavedConnections uses."""

    async def get_setting(self, key: str, default: Any = None) -> Any: ...
    async def set_setting(self, key: str, value: Any) -> None: ...


class SavedConnections:
    """The saved servers, in the order they were added, as the app setting
    CONNECTIONS_SETTING (a JSON list of {id, base_url, model, has_key}; no key). `await load()`
    once at start; `list()` and `get()` then answer from memory."""

    def __init__(self, db: SettingsStore, keys: ConnectionKeys) -> None:
        self.db = db
        self.keys = keys
        self._connections: list[ServerConnection] = []

    async def load(self) -> None:
        """Read the setting; an entry (or a whole setting) that is malformed is skipped and
        logged."""
        stored = await self.db.get_setting(CONNECTIONS_SETTING, [])
        if not isinstance(stored, list):
            logger.warning("Ignoring the setting %r: not a list", CONNECTIONS_SETTING)
            stored = []
        self._connections = [c for c in map(_from_setting, stored) if c is not None]

    def list(self) -> list[ServerConnection]:
        return list(self._connections)

    def get(self, connection_id: str) -> ServerConnection | None:
        return next((c for c in self._connections if c.id == connection_id), None)

    async def add(self, base_url: str, model: str, api_key: str | None) -> ServerConnection:
        """Save a connection (its key to ConnectionKeys). The same address and model again
        replaces the earlier one's key and keeps its id. Raises InvalidAddressError for an
        address that is not a server's, StoreError when the setting cannot be written."""
        url = api_base(base_url)
        if not model:
            raise ValueError("a connection needs a model")
        key = (api_key or "").strip()
        earlier = next((c for c in self._connections
                        if (c.base_url, c.model) == (url, model)), None)
        connection = ServerConnection(earlier.id if earlier else uuid.uuid4().hex, url, model,
                                      has_key=bool(key))
        if key:
            self.keys.set(connection.id, key)
        else:
            self.keys.delete(connection.id)
        self._connections = [c for c in self._connections if c is not earlier] + [connection]
        await self._save()
        return connection

    async def remove(self, connection_id: str) -> None:
        """Forget the connection and its key."""
        self._connections = [c for c in self._connections if c.id != connection_id]
        self.keys.delete(connection_id)
        await self._save()

    async def _save(self) -> None:
        await self.db.set_setting(CONNECTIONS_SETTING, [
            {"id": c.id, "base_url": c.base_url, "model": c.model, "has_key": c.has_key}
            for c in self._connections])


def _from_setting(entry: object) -> ServerConnection | None:
    try:
        connection = ServerConnection(entry["id"], api_base(entry["base_url"]), entry["model"],
                                      bool(entry.get("has_key", False)))
        if not all(isinstance(v, str) and v for v in (connection.id, connection.model)):
            raise TypeError("id and model must be non-empty text")
    except (TypeError, KeyError, AttributeError, BackendError) as exc:
        logger.warning("Ignoring a saved server connection that is malformed (%s): %r",
                       exc, entry)
        return None
    return connection


@dataclass(frozen=True, slots=True)
class ServerProbe:
    """What a server said about itself: its API address (normalised), the ids of the models it
    serves, in its order, and its kind ("vllm", "sglang", "pagoda", "llama.cpp", "openai")."""

    base_url: str
    models: tuple[str, ...]
    flavor: Flavor


async def probe_server(base_url: str, api_key: str | None, *,
                       connect_timeout: float = CONNECT_TIMEOUT_S,
                       response_timeout: float = PROBE_RESPONSE_TIMEOUT_S) -> ServerProbe:
    """Ask the server for its models (GET /models). Raises the BackendError of what went wrong,
    with its message in words: InvalidAddressError, BackendUnreachableError (nothing answers
    within `connect_timeout`), UnauthorizedError, ModelNotFoundError (no models listed),
    MalformedStreamError (not an OpenAI-compatible API), ..."""
    endpoint = Endpoint(base_url, api_key or None, connect_timeout=connect_timeout,
                        response_timeout=response_timeout)
    payload = await endpoint.get_json("models")
    data = payload.get("data") if isinstance(payload, dict) else None
    if not isinstance(data, list):
        raise MalformedStreamError(
            f"{endpoint.url} answered GET /models with something that is not a list of models. "
            "Is the address that of an OpenAI-compatible API (it usually ends in /v1)?")
    entries = [e for e in data if isinstance(e, dict) and isinstance(e.get("id"), str)]
    if not entries:
        raise ModelNotFoundError(f"{endpoint.url} serves no model yet (it may still be loading "
                                 "one): try again in a moment.")
    return ServerProbe(endpoint.url, tuple(e["id"] for e in entries),
                       flavor_of(entries[0].get("owned_by")))


def backend_for(connection: ServerConnection, keys: ConnectionKeys) -> OpenAIBackend:
    """The backend for a saved connection, with its key. Nothing is sent yet: the first reply
    or count asks the server about the model (or `await backend.connect()` to check at once);
    `backend.shutdown()` when it is no longer used. Raises UnauthorizedError when the key was
    kept in memory only and Pagoda has restarted since."""
    key = keys.get(connection.id) if connection.has_key else None
    if connection.has_key and key is None:
        raise UnauthorizedError(
            f"The API key for {connection.label} is not known any more (with no system keyring "
            "it is kept only until Pagoda closes): add the server again with its key.")
    return OpenAIBackend(connection.base_url, connection.model, key)


Probe = Callable[[str, str | None], Awaitable[ServerProbe]]


class AddServerFlow:
    """The "Add a server" dialog's state and work, without widgets.

    `await probe(url, key)` fills `models` (or `error`, in words); `choose(model)`; then
    `await add()` saves the connection. `busy` is True while the server is being asked.
    Listeners added with `subscribe` are called after every change.
    """

    def __init__(self, saved: SavedConnections, probe: Probe = probe_server) -> None:
        self.saved = saved
        self._probe = probe
        self.url = ""
        self.api_key = ""
        self.models: tuple[str, ...] = ()
        self.model: str | None = None
        self.busy = False
        self.error: str | None = None
        self._listeners: list[Callable[[], None]] = []

    @property
    def notice(self) -> str | None:
        """Why a key would not be kept after Pagoda closes, or None."""
        return self.saved.keys.notice

    @property
    def can_add(self) -> bool:
        return self.model is not None and not self.busy

    def subscribe(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call `listener()` after each change; returns the function that stops it."""
        self._listeners.append(listener)

        def unsubscribe() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return unsubscribe

    async def probe(self, url: str, api_key: str) -> None:
        """Ask the server at `url` for its models. The only model of a server is chosen."""
        self.url, self.api_key = url.strip(), api_key.strip()
        self.models, self.model, self.error = (), None, None
        self._set_busy(True)
        try:
            found = await self._probe(self.url, self.api_key or None)
        except BackendError as exc:
            self.error = str(exc)
        else:
            self.url, self.models = found.base_url, found.models
            self.model = found.models[0] if len(found.models) == 1 else None
        finally:
            self._set_busy(False)

    def choose(self, model: str | None) -> None:
        self.model = model if model in self.models else None
        self._changed()

    async def add(self, model: str | None = None) -> ServerConnection:
        """Save the server last probed with `model` (else the chosen one). On failure `error`
        says why, and the error is raised."""
        if model is not None:
            self.choose(model)
        if self.model is None:
            raise ValueError("choose one of the server's models first")
        self.error = None
        self._set_busy(True)
        try:
            return await self.saved.add(self.url, self.model, self.api_key)
        except (BackendError, StoreError) as exc:
            self.error = str(exc)
            raise
        finally:
            self._set_busy(False)

    def _set_busy(self, busy: bool) -> None:
        self.busy = busy
        self._changed()

    def _changed(self) -> None:
        for listener in list(self._listeners):
            listener()
