"""The Settings dock: this chat's settings above the model's, the local server's and the
appearance, in one scrolling column; new chats' defaults and the theme kept in the store."""

from __future__ import annotations

from PySide6.QtCore import QSize, Qt
from PySide6.QtWidgets import QApplication, QDockWidget, QScrollArea, QVBoxLayout, QWidget

from pagoda.app.components.settings.chat_defaults import load_chat_defaults, save_chat_defaults
from pagoda.app.components.shared.view_models import SamplingView
from pagoda.app.qt.settings.appearance_settings import AppearancePanel
from pagoda.app.qt.settings.settings_panel import SettingsPanel
from pagoda.app.qt.shared.theme import THEMES, apply_theme
from pagoda.app.qt.shared.window_frame import WindowFrame

THEME_SETTING = "theme"


class SettingsDock(QDockWidget):
    """The dock of the window's settings panels (made by the window, shown here): this chat's
    `settings` first, then the panels every chat shares, the `appearance` last."""

    def __init__(self, window: WindowFrame, settings: SettingsPanel, shared: list[QWidget],
                 appearance: AppearancePanel) -> None:
        super().__init__("Settings", window, objectName="settingsDock")
        self.frame = window
        self.chat_settings, self.appearance = settings, appearance
        self.setWidget(_settings_column([settings, *shared, appearance], window))
        settings.settings_changed.connect(lambda s: window.chat_tabs.edit_current_settings(s))
        settings.defaults_requested.connect(lambda s: window.spawn(self.use_as_defaults(s)))
        settings.built_in_defaults_requested.connect(
            lambda: window.spawn(save_chat_defaults(window.db, SamplingView())))
        appearance.theme_changed.connect(self.set_theme)

    def toggle(self) -> None:
        self.setVisible(not self.isVisible())

    async def restore_defaults(self) -> None:
        self.chat_settings.set_defaults(await load_chat_defaults(self.frame.db))

    async def use_as_defaults(self, settings) -> None:
        """New chats start with these settings (the store keeps them); chats keep their own."""
        await save_chat_defaults(self.frame.db, settings)
        self.chat_settings.set_defaults(settings)
        self.frame.status.showMessage("New chats will start with these settings.", 5000)

    async def restore_appearance(self, for_this_run: str | None = None) -> None:
        """The theme chosen in Settings last time, unless the start flag chose one for this run
        (which is not saved)."""
        stored = await self.frame.db.get_setting(THEME_SETTING, "system")
        mode = for_this_run or (stored if stored in THEMES else "system")
        apply_theme(QApplication.instance(), mode)
        self.appearance.set_theme(mode)

    def set_theme(self, mode: str) -> None:
        """The user's pick in Settings: applied at once and kept for the next start."""
        apply_theme(QApplication.instance(), mode)
        self.frame.spawn(self.frame.db.set_setting(THEME_SETTING, mode))


def _settings_column(panels: list[QWidget], parent: QWidget) -> QScrollArea:
    """This chat's settings above the model's and the local server's, which every chat
    shares; they scroll, so that however much they hold (tools, a note after Reset) the
    window keeps fitting the screen."""
    column = QWidget(parent, objectName="settingsColumn")
    layout = QVBoxLayout(column)
    layout.setContentsMargins(0, 0, 0, 0)
    for panel in panels:
        layout.addWidget(panel)
    layout.addStretch(1)
    return _VerticalScroll(column, parent)


class _VerticalScroll(QScrollArea):
    """`content` at the scroll area's width, scrolled up and down: as wide as the content needs
    (never cut on the right), and as low as the window needs (what does not fit scrolls)."""

    def __init__(self, content: QWidget, parent: QWidget) -> None:
        super().__init__(parent, objectName="settingsScroll", widgetResizable=True)
        self.setFrameShape(QScrollArea.Shape.NoFrame)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setWidget(content)

    def _width_for(self, content_width: int) -> int:
        return content_width + self.verticalScrollBar().sizeHint().width() + 2 * self.frameWidth()

    def sizeHint(self) -> QSize:
        return QSize(self._width_for(self.widget().sizeHint().width()), super().sizeHint().height())

    def minimumSizeHint(self) -> QSize:
        return QSize(self._width_for(self.widget().minimumSizeHint().width()),
                     super().minimumSizeHint().height())
