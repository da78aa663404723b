"""Qt tests run offscreen, on one qasync loop that is never stopped (see ../shared/NOTES.md)."""

import asyncio
import gc
import itertools
import os

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")


# A full collection scans every object the session keeps alive (torch, transformers, Qt, the
# model: ~0.7 s each time here). What survives one is frozen out of later collections, so the
# next test's scans only what tests made since; every THAW_EVERY tests the frozen heap is
# collected too, so what it held that has become garbage since is freed, on this thread.
THAW_EVERY = 25
_teardowns = itertools.count(1)


def _collect_garbage_here() -> None:
    if next(_teardowns) % THAW_EVERY == 0:
        gc.unfreeze()
    gc.collect()
    gc.freeze()


@pytest.fixture
def app(qapp):
    """The application, with its look restored after the test so other tests see the default
    (a test may apply a theme)."""
    import shiboken6
    from PySide6.QtGui import QFont, QPalette

    from pagoda.app.qt.shared import theme

    style, palette = qapp.style().name(), QPalette(qapp.palette())
    sheet, font = qapp.styleSheet(), QFont(qapp.font())
    yield qapp
    controller = qapp.findChild(theme._ThemeController, "pagodaThemeController")
    if controller is not None:
        shiboken6.delete(controller)
    qapp.setStyleSheet(sheet)
    qapp.setStyle(style)
    qapp.setPalette(palette)
    qapp.setFont(font)


@pytest.fixture
def tab(qloop, qtbot, tmp_path, run_async):
    """A window with one chat tab on a fake engine that streams what the test says
    (fake_engine.open_tab)."""
    from fake_engine import open_tab

    yield from open_tab(qtbot, tmp_path, run_async)


