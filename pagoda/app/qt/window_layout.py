"""The window's size and place on the screen: a share of the screen on the first start, then
where the user left it (and whether Settings was open), kept in the app's config folder for
the next start on this computer and fitted to the screen it opens on."""

from __future__ import annotations

import logging
from pathlib import Path

from PySide6.QtCore import QByteArray, QMargins, QPoint, QRect, QSettings, QSize, Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QMainWindow

from pagoda.app.components.shared.config_folder import config_dir

logger = logging.getLogger(__name__)

LAYOUT_FILE = "window.ini"
# The first start's share of the screen's free area (what panels and docks leave): room for
# the window manager's title bar and borders, on a 1366 x 768 laptop as on a large screen.
FIRST_START_SHARE = 0.85
FIRST_START_LARGEST = QSize(1440, 900)  # beyond this a first window only spreads the text
GEOMETRY_KEY = "geometry"  # the window's own area (x, y, width, height), frame not included
FRAME_KEY = "frame"  # the window manager's frame around it (left, top, right, bottom)
MAXIMIZED_KEY = "maximized"
DOCKS_KEY = "docks"  # QMainWindow.saveState(): Settings open or closed, docked or floating


def first_start_geometry(available: QRect, minimum: QSize) -> QRect:
    """FIRST_START_SHARE of `available`, at most FIRST_START_LARGEST, at least `minimum` (the
    window's own) where the screen has the room, centred in `available`."""
    size = QSize(round(available.width() * FIRST_START_SHARE),
                 round(available.height() * FIRST_START_SHARE))
    size = size.boundedTo(FIRST_START_LARGEST).expandedTo(minimum).boundedTo(available.size())
    area = QRect(QPoint(0, 0), size)
    area.moveCenter(available.center())
    return area


def fitted(area: QRect, frame: QMargins, available: QRect, minimum: QSize) -> QRect:
    """`area` (a window's own, inside its `frame`) shrunk and moved as little as needed for the
    frame to lie inside `available`; never below `minimum` where the screen has the room."""
    room = available.marginsRemoved(frame)
    size = area.size().boundedTo(room.size()).expandedTo(minimum.boundedTo(room.size()))
    left = min(max(area.x(), room.left()), room.right() + 1 - size.width())
    top = min(max(area.y(), room.top()), room.bottom() + 1 - size.height())
    return QRect(QPoint(left, top), size)


class WindowLayout:
    """The window's geometry, its frame, whether it was maximized, and its docks' state, in an
    INI file; a file that cannot be read counts as a first start."""

    def __init__(self, file: Path) -> None:
        self.file = file

    @classmethod
    def default(cls) -> WindowLayout:
        return cls(config_dir() / LAYOUT_FILE)

    def restore(self, window: QMainWindow) -> None:
        """Place `window` as it was left, fitted to the screen it opens on, or as on a first
        start; call it before the window shows."""
        settings = self._settings()
        docks = settings.value(DOCKS_KEY)
        if docks is not None and not (isinstance(docks, QByteArray)
                                      and window.restoreState(docks)):
            logger.warning("%s: the settings panel's state could not be read", self.file)
        area = _rect(settings.value(GEOMETRY_KEY))
        if area is None:
            place_first_window(window)
            return
        frame = _margins(settings.value(FRAME_KEY)) or QMargins()
        screen = QGuiApplication.screenAt(area.center()) or window.screen()
        window.setGeometry(fitted(area, frame, screen.availableGeometry(),
                                  window.minimumSizeHint()))
        if settings.value(MAXIMIZED_KEY) == "true":
            window.setWindowState(window.windowState() | Qt.WindowState.WindowMaximized)

    def save(self, window: QMainWindow) -> None:
        area, outer = window.normalGeometry(), window.frameGeometry()
        inner = window.geometry()
        settings = self._settings()
        settings.setValue(GEOMETRY_KEY, [area.x(), area.y(), area.width(), area.height()])
        settings.setValue(FRAME_KEY, [inner.left() - outer.left(), inner.top() - outer.top(),
                                      outer.right() - inner.right(),
                                      outer.bottom() - inner.bottom()])
        settings.setValue(MAXIMIZED_KEY, window.isMaximized())
        settings.setValue(DOCKS_KEY, window.saveState())
        settings.sync()
        if settings.status() != QSettings.Status.NoError:  # the next start opens as a first
            logger.warning("%s: the window's size and place could not be kept (%s)", self.file,
                           settings.status().name)

    def _settings(self) -> QSettings:
        return QSettings(str(self.file), QSettings.Format.IniFormat)


def place_first_window(window: QMainWindow) -> None:
    """The first start's geometry on the screen the window opens on."""
    window.setGeometry(first_start_geometry(window.screen().availableGeometry(),
                                            window.minimumSizeHint()))


def _ints(value: object, count: int) -> list[int] | None:
    """`count` whole numbers as QSettings reads back a list of them (strings), else None."""
    if not isinstance(value, list) or len(value) != count:
        return None
    try:
        return [int(item) for item in value]
    except (TypeError, ValueError):
        return None


def _rect(value: object) -> QRect | None:
    numbers = _ints(value, 4)
    if numbers is None or numbers[2] <= 0 or numbers[3] <= 0:
        return None
    return QRect(*numbers)


def _margins(value: object) -> QMargins | None:
    numbers = _ints(value, 4)
    if numbers is None or min(numbers) < 0:
        return None
    return QMargins(*numbers)
