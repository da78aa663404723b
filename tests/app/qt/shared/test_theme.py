"""Themes, icons and desktop integration: both themes load cleanly and icons draw something."""

from __future__ import annotations

import configparser
import shutil
import subprocess
from collections.abc import Iterator

import pytest
from PySide6.QtCore import QEvent, QtMsgType, qInstallMessageHandler
from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import (
    QApplication,
    QCheckBox,
    QComboBox,
    QListWidget,
    QMainWindow,
    QMenu,
    QPushButton,
    QScrollBar,
    QSplitter,
    QStyle,
    QStyleOptionButton,
    QTabWidget,
    QTextBrowser,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from pagoda.app.components.shared.view_models import EngineStatusView
from pagoda.app.qt.chat.context_meter import ContextMeter
from pagoda.app.qt.settings.settings_panel import SettingsPanel
from pagoda.app.qt.shared import theme
from pagoda.app.qt.status_bar import EngineStatusBar

REQUIRED_ICONS = (
    "new-chat",
    "send",
    "stop",
    "settings",
    "search",
    "pin",
    "trash",
    "regenerate",
    "copy",
    "edit",
    "folder",
)

OFFSCREEN_NOISE = "does not support propagateSizeHints"  # the offscreen platform, not our QSS


@pytest.fixture
def qt_messages() -> Iterator[list[str]]:
    messages: list[str] = []

    def record(kind: QtMsgType, _context: object, text: str) -> None:
        if kind != QtMsgType.QtDebugMsg and OFFSCREEN_NOISE not in text:
            messages.append(text)

    previous = qInstallMessageHandler(record)
    yield messages
    qInstallMessageHandler(previous)


def build_sample_window(qtbot) -> QMainWindow:
    """A window with every kind of widget the themes style."""
    window = QMainWindow()
    qtbot.addWidget(window)
    central = QWidget()
    layout = QVBoxLayout(central)
    button = QPushButton("Send")
    button.setProperty("primary", True)
    tabs = QTabWidget()
    tabs.addTab(QTextBrowser(), "Chat")
    tabs.addTab(QWidget(), "另一个")
    conversations = QListWidget()
    conversations.addItems([f"Conversation {i}" for i in range(40)])
    conversations.setCurrentRow(1)
    combo = QComboBox()
    combo.addItems(["SmolLM2-135M-Instruct"])
    splitter = QSplitter()
    splitter.addWidget(conversations)
    splitter.addWidget(SettingsPanel())
    for widget in (button, QPushButton("Plain"), QToolButton(), tabs, combo, splitter):
        layout.addWidget(widget)
    layout.addWidget(ContextMeter())
    layout.addWidget(QScrollBar())
    window.setCentralWidget(central)
    status_bar = EngineStatusBar()
    status_bar.show_status(EngineStatusView(state="error", device="cpu", detail="boom"))
    window.setStatusBar(status_bar)
    menu = window.menuBar().addMenu("File")
    menu.addAction("New chat")
    menu.addSeparator()
    return window


def render_everything(qtbot, app: QApplication) -> None:
    window = build_sample_window(qtbot)
    window.resize(800, 600)
    window.show()
    window.grab()
    menu = window.findChild(QMenu)
    menu.grab()
    app.processEvents()


@pytest.mark.parametrize("mode", ["light", "dark"])
def test_theme_applies_without_qt_warnings(qtbot, app, qt_messages, mode):
    theme.apply_theme(app, mode)
    render_everything(qtbot, app)
    assert app.styleSheet() == theme.theme_stylesheet(mode)
    assert qt_messages == []


def test_warning_capture_catches_an_unknown_property(qtbot, app, qt_messages):
    app.setStyleSheet(theme.theme_stylesheet("light") + "QPushButton { colour: red; }")
    render_everything(qtbot, app)
    assert any("colour" in message for message in qt_messages)


def test_dark_mode_gives_a_dark_window_palette(app):
    theme.apply_theme(app, "dark")
    palette = app.palette()
    assert palette.color(QPalette.ColorRole.Window).lightness() < 60
    assert palette.color(QPalette.ColorRole.WindowText).lightness() > 200


def test_light_mode_gives_a_light_window_palette(app):
    theme.apply_theme(app, "light")
    assert app.palette().color(QPalette.ColorRole.Window).lightness() > 200


def window_color(app: QApplication) -> str:
    return app.palette().color(QPalette.ColorRole.Window).name()


def test_switching_themes_at_runtime_changes_palette_and_stylesheet(app):
    seen = []
    for mode in ("light", "dark", "light"):
        theme.apply_theme(app, mode)
        seen.append((window_color(app), app.styleSheet()))
    light, dark, light_again = seen
    assert light == (theme.LIGHT.window, theme.theme_stylesheet("light"))
    assert dark == (theme.DARK.window, theme.theme_stylesheet("dark"))
    assert light_again == light


def test_modes_are_the_start_flag_choices():
    assert theme.THEMES == ("system", "light", "dark")


def test_an_unknown_mode_names_the_choices(app):
    with pytest.raises(ValueError, match="system, light, dark"):
        theme.apply_theme(app, "sepia")


class PaletteWatcher(QWidget):
    def __init__(self) -> None:
        super().__init__()
        self.palette_changes = 0

    def changeEvent(self, event: QEvent) -> None:
        super().changeEvent(event)
        if event.type() == QEvent.Type.PaletteChange:
            self.palette_changes += 1


def test_a_runtime_switch_tells_shown_widgets_their_palette_changed(qtbot, app):
    theme.apply_theme(app, "light")
    watcher = PaletteWatcher()
    qtbot.addWidget(watcher)
    watcher.show()
    theme.apply_theme(app, "dark")
    assert watcher.palette_changes > 0
    assert watcher.palette().color(QPalette.ColorRole.Window).name() == theme.DARK.window


def test_theme_changed_emits_the_look_shown(qtbot, app):
    theme.apply_theme(app, "light")
    with qtbot.waitSignal(theme.theme_changed(app)) as emitted:
        theme.apply_theme(app, "dark")
    assert emitted.args == ["dark"]


def test_theme_changed_emits_when_the_system_scheme_changes(qtbot, app, monkeypatch):
    monkeypatch.setattr(theme, "system_prefers_dark", lambda _app: False)
    theme.apply_theme(app, "system")
    monkeypatch.setattr(theme, "system_prefers_dark", lambda _app: True)
    with qtbot.waitSignal(theme.theme_changed(app)) as emitted:
        theme._controller(app)._on_system_scheme_changed(None)
    assert emitted.args == ["dark"]


def test_icons_asked_for_after_a_switch_use_the_new_text_color(app):
    def stroke_colors() -> set[str]:
        image = theme.icon("stop").pixmap(24, 24).toImage()
        return {image.pixelColor(x, y).name() for x in range(24) for y in range(24)
                if image.pixelColor(x, y).alpha() == 255}

    theme.apply_theme(app, "light")
    assert stroke_colors() == {theme.LIGHT.text}
    theme.apply_theme(app, "dark")
    assert stroke_colors() == {theme.DARK.text}
    theme.apply_theme(app, "light")
    assert stroke_colors() == {theme.LIGHT.text}


def test_system_mode_follows_the_system_preference(app, monkeypatch):
    monkeypatch.setattr(theme, "system_prefers_dark", lambda _app: True)
    theme.apply_theme(app, "system")
    assert app.palette().color(QPalette.ColorRole.Window).lightness() < 60
    monkeypatch.setattr(theme, "system_prefers_dark", lambda _app: False)
    theme._controller(app)._on_system_scheme_changed(None)
    assert app.palette().color(QPalette.ColorRole.Window).lightness() > 200


def test_an_explicit_mode_ignores_system_changes(app, monkeypatch):
    theme.apply_theme(app, "light")
    monkeypatch.setattr(theme, "system_prefers_dark", lambda _app: True)
    theme._controller(app)._on_system_scheme_changed(None)
    assert app.palette().color(QPalette.ColorRole.Window).lightness() > 200


def test_system_preference_reads_the_palette_the_app_started_with(app):
    assert theme.system_prefers_dark(app) is False  # offscreen: no scheme, light palette
    theme.apply_theme(app, "dark")
    assert theme.system_prefers_dark(app) is False


def test_cjk_font_joins_the_fallback_families_when_installed(app, monkeypatch):
    monkeypatch.setattr(
        theme.QFontDatabase, "families", staticmethod(lambda: ["DejaVu Sans", "Noto Sans CJK SC"])
    )
    theme.apply_theme(app, "light")
    assert app.font().families()[-1] == "Noto Sans CJK SC"
    theme.apply_theme(app, "dark")
    assert app.font().families().count("Noto Sans CJK SC") == 1


def test_no_cjk_font_is_not_an_error(app, monkeypatch):
    monkeypatch.setattr(theme.QFontDatabase, "families", staticmethod(lambda: ["DejaVu Sans"]))
    families = app.font().families()
    theme.apply_theme(app, "light")
    assert app.font().families() == families


def test_resources_dir_finds_the_source_tree():
    root = theme.resources_dir()
    assert (root / "themes" / "light.qss").is_file()
    assert (root / "pagoda.desktop").is_file()


def test_resources_dir_prefers_a_pyinstaller_bundle(tmp_path, monkeypatch):
    for folder in ("themes", "icons"):
        (tmp_path / "resources" / folder).mkdir(parents=True)
    monkeypatch.setattr(theme.sys, "_MEIPASS", str(tmp_path), raising=False)
    assert theme.resources_dir() == tmp_path / "resources"


@pytest.mark.parametrize("name", REQUIRED_ICONS)
def test_icons_render_in_the_palette_text_color(app, name):
    theme.apply_theme(app, "dark")
    image = theme.icon(name).pixmap(24, 24).toImage()
    text = app.palette().color(QPalette.ColorRole.WindowText)
    colors = {image.pixelColor(x, y).rgb() for x in range(24) for y in range(24)}
    opaque = [c for c in colors if QColor.fromRgba(c).alpha() == 255]
    assert text.rgb() in opaque


def test_icon_takes_an_explicit_color(app):
    image = theme.icon("stop", QColor("#ff0000")).pixmap(24, 24).toImage()
    assert image.pixelColor(12, 12).name() == "#ff0000"


def test_unknown_icon_names_the_problem():
    with pytest.raises(ValueError, match="no-such-icon"):
        theme.icon("no-such-icon")


def test_app_icon_renders(app):
    image = theme.app_icon().pixmap(64, 64).toImage()
    assert not image.isNull()
    assert image.pixelColor(32, 32).alpha() == 255
    assert image.pixelColor(0, 0).alpha() == 0  # rounded corner


def test_desktop_file_has_the_required_keys():
    parser = configparser.ConfigParser(interpolation=None)
    parser.optionxform = str
    parser.read(theme.resources_dir() / "pagoda.desktop", encoding="utf-8")
    entry = parser["Desktop Entry"]
    assert entry["Type"] == "Application"
    assert entry["Name"] == "Pagoda"
    assert entry["Exec"] == "pagoda"
    assert entry["Icon"] == "pagoda"
    assert entry["Categories"] == "Utility;Development;"
    assert entry["Terminal"] == "false"
    assert (theme.resources_dir() / "icons" / f"{entry['Icon']}.svg").is_file()


@pytest.mark.skipif(shutil.which("desktop-file-validate") is None, reason="desktop-file-utils")
def test_desktop_file_passes_desktop_file_validate():
    result = subprocess.run(
        ["desktop-file-validate", str(theme.resources_dir() / "pagoda.desktop")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "error" not in result.stdout


def test_resources_dir_finds_an_installed_wheels_data_files(tmp_path, monkeypatch):
    installed = tmp_path / "share" / "pagoda" / "resources"
    for folder in ("themes", "icons"):
        (installed / folder).mkdir(parents=True)
    monkeypatch.setattr(theme, "__file__", str(tmp_path / "site-packages" / "pagoda" / "app" / "qt" / "shared" / "theme.py"))
    monkeypatch.setattr(theme.sys, "prefix", str(tmp_path))
    assert theme.resources_dir() == installed


def test_missing_resources_name_the_folders_searched(tmp_path, monkeypatch):
    monkeypatch.setattr(theme, "__file__", str(tmp_path / "pagoda" / "app" / "qt" / "shared" / "theme.py"))
    monkeypatch.setattr(theme.sys, "prefix", str(tmp_path))
    monkeypatch.setattr(theme.site, "getuserbase", lambda: str(tmp_path))
    with pytest.raises(theme.ResourcesNotFoundError, match="share/pagoda/resources"):
        theme.resources_dir()


def _luminance(color: QColor) -> float:
    def channel(value: float) -> float:
        return value / 12.92 if value <= 0.04045 else ((value + 0.055) / 1.055) ** 2.4
    return (0.2126 * channel(color.redF()) + 0.7152 * channel(color.greenF())
            + 0.0722 * channel(color.blueF()))


def _contrast(a: QColor, b: QColor) -> float:
    high, low = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (high + 0.05) / (low + 0.05)


def _indicator_contrast(qtbot, checked: bool) -> float:
    """The strongest contrast between the box's own drawing and the panel behind it."""
    box = QCheckBox("Show archived chats")
    box.setChecked(checked)
    qtbot.addWidget(box)
    box.show()
    image = box.grab().toImage()
    option = QStyleOptionButton()
    box.initStyleOption(option)
    rect = box.style().subElementRect(QStyle.SubElement.SE_CheckBoxIndicator, option, box)
    behind = box.palette().color(QPalette.ColorRole.Window)
    return max(_contrast(image.pixelColor(x, y), behind)
               for x in range(rect.left(), rect.right() + 1)
               for y in range(rect.top(), rect.bottom() + 1))


@pytest.mark.parametrize("mode", ["light", "dark"])
@pytest.mark.parametrize("checked", [False, True])
def test_checkboxes_stand_out_from_the_panel(qtbot, app, mode, checked):
    theme.apply_theme(app, mode)

    assert _indicator_contrast(qtbot, checked) >= 3.0  # WCAG's bar for a control's outline
