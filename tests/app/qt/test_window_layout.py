"""The window's size, place and Settings' state: a share of the screen on the first start,
then as the user left them, fitted to the screen it opens on (test_window_fits_the_screen.py
checks the same on real screens)."""

from __future__ import annotations

import pytest
from fake_engine import WAIT_MS, FakeModels
from PySide6.QtCore import QMargins, QRect, QSize

from pagoda.app.components.shared.async_store import AsyncStore
from pagoda.app.qt.main_window import MainWindow
from pagoda.app.qt.models.engine_host import EngineHost
from pagoda.app.qt.window_layout import (
    FIRST_START_LARGEST,
    LAYOUT_FILE,
    WindowLayout,
    first_start_geometry,
    fitted,
)
from pagoda.app.store import ConversationStore

LAPTOP = QRect(0, 0, 1366, 768)
TITLE_BAR = QMargins(1, 28, 1, 1)


def test_the_first_start_takes_most_of_a_laptop_screen_and_less_of_a_large_one():
    laptop = first_start_geometry(LAPTOP, QSize(920, 280))
    assert LAPTOP.contains(laptop) and laptop.center() == LAPTOP.center()
    assert laptop.height() + TITLE_BAR.top() < LAPTOP.height()
    large = first_start_geometry(QRect(0, 0, 3840, 2160), QSize(920, 280))
    assert large.size() == FIRST_START_LARGEST


def test_a_window_larger_than_the_screen_is_shrunk_with_its_frame_inside():
    kept = fitted(QRect(-40, 10, 1600, 1000), TITLE_BAR, LAPTOP, QSize(920, 280))
    assert LAPTOP.contains(kept.marginsAdded(TITLE_BAR))
    assert kept.size() == LAPTOP.marginsRemoved(TITLE_BAR).size()


def test_a_window_that_fits_is_moved_only_as_far_as_its_frame_needs():
    kept = fitted(QRect(900, 400, 800, 500), TITLE_BAR, LAPTOP, QSize(600, 280))
    assert kept.size() == QSize(800, 500)
    assert kept.topLeft().y() == 400 - (400 + 500 + TITLE_BAR.bottom() - LAPTOP.height())
    assert kept.right() + TITLE_BAR.right() == LAPTOP.right()


@pytest.fixture
def start(qloop, qtbot, tmp_path):
    """start() -> a window over the same database and layout file, like a restart: the last
    one is closed first."""
    windows = []

    def open_window() -> MainWindow:
        if windows:
            close(windows[-1])
        host = EngineHost(factory=FakeModels())
        window = MainWindow(AsyncStore(ConversationStore.open(tmp_path / "chats.db")), host,
                            window_layout=WindowLayout(tmp_path / "config" / LAYOUT_FILE))
        windows.append(window)
        qtbot.addWidget(window)
        window.show()
        qtbot.waitUntil(host.load(None).done, timeout=WAIT_MS)
        return window

    yield open_window
    close(windows[-1])


def close(window: MainWindow) -> None:
    if not window.closing:
        window.close()
    window.db.close()


def test_size_place_and_settings_come_back_after_a_restart(start):
    window = start()
    assert window.settings_dock.isVisible()  # Settings open on the first start
    available = window.screen().availableGeometry()
    assert available.contains(window.frameGeometry())
    window.setGeometry(available.x() + 20, available.y() + 30, 700, 450)
    window.settings_dock.hide()
    left = window.geometry()

    again = start()
    assert again.geometry() == left and not again.settings_dock.isVisible()
    again.settings_dock.show()
    assert start().settings_dock.isVisible()


def test_an_unreadable_layout_file_opens_as_a_first_start(start, tmp_path):
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / LAYOUT_FILE).write_bytes(
        b"[General]\ngeometry=1, 2, x, 4\nframe=@ByteArray(\\0\\1)\ndocks=nonsense\n")
    window = start()
    assert window.settings_dock.isVisible()
    assert window.geometry() == first_start_geometry(window.screen().availableGeometry(),
                                                     window.minimumSizeHint())


def test_a_layout_that_cannot_be_kept_is_said_in_the_log(start, tmp_path, caplog):
    window = start()
    (tmp_path / "config").mkdir(exist_ok=True)
    (tmp_path / "config" / LAYOUT_FILE).mkdir()  # a folder where the file should be
    window.close()
    assert "could not be kept" in caplog.text
