"""The appearance panel shows the theme it is given and forwards the user's pick."""

from __future__ import annotations

import pytest
from PySide6.QtWidgets import QComboBox

from pagoda.app.qt.settings.appearance_settings import AppearancePanel
from pagoda.app.qt.shared.theme import THEMES


@pytest.fixture
def panel(qtbot) -> AppearancePanel:
    widget = AppearancePanel()
    qtbot.addWidget(widget)
    return widget


def picker(panel: AppearancePanel) -> QComboBox:
    return panel.findChild(QComboBox, "themePicker")


def test_picker_offers_every_theme_in_order(panel):
    combo = picker(panel)
    assert [combo.itemText(i) for i in range(combo.count())] == [
        "Follow the system",
        "Light",
        "Dark",
    ]
    assert [combo.itemData(i) for i in range(combo.count())] == list(THEMES)


def test_a_user_pick_emits_the_mode(qtbot, panel):
    combo = picker(panel)
    with qtbot.waitSignal(panel.theme_changed) as emitted:
        combo.activated.emit(combo.findData("dark"))  # what a click on the item sends
    assert emitted.args == ["dark"]


def test_keyboard_pick_emits_the_mode(qtbot, panel):
    panel.show()
    combo = picker(panel)
    combo.setFocus()
    with qtbot.waitSignal(panel.theme_changed) as emitted:
        qtbot.keyClick(combo, "L")
    assert emitted.args == ["light"]
    assert panel.theme() == "light"


def test_set_theme_shows_the_mode_without_emitting(qtbot, panel):
    with qtbot.assertNotEmitted(panel.theme_changed):
        panel.set_theme("dark")
    assert picker(panel).currentText() == "Dark"
    assert panel.theme() == "dark"


def test_set_theme_rejects_an_unknown_mode(panel):
    with pytest.raises(ValueError, match="sepia"):
        panel.set_theme("sepia")


def test_the_theme_picked_in_settings_applies_at_once_and_comes_back(window_on, qtbot,
                                                                     run_async, tmp_path):
    from PySide6.QtWidgets import QApplication

    db_path = tmp_path / "chats.db"
    window = window_on(db_path)
    app = QApplication.instance()
    run_async(window.settings_dock.restore_appearance())
    window.settings_dock.set_theme("dark")
    dark = app.palette().window().color().lightness()
    window.settings_dock.set_theme("light")
    assert app.palette().window().color().lightness() > dark
    window.settings_dock.set_theme("dark")
    qtbot.waitUntil(lambda: window.db.store.get_setting("theme") == "dark", timeout=5000)
    window.close()
    window.db.close()  # as the app does at exit: the next start takes the database's lock

    again = window_on(db_path)
    run_async(again.settings_dock.restore_appearance())
    assert again.appearance_panel.theme() == "dark"
    run_async(again.settings_dock.restore_appearance("light"))  # the start flag, for this run only
    assert again.appearance_panel.theme() == "light"
    assert again.db.store.get_setting("theme") == "dark"
    again.settings_dock.set_theme("system")
