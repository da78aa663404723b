"""Light and dark themes, icons and fonts for the whole application.

Resources (QSS themes, SVG icons, the .desktop file) live in the top-level `resources/` folder.
`resources_dir()` finds it, first match wins:

1. a PyInstaller bundle: `sys._MEIPASS/resources` (bundle it with `--add-data resources:resources`);
2. the source tree (also an editable install): `resources/` next to the `app` package;
3. an installed wheel: `<prefix>/share/pagoda/resources`, for `sys.prefix` and the user base,
   where `[tool.setuptools.data-files]` in pyproject.toml puts it.

Icons are line drawings stroked with `currentColor`; `icon(name)` paints them in the palette's
text color, so ask for icons again after a theme change. `apply_theme` may be called again at
any time: every widget then gets `QEvent.PaletteChange`, and `theme_changed(app)` emits the
look now shown ("light" or "dark"), also when "system" follows a change of the desktop's scheme.
"""

from __future__ import annotations

import logging
import site
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal

from PySide6.QtCore import QByteArray, QDir, QObject, Qt, Signal, SignalInstance
from PySide6.QtGui import (
    QColor,
    QFontDatabase,
    QGuiApplication,
    QIcon,
    QImage,
    QPainter,
    QPalette,
    QPixmap,
)
from PySide6.QtSvg import QSvgRenderer
from PySide6.QtWidgets import QApplication

logger = logging.getLogger(__name__)

ThemeMode = Literal["system", "light", "dark"]
THEMES: tuple[ThemeMode, ...] = ("system", "light", "dark")

ICON_SIZES = (16, 20, 24, 32, 40, 48, 64)
# An error line (a label whose `severity` property is "error"): red that reads in both themes.
ERROR_STYLE = 'QLabel[severity="error"] { color: #e5484d; }'
CJK_FAMILY_HINTS = (
    "Noto Sans CJK",
    "Source Han Sans",
    "WenQuanYi",
    "Noto Sans SC",
    "Microsoft YaHei",
    "PingFang",
    "Hiragino Sans GB",
)
_CONTROLLER_NAME = "pagodaThemeController"


class ResourcesNotFoundError(RuntimeError):
    """Pagoda's resources folder is missing: the installation is incomplete."""


@dataclass(slots=True, frozen=True)
class ThemeColors:
    """The colors a theme's palette is built from; its QSS file uses the same ones."""

    window: str
    panel: str
    base: str
    border: str
    text: str
    muted: str
    accent: str
    accent_text: str


LIGHT = ThemeColors(
    window="#f5f5f7",
    panel="#ececef",
    base="#ffffff",
    border="#d4d4d8",
    text="#1f1f23",
    muted="#6b6b75",
    accent="#4f6bed",
    accent_text="#ffffff",
)
DARK = ThemeColors(
    window="#1c1c20",
    panel="#232328",
    base="#2b2b31",
    border="#3c3c44",
    text="#e6e6ea",
    muted="#9a9aa5",
    accent="#6e84f5",
    accent_text="#ffffff",
)


def _resource_candidates() -> Iterator[Path]:
    bundle = getattr(sys, "_MEIPASS", None)
    if bundle:
        yield Path(bundle) / "resources"
    yield Path(__file__).resolve().parents[4] / "resources"
    for prefix in (sys.prefix, site.getuserbase()):
        yield Path(prefix) / "share" / "pagoda" / "resources"


def resources_dir() -> Path:
    """The folder holding `themes/`, `icons/` and `pagoda.desktop`."""
    for candidate in _resource_candidates():
        if (candidate / "themes").is_dir() and (candidate / "icons").is_dir():
            return candidate
    tried = ", ".join(str(path) for path in _resource_candidates())
    raise ResourcesNotFoundError(
        f"Pagoda's resources folder was not found (looked in: {tried}); reinstall Pagoda."
    )


def theme_stylesheet(name: Literal["light", "dark"]) -> str:
    """The QSS text of a theme."""
    return (resources_dir() / "themes" / f"{name}.qss").read_text(encoding="utf-8")


def build_palette(colors: ThemeColors) -> QPalette:
    """A QPalette matching a theme, so unstyled parts (and Fusion) agree with the QSS."""
    palette = QPalette()
    roles = QPalette.ColorRole
    for role, value in (
        (roles.Window, colors.window),
        (roles.WindowText, colors.text),
        (roles.Base, colors.base),
        (roles.AlternateBase, colors.panel),
        (roles.Text, colors.text),
        (roles.Button, colors.base),
        (roles.ButtonText, colors.text),
        (roles.BrightText, "#ffffff"),
        (roles.Highlight, colors.accent),
        (roles.HighlightedText, colors.accent_text),
        (roles.ToolTipBase, colors.base),
        (roles.ToolTipText, colors.text),
        (roles.PlaceholderText, colors.muted),
        (roles.Link, colors.accent),
        (roles.Mid, colors.border),
        (roles.Midlight, colors.panel),
        (roles.Dark, colors.border),
        (roles.Light, colors.base),
    ):
        palette.setColor(role, QColor(value))
    for role in (roles.WindowText, roles.Text, roles.ButtonText):
        palette.setColor(QPalette.ColorGroup.Disabled, role, QColor(colors.muted))
    return palette


