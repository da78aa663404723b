"""The "Local server" settings in the window: on/off and the port (kept as app settings), the
key (shown once, kept out of the database), the address in the status bar, and a clear message
for a taken port. A fake engine stands in for the model; the HTTP server is real."""

import socket
import sqlite3
from pathlib import Path

import httpx
import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QDialog, QLineEdit

from pagoda.app.components.server.api_key import KEY_FILENAME, ApiKeyFile
from pagoda.app.qt.server.server_controller import SERVER_ENABLED_SETTING, SERVER_PORT_SETTING
from tests.app.qt.fake_engine import IdleEngine

WAIT_MS = 5_000
RUNNING = "running-model"


@pytest.fixture
def server_window(qloop, qtbot, tmp_path):
    """build(db_path=None) -> a MainWindow over a fake engine, started like the app starts
    (settings restored, the model loaded, the local server as it was left)."""
    from pagoda.app.components.shared.async_store import AsyncStore
    from pagoda.app.qt.main_window import MainWindow
    from pagoda.app.qt.models.engine_host import EngineHost
    from pagoda.app.store import ConversationStore

    windows = []

    def build(db_path=None):
        store = ConversationStore.open(db_path or tmp_path / "chats.db")
        host = EngineHost(factory=lambda model, config, progress:
                          IdleEngine(Path(model).name if model else RUNNING))
        window = MainWindow(AsyncStore(store), host,
                            ApiKeyFile(tmp_path / "config" / KEY_FILENAME))
        qtbot.addWidget(window)
        window.show()
        windows.append(window)
        qtbot.waitUntil(window.host.load(None).done, timeout=WAIT_MS)
        restored = window.spawn(window.server_controller.restore())
        qtbot.waitUntil(restored.done, timeout=WAIT_MS)
        return window

    yield build
    for window in windows:
        if not window.closing:
            window.close()
        window.db.close()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _choose_port(qtbot, window, port: int) -> None:
    box = window.server_panel.port_box
    box.lineEdit().selectAll()
    qtbot.keyClicks(box.lineEdit(), str(port))
    qtbot.keyClick(box.lineEdit(), Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: window.local_server.port == port, timeout=WAIT_MS)


def _turn_on(qtbot, window) -> None:
    """Check "Serve" and wait until the panel says where it serves, or why it does not."""
    qtbot.mouseClick(window.server_panel.enabled_box, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: bool(window.server_panel.state_label.text()), timeout=WAIT_MS)


def _stored_settings(window) -> dict:
    store = window.db.store
    return {key: store.get_setting(key) for key in (SERVER_ENABLED_SETTING, SERVER_PORT_SETTING)}


def test_turning_the_server_on_serves_the_model_and_shows_its_address(server_window, qtbot):
    window = server_window()
    port = _free_port()
    _choose_port(qtbot, window, port)
    _turn_on(qtbot, window)
    address = f"http://127.0.0.1:{port}"
    assert window.local_server.address == address
    models = httpx.get(f"{address}/v1/models", timeout=10).json()["data"]
    assert [m["id"] for m in models] == [RUNNING]
    qtbot.waitUntil(lambda: window.status.server_label.text() == f"API: {address} · 0 requests",
                    timeout=WAIT_MS)
    assert window.server_panel.enabled_box.isChecked()
    assert window.server_panel.state_label.text() == f"Serving at {address}/v1"
    qtbot.waitUntil(lambda: _stored_settings(window) == {SERVER_ENABLED_SETTING: True,
                                                         SERVER_PORT_SETTING: port},
                    timeout=WAIT_MS)


