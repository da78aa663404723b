"""Tabs that were open while a model loaded can send once it is ready (first start, a switch,
a failed load), and say why they cannot meanwhile. Over the fake models the test gates."""

from __future__ import annotations

import pytest
from fake_engine import WAIT_MS, FakeModels
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QMessageBox, QPlainTextEdit, QPushButton

from pagoda.app.components.shared.async_store import AsyncStore
from pagoda.app.qt.chat.composer import KEPT_NOTE
from pagoda.app.qt.main_window import MainWindow
from pagoda.app.qt.models.engine_host import EngineHost
from pagoda.app.store import ConversationStore


def send_button(window: MainWindow) -> QPushButton:
    return window.tabs.currentWidget().composer.findChild(QPushButton, "sendButton")


def hint(window: MainWindow) -> QLabel:
    return window.tabs.currentWidget().composer.findChild(QLabel, "streamingHint")


def type_and_press_enter(qtbot, window: MainWindow, text: str) -> None:
    box = window.tabs.currentWidget().composer.findChild(QPlainTextEdit, "composer")
    qtbot.keyClicks(box, text)
    qtbot.keyClick(box, Qt.Key.Key_Return)


@pytest.fixture
def unloaded_window(qtbot, qloop, run_async, tmp_path):
    """A restored window whose first load has not started: its factory is `window.models`."""
    windows = []

    def build(models=None) -> MainWindow:
        models = models or FakeModels()
        window = MainWindow(AsyncStore(ConversationStore.open(tmp_path / "chats.db")),
                            EngineHost(factory=models))
        window.models = models
        qtbot.addWidget(window)
        window.show()
        run_async(window.restore())
        windows.append(window)
        return window

    yield build
    for window in windows:
        window.close()
        window.db.close()


def test_a_tab_open_at_first_start_can_send_once_the_model_is_ready(unloaded_window, qtbot):
    window = unloaded_window()
    window.models.gate.clear()
    window.host.load(None)
    assert not send_button(window).isEnabled()
    type_and_press_enter(qtbot, window, "early")
    assert hint(window).isVisible() and "A model is loading" in hint(window).text()

    window.models.gate.set()

    qtbot.waitUntil(lambda: send_button(window).isEnabled(), timeout=WAIT_MS)
    assert not hint(window).isVisible()
    qtbot.keyClick(window.tabs.currentWidget().composer.findChild(QPlainTextEdit, "composer"),
                   Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: bool(window.models.built[None].requests), timeout=WAIT_MS)


def test_a_tab_open_while_the_model_switches_can_send_on_the_new_one(window_on, tmp_path,
                                                                     qtbot):
    window = window_on(tmp_path / "chats.db")
    models = window.host._factory
    models.gate.clear()
    window.models_controller.load_model("second")
    assert not send_button(window).isEnabled()

    models.gate.set()

    # The new model is published before the old one has stopped; the load ends after that.
    qtbot.waitUntil(lambda: window.host.model_name == "second" and not window.host.is_loading,
                    timeout=WAIT_MS)
    assert send_button(window).isEnabled()
    type_and_press_enter(qtbot, window, "hello")
    qtbot.waitUntil(lambda: bool(models.built["second"].requests), timeout=WAIT_MS)
    assert models.built[None].requests == []


class _FailingModels(FakeModels):
    def __call__(self, model, config, on_progress):
        if model == "broken.gguf" or self.fail_all:
            self.gate.wait(WAIT_MS / 1000)
            raise ValueError(f"{model or 'the default model'} is not a model")
        return super().__call__(model, config, on_progress)

    fail_all = False


def test_after_a_failed_switch_the_tab_sends_on_the_model_still_running(window_on, tmp_path,
                                                                        qtbot):
    window = window_on(tmp_path / "chats.db")
    models = _FailingModels()
    window.host._factory = models
    models.gate.clear()
    window.models_controller.load_model("broken.gguf")
    assert not send_button(window).isEnabled()

    models.gate.set()

    qtbot.waitUntil(lambda: window.findChild(QMessageBox, "modelErrorDialog") is not None,
                    timeout=WAIT_MS)
    assert send_button(window).isEnabled()
    assert window.host.model_name == "first"


def test_after_a_failed_first_load_the_tab_says_no_model_is_loaded(unloaded_window, qtbot):
    models = _FailingModels()
    models.fail_all = True
    window = unloaded_window(models)
    models.gate.clear()
    window.host.load(None)
    type_and_press_enter(qtbot, window, "hello")
    assert "A model is loading" in hint(window).text()

    models.gate.set()

    qtbot.waitUntil(lambda: not window.host.is_loading, timeout=WAIT_MS)
    assert not send_button(window).isEnabled()
    assert hint(window).text() == (
        f"No model is loaded: choose one in the model picker. {KEPT_NOTE}")
    assert send_button(window).toolTip().startswith("No model is loaded")