def system_prefers_dark(app: QGuiApplication) -> bool:
    """Whether the desktop asks for dark colors (the color scheme, else the system palette)."""
    scheme_of = getattr(app.styleHints(), "colorScheme", None)  # Qt 6.5+
    scheme = scheme_of() if scheme_of else Qt.ColorScheme.Unknown
    if scheme != Qt.ColorScheme.Unknown:
        return scheme == Qt.ColorScheme.Dark
    return _system_palette(app).color(QPalette.ColorRole.Window).lightness() < 128


def apply_theme(app: QApplication, mode: ThemeMode = "system") -> None:
    """Style the application, now or again at runtime; with "system" it also follows the
    desktop's later changes."""
    if mode not in THEMES:
        raise ValueError(f"Unknown theme {mode!r}; choose one of {', '.join(THEMES)}.")
    _controller(app).apply(mode)


def theme_changed(app: QApplication) -> SignalInstance:
    """Emits "light" or "dark" after each application of a theme, for widgets that draw with
    the theme's colors outside the palette (for those, `QEvent.PaletteChange` is enough)."""
    return _controller(app).changed


def cjk_font_family() -> str | None:
    """An installed font family that covers Chinese, or None."""
    families = QFontDatabase.families()
    for hint in CJK_FAMILY_HINTS:
        for family in families:
            if hint.lower() in family.lower():
                return family
    return None


def ensure_cjk_fallback(app: QGuiApplication) -> None:
    """Append a CJK family to the application font's families, if one is installed."""
    family = cjk_font_family()
    if family is None:
        logger.info("No CJK font installed; Chinese text may render as boxes.")
        return
    font = app.font()
    families = font.families() or [font.family()]
    if family not in families:
        font.setFamilies([*families, family])
        app.setFont(font)


def app_icon() -> QIcon:
    """The application's icon (the pagoda), drawn at any size."""
    return QIcon(str(resources_dir() / "icons" / "pagoda.svg"))


def icon(name: str, color: QColor | None = None) -> QIcon:
    """The line icon `name` painted in `color`, by default the current palette's text color."""
    if color is None:
        color = QGuiApplication.palette().color(QPalette.ColorRole.WindowText)
    return _recolored_icon(name, color.name(QColor.NameFormat.HexRgb))


@lru_cache(maxsize=256)
def _recolored_icon(name: str, color: str) -> QIcon:
    path = resources_dir() / "icons" / f"{name}.svg"
    if not path.is_file():
        raise ValueError(f"No icon named {name!r} in {path.parent}.")
    svg = path.read_text(encoding="utf-8").replace("currentColor", color)
    renderer = QSvgRenderer(QByteArray(svg.encode("utf-8")))
    result = QIcon()
    for size in ICON_SIZES:
        result.addPixmap(_render(renderer, size))
    return result


def _render(renderer: QSvgRenderer, size: int) -> QPixmap:
    image = QImage(size, size, QImage.Format.Format_ARGB32_Premultiplied)
    image.fill(Qt.GlobalColor.transparent)
    painter = QPainter(image)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    renderer.render(painter)
    painter.end()
    return QPixmap.fromImage(image)


class _ThemeController(QObject):
    """Remembers the chosen mode and the desktop's own palette; one per application."""

    changed = Signal(str)

    def __init__(self, app: QApplication) -> None:
        super().__init__(app)
        self.setObjectName(_CONTROLLER_NAME)
        self.app = app
        self.mode: ThemeMode = "system"
        self.system_palette = QPalette(app.palette())  # before we replace it
        app.setStyle("Fusion")  # native styles ignore parts of the palette and QSS
        scheme_changed = getattr(app.styleHints(), "colorSchemeChanged", None)
        if scheme_changed is not None:
            scheme_changed.connect(self._on_system_scheme_changed)

    def apply(self, mode: ThemeMode) -> None:
        self.mode = mode
        dark = system_prefers_dark(self.app) if mode == "system" else mode == "dark"
        QDir.setSearchPaths("pagoda", [str(resources_dir() / "icons")])  # url(pagoda:…) in QSS
        look = "dark" if dark else "light"
        self.app.setPalette(build_palette(DARK if dark else LIGHT))
        sheet = theme_stylesheet(look)
        if self.app.styleSheet() != sheet:  # setting it repolishes every widget
            self.app.setStyleSheet(sheet)
        ensure_cjk_fallback(self.app)
        self.changed.emit(look)

    def _on_system_scheme_changed(self, _scheme: Qt.ColorScheme) -> None:
        if self.mode == "system":
            self.apply("system")


def _controller(app: QApplication) -> _ThemeController:
    existing = app.findChild(_ThemeController, _CONTROLLER_NAME)
    return existing if isinstance(existing, _ThemeController) else _ThemeController(app)


def _system_palette(app: QGuiApplication) -> QPalette:
    existing = app.findChild(_ThemeController, _CONTROLLER_NAME)
    return existing.system_palette if isinstance(existing, _ThemeController) else app.palette()
