"""The first start's load is seen where the user looks: above the message box the chat says
which model loads, what the load does and how far it has got; the model picker's entry says
"Loading" until the model is ready, instead of looking ready from the start."""

from __future__ import annotations

import threading

import pytest
from fake_engine import WAIT_MS, FakeEngine
from PySide6.QtWidgets import QProgressBar

from pagoda.app.backends.services.local_engine import LoadProgress
from pagoda.app.components.shared.async_store import AsyncStore
from pagoda.app.qt.chat.chat_tab import SEND_WAITS
from pagoda.app.qt.main_window import MainWindow
from pagoda.app.qt.models.engine_host import EngineHost
from pagoda.app.store import ConversationStore


class SteppedLoad:
    """A factory that reports the model's building 40% done, then waits to be let go."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def __call__(self, model, config, on_progress):
        on_progress(LoadProgress(4, 0.4))
        self.release.wait(WAIT_MS / 1000)
        return FakeEngine(model or "first")


@pytest.fixture
def starting(qloop, qtbot, tmp_path, run_async):
    """starting(model) -> (window, load): a restored window whose first load of `model` (None:
    the bundled one) is under way, held at 40% of the model's building until load.release."""
    made = []

    def start(model: str | None = None):
        load = SteppedLoad()
        window = MainWindow(AsyncStore(ConversationStore.open(tmp_path / "chats.db")),
                            EngineHost(factory=load))
        made.append((window, load))
        qtbot.addWidget(window)
        window.show()
        window.host.load(model)
        run_async(window.restore())
        qtbot.waitUntil(lambda: window.host.status.load.number == 5, timeout=WAIT_MS)
        return window, load

    yield start
    for window, load in made:
        load.release.set()
        window.close()
        window.db.close()


def test_the_empty_chat_says_above_its_message_box_how_the_first_load_goes(starting, qtbot):
    window, load = starting()
    tab = window.tabs.currentWidget()
    text = tab.model_loading_text()
    assert text is not None and text.startswith(f"Loading {window.host.status.model}…")
    # One figure everywhere: the whole load's share, as the bar and the picker show it.
    assert "73%: building the model (step 5 of 6)" in text and text.endswith(SEND_WAITS)
    bar = tab.findChild(QProgressBar, "modelLoadingBar")
    assert bar.isVisible() and 0 < bar.value() < bar.maximum()
    assert tab.composer.send_blocked_reason() is not None
    assert tab.source_label.text() == f"{window.host.status.model} · loading"

    load.release.set()
    qtbot.waitUntil(lambda: window.host.is_ready, timeout=WAIT_MS)
    assert tab.model_loading_text() is None and not bar.isVisible()
    assert tab.composer.send_blocked_reason() is None
    assert tab.source_label.text() == "first · this computer"


def test_the_picker_says_loading_until_the_model_is_ready(starting, qtbot):
    window, load = starting()
    picker = window.model_picker
    assert picker.currentData() == ""  # the bundled model: the one loading
    assert picker.currentText().startswith("Loading 73%: ")  # step 5 of 6, 40% into it

    load.release.set()
    qtbot.waitUntil(lambda: window.host.is_ready, timeout=WAIT_MS)
    assert not picker.currentText().startswith("Loading")
    assert picker.currentData() == ""


def test_the_picker_shows_the_model_the_first_start_loads_not_the_bundled_one(starting,
                                                                              tmp_path):
    chosen = str(tmp_path / "chosen-Q4_K_M.gguf")
    window, _load = starting(chosen)
    picker = window.model_picker
    assert picker.currentData() == chosen
    assert picker.currentText().startswith("Loading 73%: ")
    bundled = picker.findData("")
    assert not picker.itemText(bundled).startswith("Loading")
