"""The engine host: loading off the GUI thread, load progress, failed loads."""

import logging
import threading

from pagoda.app.backends import ModelLoadingError
from pagoda.app.backends.services.local_engine import LOAD_STEPS, LoadProgress
from pagoda.app.components.shared.view_models import LoadStepView
from pagoda.app.qt.models.engine_host import EngineHost


class _FakeBackend:
    def __init__(self, name):
        self.model_name = name
        self.max_model_len = self.usable_context_len = 2048
        self.model_created = 0
        self.stopped = False

    def shutdown(self, timeout=10.0):
        self.stopped = True

    def stats(self):
        raise AssertionError("not polled in these tests")


def test_load_progress_reaches_the_status_while_loading(qloop, qtbot):
    release = threading.Event()

    def factory(model, config, on_progress):
        on_progress(LoadProgress(4, 0.4))
        release.wait(10)
        return _FakeBackend("tiny")

    host = EngineHost(factory=factory)
    assert host.status.load == LoadStepView("starting the engine", 1, len(LOAD_STEPS))
    task = host.load("whatever.gguf")
    assert host.loading_model == "whatever.gguf"
    qtbot.waitUntil(lambda: host.status.load.number == 5, timeout=5000)
    assert host.status.load == LoadStepView("building the model", 5, len(LOAD_STEPS), 0.4)
    assert host.status.state == "loading" and not host.is_ready
    release.set()
    qtbot.waitUntil(task.done, timeout=5000)
    assert host.is_ready and host.status.state == "ready" and host.model_name == "tiny"
    assert host.status.load is None
    host._timer.stop()


def test_a_failed_load_keeps_the_running_model(qloop, qtbot):
    backends = iter([_FakeBackend("first")])

    def factory(model, config, on_progress):
        if model == "bad":
            raise ValueError("bad is not a model")
        return next(backends)

    host = EngineHost(factory=factory)
    qtbot.waitUntil(host.load(None).done, timeout=5000)
    running = host.backend
    with qtbot.waitSignal(host.load_failed, timeout=5000) as failed:
        host.load("bad")
    assert failed.args == ["bad is not a model"]
    assert host.backend is running and not running.engine.stopped
    assert host.status.state == "ready"
    host._timer.stop()


def test_a_failed_first_load_shows_the_error_state(qloop, qtbot):
    def factory(model, config, on_progress):
        raise ValueError("no such file")

    host = EngineHost(factory=factory)
    qtbot.waitUntil(host.load("x").done, timeout=5000)
    assert host.status.state == "error" and "no such file" in host.status.detail
    assert host.backend is None


def _takes_requests(host: EngineHost) -> bool:
    try:
        host.backend_for_new_request()
    except ModelLoadingError:
        return False
    return True


def test_a_load_is_over_when_its_outcome_is_announced(qloop, qtbot):
    def factory(model, config, on_progress):
        if model == "bad":
            raise ValueError("bad is not a model")
        return _FakeBackend("first")

    host = EngineHost(factory=factory)
    seen = []
    host.availability_changed.connect(lambda: seen.append(("changed", _takes_requests(host))))
    host.model_loaded.connect(lambda _name: seen.append(("loaded", _takes_requests(host))))
    host.load_failed.connect(lambda _text: seen.append(("failed", _takes_requests(host))))

    qtbot.waitUntil(host.load(None).done, timeout=5000)
    qtbot.waitUntil(host.load("bad").done, timeout=5000)

    assert seen == [("changed", False), ("changed", True), ("loaded", True),
                    ("changed", False), ("changed", True), ("failed", True)]
    assert not host.is_loading
    host._timer.stop()


def test_each_load_logs_its_own_time_and_only_the_first_the_time_since_start(qloop, qtbot,
                                                                             caplog):
    from pagoda.app.main import log_first_model_ready

    host = EngineHost(factory=lambda model, config, on_progress: _FakeBackend(model or "first"))
    log_first_model_ready(host)
    with caplog.at_level(logging.INFO):
        qtbot.waitUntil(host.load(None).done, timeout=5000)
        qtbot.waitUntil(host.load("second").done, timeout=5000)

    since_start = [r.getMessage() for r in caplog.records if "after start" in r.getMessage()]
    own = [r.getMessage() for r in caplog.records if "after its load began" in r.getMessage()]
    assert len(since_start) == 1 and since_start[0].startswith("model first ready")
    assert [m.split(" ready")[0] for m in own] == ["model first", "model second"]
    host._timer.stop()


def test_the_status_carries_this_processs_memory_before_any_model_loads(qloop, qtbot):
    import psutil

    host = EngineHost(factory=lambda *_: _FakeBackend("unused"))
    qtbot.waitUntil(lambda: host.status.resident_bytes is not None, timeout=5000)
    now = psutil.Process().memory_info().rss  # measured another way
    assert host.backend is None
    assert 0.5 * now < host.status.resident_bytes < 2 * now
    host._timer.stop()