def test_turning_it_off_frees_the_port_and_hides_the_address(server_window, qtbot):
    window = server_window()
    _choose_port(qtbot, window, _free_port())
    _turn_on(qtbot, window)
    qtbot.mouseClick(window.server_panel.enabled_box, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(window.status.server_label.isHidden, timeout=WAIT_MS)
    assert not window.local_server.is_running and not window.server_panel.state_label.text()
    assert "API:" not in window.status.summary_text()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", window.local_server.port))


def test_the_server_comes_back_on_its_port_at_the_next_start(server_window, qtbot, tmp_path):
    window = server_window(tmp_path / "kept.db")
    port = _free_port()
    _choose_port(qtbot, window, port)
    _turn_on(qtbot, window)
    qtbot.waitUntil(lambda: _stored_settings(window)[SERVER_ENABLED_SETTING], timeout=WAIT_MS)
    window.close()
    window.db.close()  # as the app does at exit: the next start takes the database's lock
    again = server_window(tmp_path / "kept.db")
    assert again.local_server.address == f"http://127.0.0.1:{port}"
    assert again.server_panel.port() == port and again.server_panel.enabled_box.isChecked()


def test_a_taken_port_unchecks_serve_and_says_to_choose_another(server_window, qtbot):
    window = server_window()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        _choose_port(qtbot, window, port)
        _turn_on(qtbot, window)
    panel = window.server_panel
    assert not window.local_server.is_running and not panel.enabled_box.isChecked()
    assert f"Port {port} is in use" in panel.state_label.text()
    assert panel.state_label.property("severity") == "error"
    assert "API:" not in window.status.summary_text()
    qtbot.waitUntil(lambda: _stored_settings(window)[SERVER_ENABLED_SETTING] is False,
                    timeout=WAIT_MS)


def test_serve_stays_unchecked_when_it_fails_again_the_same_way(server_window, qtbot):
    window = server_window()
    box = window.server_panel.enabled_box
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        _choose_port(qtbot, window, taken.getsockname()[1])
        for _ in range(2):
            qtbot.mouseClick(box, Qt.MouseButton.LeftButton)
            qtbot.waitUntil(lambda: not box.isChecked(), timeout=WAIT_MS)
            qtbot.wait(100)
            assert not box.isChecked() and "is in use" in window.server_panel.state_label.text()


def test_switching_models_in_the_window_shows_in_v1_models(server_window, qtbot):
    window = server_window()
    _choose_port(qtbot, window, _free_port())
    _turn_on(qtbot, window)
    window.models_controller.load_model("/models/other-model")
    qtbot.waitUntil(lambda: not window.host.is_loading, timeout=WAIT_MS)
    models = httpx.get(f"{window.local_server.address}/v1/models", timeout=10).json()["data"]
    assert [m["id"] for m in models] == ["other-model"]


def _database_bytes(path: Path) -> bytes:
    return b"".join(p.read_bytes() for p in path.parent.glob(path.name + "*"))


def test_generate_key_shows_it_once_and_keeps_only_its_digest_outside_the_database(
        server_window, qtbot, tmp_path):
    window = server_window(tmp_path / "chats.db")
    _choose_port(qtbot, window, _free_port())
    _turn_on(qtbot, window)
    qtbot.mouseClick(window.server_panel.generate_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: window.findChild(QDialog, "newApiKeyDialog") is not None,
                    timeout=WAIT_MS)
    dialog = window.findChild(QDialog, "newApiKeyDialog")
    key = dialog.findChild(QLineEdit, "newApiKey").text()
    assert key.startswith("sk-pagoda-")
    panel = window.server_panel
    assert "key is set" in panel.key_label.text()
    assert panel.generate_button.text() == "Generate a new key"
    assert not panel.remove_button.isHidden()
    models = f"{window.local_server.address}/v1/models"
    assert httpx.get(models, timeout=10).status_code == 401
    assert httpx.get(models, headers={"Authorization": f"Bearer {key}"},
                     timeout=10).status_code == 200
    digest = window.local_server.key_file.digest()
    window.db.drain()
    with sqlite3.connect(tmp_path / "chats.db") as db:
        values = " ".join(v for (v,) in db.execute("SELECT value FROM settings"))
    assert key not in values and digest not in values
    assert key.encode() not in _database_bytes(tmp_path / "chats.db")
    dialog.close()
    qtbot.waitUntil(lambda: window.findChild(QDialog, "newApiKeyDialog") is None,
                    timeout=WAIT_MS)


def test_remove_key_lets_requests_in_without_one(server_window, qtbot):
    window = server_window()
    _choose_port(qtbot, window, _free_port())
    _turn_on(qtbot, window)
    panel = window.server_panel
    qtbot.mouseClick(panel.generate_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not panel.remove_button.isHidden(), timeout=WAIT_MS)
    qtbot.mouseClick(panel.remove_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: panel.remove_button.isHidden(), timeout=WAIT_MS)
    assert panel.generate_button.text() == "Generate key"
    assert httpx.get(f"{window.local_server.address}/v1/models", timeout=10).status_code == 200


def test_closing_the_window_stops_the_server(server_window, qtbot):
    window = server_window()
    _choose_port(qtbot, window, _free_port())
    _turn_on(qtbot, window)
    address = window.local_server.address
    window.close()
    assert not window.local_server.is_running
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{address}/v1/models", timeout=5)