@pytest.fixture(autouse=True)
def _private_config_dir(tmp_path, monkeypatch):
    """No test reads or writes the user's own config folder (where the API key's digest lives),
    the prefix cache the user's app keeps on disk (a test's engine starts with none), nor the
    user's models folder."""
    monkeypatch.setenv("PAGODA_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("PAGODA_KV_CACHE_DIR", str(tmp_path / "kv-blocks"))
    monkeypatch.setenv("PAGODA_MODELS_DIR", str(tmp_path / "models"))


@pytest.fixture(autouse=True)
def _no_system_keyring(monkeypatch):
    """No test reads or writes the user's keyring: saved servers' keys stay in memory."""
    monkeypatch.setattr("pagoda.app.components.shared.connections._system_keyring", lambda: None)


@pytest.fixture(autouse=True)
def _no_model_read_outlives_its_test(monkeypatch, qapp):
    """Every model picker's reads end with the test that started them, the widgets its teardown
    closed are destroyed then, and so is the garbage it left, on this (the GUI) thread.

    The full suite crashed, rarely, in QTimerInfoList::activateTimers (a core dump's backtrace):
    a timer whose QObject had been destroyed. The likely cause: Python's cyclic GC runs on
    whichever thread allocates when it is due, often a worker parsing a GGUF file's header, so
    a finished test's window wrappers and the parentless EngineHost they hold (its stats QTimer
    a child) could be destroyed on that thread, which Qt does not allow for an object of the
    GUI thread. Collected here, they go on this thread, between tests."""
    from PySide6.QtCore import QCoreApplication, QEvent

    from pagoda.app.components.models.model_choices import ModelChoices

    made: list[ModelChoices] = []
    init = ModelChoices.__init__

    def tracked(self, *args, **kwargs) -> None:
        init(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(ModelChoices, "__init__", tracked)
    yield
    for choices in made:
        choices.close(wait=True)
    QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete.value)
    _collect_garbage_here()


@pytest.fixture(scope="session")
def _session_loop(qapp):
    import qasync

    # Stopping a qasync loop quits the QApplication, and every later waitUntil would time out.
    return qasync.QEventLoop(qapp, already_running=True)


@pytest.fixture
def qloop(_session_loop):
    """The qasync loop, set as the running loop for this test; tests stay synchronous."""
    asyncio.set_event_loop(_session_loop)
    asyncio.events._set_running_loop(_session_loop)
    yield _session_loop
    asyncio.events._set_running_loop(None)


@pytest.fixture
def make_window(qloop, qtbot, tmp_path, make_engine):
    """A MainWindow on a fresh database (or the given one), over the shared default model;
    keyword arguments go to the EngineConfig."""
    from pagoda.app.components.shared.async_store import AsyncStore
    from pagoda.app.qt.main_window import MainWindow
    from pagoda.app.qt.models.engine_host import EngineHost
    from pagoda.app.store import ConversationStore
    from pagoda.engine import AsyncEngine

    windows = []

    def build(db_path=None, load=True, **engine_config):
        def factory(model, _config, _on_progress):
            if model is not None:
                return AsyncEngine(model)
            engine_config.setdefault("num_kv_blocks", 512)
            return AsyncEngine(engine=make_engine(num_threads=1, **engine_config))

        store = ConversationStore.open(db_path or tmp_path / "chats.db")
        window = MainWindow(AsyncStore(store), EngineHost(factory=factory))
        qtbot.addWidget(window)
        window.show()
        if load:
            window.host.load(None)
            qtbot.waitUntil(lambda: window.host.is_ready, timeout=60_000)
        windows.append(window)
        return window

    yield build
    for window in windows:
        if not window.closing:
            window.close()
        window.db.close()


@pytest.fixture
def run_async(qloop, qtbot):
    """run_async(coro) runs it on the qasync loop from a synchronous test and returns its result."""

    def run(coro, timeout=60_000):
        task = asyncio.ensure_future(coro)
        qtbot.waitUntil(task.done, timeout=timeout)
        return task.result()

    return run


@pytest.fixture
def window_on(qtbot, qloop, run_async, tmp_path):
    """window_on(db_path) -> a restored MainWindow over a fake local model (fast: no engine)."""
    from fake_engine import FakeModels

    from pagoda.app.components.shared.async_store import AsyncStore
    from pagoda.app.qt.main_window import MainWindow
    from pagoda.app.qt.models.engine_host import EngineHost
    from pagoda.app.store import ConversationStore

    windows = []

    def build(db_path):
        host = EngineHost(factory=FakeModels())
        window = MainWindow(AsyncStore(ConversationStore.open(db_path)), host)
        qtbot.addWidget(window)
        window.show()
        qtbot.waitUntil(host.load(None).done, timeout=10_000)
        run_async(window.restore())
        windows.append(window)
        return window

    yield build
    for window in windows:
        if not window.isHidden():
            window.close()
        window.db.close()


@pytest.fixture
def make_disk_window(qloop, qtbot, tmp_path, run_async, default_model):
    """make_disk_window() -> a restored MainWindow over a real engine (the default model) that
    keeps its prefix cache on disk (in this test's PAGODA_KV_CACHE_DIR); closed after."""
    from pagoda.app.components.shared.async_store import AsyncStore
    from pagoda.app.qt.main_window import MainWindow
    from pagoda.app.qt.models.engine_host import EngineHost
    from pagoda.app.store import ConversationStore
    from pagoda.engine import AsyncEngine
    from pagoda.engine.config import EngineConfig
    from pagoda.engine.llm_engine import LLMEngine

    def factory(_model, config: EngineConfig, _on_progress):
        config.num_kv_blocks, config.num_threads, config.num_speculative_tokens = 256, 1, 0
        return AsyncEngine(engine=LLMEngine(config=config, loaded=default_model))

    windows = []

    def build():
        window = MainWindow(AsyncStore(ConversationStore.open(tmp_path / "chats.db")),
                            EngineHost(factory=factory))
        windows.append(window)
        qtbot.addWidget(window)
        window.show()
        run_async(window.models_controller.restore_model_settings())
        window.host.load(None)
        qtbot.waitUntil(lambda: window.host.is_ready, timeout=60_000)
        run_async(window.restore())
        return window

    yield build
    for window in windows:
        window.close()
        window.db.close()


@pytest.fixture
def view(qtbot):
    """A transcript on screen, 640 x 480 (the transcript's tests render into it)."""
    from pagoda.app.qt.chat.transcript import TranscriptView

    widget = TranscriptView()
    widget.resize(640, 480)
    qtbot.addWidget(widget)
    widget.show()
    return widget
