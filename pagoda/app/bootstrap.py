"""How both entry points, `pagoda` (pagoda.app.main) and `pagoda --selftest` (pagoda.app.selftest), start the
desktop app: the QApplication, the qasync event loop, the window over an open store, and the loop
run until a coroutine ends. It imports neither entry point, so neither needs the other."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

import qasync
from PySide6.QtWidgets import QApplication

if TYPE_CHECKING:
    from pagoda.app.qt.main_window import MainWindow
    from pagoda.app.store import ConversationStore

T = TypeVar("T")


def create_app(theme: str) -> QApplication:
    """The process's QApplication (made now, or the one already there), named and styled."""
    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName("Pagoda")
    app.setDesktopFileName("pagoda")
    style_app(app, theme)
    return app


def style_app(app: QApplication, theme: str) -> None:
    from pagoda.app.qt.shared.theme import app_icon, apply_theme

    apply_theme(app, theme)
    app.setWindowIcon(app_icon())


def install_event_loop(app: QApplication) -> qasync.QEventLoop:
    """A qasync loop over `app`, set as asyncio's loop. Modal dialogs (`QDialog.exec`) belong
    before it runs, never inside one of its coroutines."""
    loop = qasync.QEventLoop(app)
    asyncio.set_event_loop(loop)
    return loop


def build_window(store: ConversationStore, device: str,
                 remember_layout: bool = True) -> MainWindow:
    """The main window over an open store, its engine on `device`; create the app first.
    `remember_layout`: it opens where it was left and keeps where it is left (not for a window
    nobody sees, which would overwrite the user's)."""
    from pagoda.app.components.shared.async_store import AsyncStore
    from pagoda.app.qt.main_window import MainWindow
    from pagoda.app.qt.models.engine_host import EngineHost
    from pagoda.app.qt.window_layout import WindowLayout

    window = MainWindow(AsyncStore(store), EngineHost(device=device),
                        window_layout=WindowLayout.default() if remember_layout else None)
    window.recovered_from = store.recovered_from
    return window


def run_until_done(loop: qasync.QEventLoop, work: Coroutine[Any, Any, T]) -> T:
    """Run `work` on `loop` and return its result; the loop is closed afterwards."""
    with loop:
        return loop.run_until_complete(work)
