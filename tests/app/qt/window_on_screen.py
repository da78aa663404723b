"""Run under a real X server (test_window_fits_the_screen.py starts one per screen size): the
real window over a fake engine, Settings docked, measured where the user would look, as JSON
on stdout. Each step's record holds the screen's free area and the global rectangles of what
must be on screen.

Steps: the first start (the model still loading), after enabling tools in a chat, after Reset,
maximized, then a second start from the layout the first one kept, a third after Settings was
closed, and a fourth after the window was left larger than the screen.

    python window_on_screen.py CONFIG_DIR
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[2]), str(HERE)]
os.environ["QT_QPA_PLATFORM"] = "xcb"
SETTLE_S = 0.3  # a window that kept its place this long has settled
SETTLE_MAX_S = 15.0

TOOL_SERVERS = [("files", 6), ("time", 2), ("search", 4)]


def rect(widget) -> list[int]:
    """`widget`'s rectangle on the screen (x, y, width, height); its frame for a window."""
    from PySide6.QtCore import QPoint

    if widget.isWindow():
        frame = widget.frameGeometry()
        return [frame.x(), frame.y(), frame.width(), frame.height()]
    corner = widget.mapToGlobal(QPoint(0, 0))
    return [corner.x(), corner.y(), widget.width(), widget.height()]


def measure(window) -> dict:
    from PySide6.QtWidgets import QPlainTextEdit, QPushButton

    tab = window.tabs.currentWidget()
    panel = window.settings_panel
    tree = panel.tools_tree
    available = window.screen().availableGeometry()
    return {
        "screen": [available.x(), available.y(), available.width(), available.height()],
        "window": rect(window),
        "composer": rect(tab.findChild(QPlainTextEdit, "composer")),
        "send": rect(tab.findChild(QPushButton, "sendButton")),
        "status bar": rect(window.status),
        "settings shown": window.settings_dock.isVisible(),
        "settings floating": window.settings_dock.isFloating(),
        "system prompt": rect(panel.system_prompt_edit),
        "temperature": rect(panel.sampling_spins["temperature"]),
        "tools rows": tree.rows_shown(),
        "tools rows bottom": _last_row(tree).bottom() if tree.topLevelItemCount() else 0,
        "tools viewport height": tree.viewport().height(),
        "tools shown": not tree.isHidden(),
    }


def _last_row(tree):
    """Where the tree's last row is drawn, in its viewport."""
    last = tree.topLevelItem(tree.topLevelItemCount() - 1)
    while last.isExpanded() and last.childCount():
        last = last.child(last.childCount() - 1)
    return tree.visualItemRect(last)


async def settle(window) -> None:
    """Until the window manager has framed and placed the window and Qt has laid it out: its
    frame and message box the same over SETTLE_S, the window exposed (at most SETTLE_MAX_S;
    the test then says what it found)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + SETTLE_MAX_S
    before = None
    while loop.time() < deadline:
        await asyncio.sleep(SETTLE_S)
        now = (rect(window), measure(window)["composer"])
        if now == before and window.windowHandle().isExposed():
            return
        before = now


def enable_tools(window) -> None:
    """What a user does with three MCP servers set up: open one's tools and check two of them,
    and check another server whole."""
    from PySide6.QtCore import Qt

    from pagoda.app.components.view_models import ToolServerView

    window.settings_panel.set_tool_servers([
        ToolServerView(name, tuple((f"{name}_tool_{i}", f"Tool {i} of {name}")
                                   for i in range(count)), "running")
        for name, count in TOOL_SERVERS])
    tree = window.settings_panel.tools_tree
    files = tree.topLevelItem(0)
    files.setExpanded(True)
    files.child(0).setCheckState(0, Qt.CheckState.Checked)
    files.child(3).setCheckState(0, Qt.CheckState.Checked)
    tree.topLevelItem(1).setCheckState(0, Qt.CheckState.Checked)


def reset_chat_settings(window) -> None:
    """A chat whose settings differ from the defaults, reset as the user does: with the button."""
    panel = window.settings_panel
    panel.system_prompt_edit.setPlainText("You answer in French, briefly.\nAlways cite.")
    panel.sampling_spins["temperature"].setValue(1.3)
    panel.reset_button.click()


def start(config: Path, models=None):
    from fake_engine import FakeModels

    from pagoda.app.components.async_store import AsyncStore
    from pagoda.app.components.connections import ConnectionKeys
    from pagoda.app.qt.engine_host import EngineHost
    from pagoda.app.qt.main_window import MainWindow
    from pagoda.app.qt.window_layout import WindowLayout
    from pagoda.app.store import ConversationStore

    host = EngineHost(factory=models or FakeModels())
    window = MainWindow(AsyncStore(ConversationStore.open(config / "chats.db")), host,
                        connection_keys=ConnectionKeys.in_memory(),
                        window_layout=WindowLayout(config / "window.ini"))
    window.show()
    return window


async def close(window) -> None:
    window.close()
    window.db.close()
    await asyncio.sleep(0.1)


async def steps(config: Path) -> dict:
    from fake_engine import FakeModels

    report = {}
    loading = FakeModels()
    loading.gate = threading.Event()  # the first load waits, as a real one takes its time
    window = start(config, loading)
    await window.restore()
    window.host.load(None)
    await settle(window)
    report["first start"] = measure(window)
    loading.gate.set()
    while not window.host.is_ready:
        await asyncio.sleep(0.05)
    enable_tools(window)
    await settle(window)
    report["after enabling tools"] = measure(window)
    reset_chat_settings(window)
    await settle(window)
    report["after reset"] = measure(window)
    report["after reset"]["note"] = window.settings_panel.note()
    window.showMaximized()
    await settle(window)
    report["maximized"] = measure(window)
    window.showNormal()
    await settle(window)
    await close(window)

    report["second start"] = await restart(config, lambda w: w.settings_dock.hide())
    report["after closing settings"] = await restart(config, leave_larger_than_the_screen)
    report["after leaving it larger than the screen"] = await restart(config, lambda w: None)
    return report


async def restart(config: Path, then) -> dict:
    """A start from the layout the last one kept: measured as it opens, then `then(window)`
    done before it closes (and keeps its layout)."""
    window = start(config)
    await window.restore()
    await settle(window)
    seen = measure(window)
    then(window)
    await settle(window)
    await close(window)
    return seen


def leave_larger_than_the_screen(window) -> None:
    window.settings_dock.show()
    screen = window.screen().availableGeometry()
    window.setGeometry(screen.x(), screen.y(), screen.width() + 300, screen.height() + 200)


def main() -> int:
    import qasync
    from PySide6.QtWidgets import QApplication

    from pagoda.app.components import connections
    from pagoda.app.qt.theme import apply_theme

    config = Path(sys.argv[1])
    os.environ.update(PAGODA_CONFIG_DIR=str(config), PAGODA_KV_CACHE_DIR=str(config / "kv"),
                      PAGODA_MODELS_DIR=str(config / "models"))
    connections._system_keyring = lambda: None  # no saved server, no keyring asked
    qt_app = QApplication(sys.argv[:1])
    qt_app.setQuitOnLastWindowClosed(False)  # the steps close and open windows
    apply_theme(qt_app, "light")
    loop = qasync.QEventLoop(qt_app)
    asyncio.set_event_loop(loop)
    with loop:
        report = loop.run_until_complete(steps(config))
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
