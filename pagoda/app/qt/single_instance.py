"""One window per database. A second `pagoda` start on a database that a running Pagoda has open
asks that one, over a local socket named after the database, to bring its window to the front,
and exits without opening the database; the store's lock (pagoda/app/store/database/lock.py) is what refuses
the database when nobody answers."""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtNetwork import QLocalServer, QLocalSocket
from PySide6.QtWidgets import QWidget

logger = logging.getLogger(__name__)

RAISE_REQUEST = b"raise\n"
RAISED_REPLY = b"raised\n"
MAX_REQUEST_BYTES = 64  # a request is one short line; a longer one is not ours
# A running Pagoda answers from its event loop: it may be busy for a moment (building its window
# right after it opened the database), so wait a little before saying it cannot be reached.
ANSWER_TIMEOUT_MS = 5000


def server_name(database: Path) -> str:
    """The local socket's name: the same for every spelling of one database file (a relative
    path, a symbolic link), short enough for a Unix socket path."""
    resolved = str(database.expanduser().resolve())
    return "pagoda-" + hashlib.sha256(resolved.encode()).hexdigest()[:24]


def ask_running_window_to_raise(database: Path, timeout_ms: int = ANSWER_TIMEOUT_MS) -> bool:
    """True when the Pagoda that has `database` open answered that its window is in front.
    Blocking: call it before the event loop runs."""
    socket = QLocalSocket()
    socket.connectToServer(server_name(database))
    try:
        if not socket.waitForConnected(timeout_ms):
            return False
        socket.write(RAISE_REQUEST)
        if not socket.waitForBytesWritten(timeout_ms):
            return False
        return _read_reply(socket, timeout_ms) == RAISED_REPLY
    finally:
        socket.abort()


def _read_reply(socket: QLocalSocket, timeout_ms: int) -> bytes:
    reply = b""
    while not reply.endswith(b"\n") and len(reply) <= len(RAISED_REPLY):
        if not socket.bytesAvailable() and not socket.waitForReadyRead(timeout_ms):
            break
        reply += bytes(socket.read(len(RAISED_REPLY) + 1).data())
    return reply


class WindowRaiser(QObject):
    """Listens, while this process holds the database, for other starts asking for its window;
    `raise_requested` fires for each one."""

    raise_requested = Signal()

    def __init__(self, database: Path, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.database = database
        self._server = QLocalServer(self)
        self._server.setSocketOptions(QLocalServer.SocketOption.UserAccessOption)
        self._server.newConnection.connect(self._accept)

    def listen(self) -> bool:
        """Start listening; False (logged) when the OS refuses, and then a second start is
        still refused by the store's lock, only without the window coming to the front."""
        name = server_name(self.database)
        # Only the holder of the database's lock listens on this name, and that is us now: a
        # socket file left under it is a crashed holder's, safe to remove.
        QLocalServer.removeServer(name)
        if self._server.listen(name):
            return True
        logger.warning("another start on %s cannot bring this window to the front: %s",
                       self.database, self._server.errorString())
        return False

    def close(self) -> None:
        self._server.close()

    def _accept(self) -> None:
        while self._server.hasPendingConnections():
            connection = self._server.nextPendingConnection()
            connection.readyRead.connect(lambda c=connection: self._answer(c))
            connection.disconnected.connect(connection.deleteLater)

    def _answer(self, connection: QLocalSocket) -> None:
        if not connection.canReadLine():
            if connection.bytesAvailable() > MAX_REQUEST_BYTES:
                connection.abort()
            return
        request = bytes(connection.readLine(MAX_REQUEST_BYTES + 1).data())
        if request != RAISE_REQUEST:
            connection.abort()
            return
        connection.write(RAISED_REPLY)
        connection.flush()
        connection.disconnectFromServer()
        logger.info("another start on %s asked for this window: brought to the front",
                    self.database)
        self.raise_requested.emit()


def bring_to_front(window: QWidget) -> None:
    """Un-minimize, show and activate `window` (a window manager may only flash it instead)."""
    window.setWindowState(window.windowState() & ~Qt.WindowState.WindowMinimized)
    window.show()
    window.raise_()
    window.activateWindow()
