"""A model opened from a file outside the models folder stays in the model picker after the
window switches away from it and after a restart, and "On this computer" lists it (with the
bundled model) until it is forgotten. Fake engines: nothing is loaded for real."""

from __future__ import annotations

from pathlib import Path

import pytest

from pagoda.app.components.models.local_models import BUNDLED, OUTSIDE
from pagoda.app.components.models.opened_models import OPENED_FILE
from tests.conftest import LIBRARY_FILES

WAIT_MS = 10_000


@pytest.fixture
def elsewhere(tmp_path) -> Path:
    path = tmp_path / "Downloads" / "tiny-Q8_0.gguf"
    path.parent.mkdir()
    path.write_bytes(LIBRARY_FILES["tiny-Q8_0.gguf"])
    return path


def _start(window_on, run_async, tmp_path):
    window = window_on(tmp_path / "chats.db")
    run_async(window.models_controller.restore_model_settings())  # as at start: lists what is on this computer
    return window


def _load(window, qtbot, path: str | None) -> None:
    task = window.host.load(path)
    qtbot.waitUntil(lambda: task.done() and window.host.model_path == path, timeout=WAIT_MS)


def _in_picker(window, path: Path) -> bool:
    return window.model_picker.findData(str(path)) >= 0


def test_a_model_opened_from_a_file_stays_in_the_picker_after_a_switch_and_a_restart(
        window_on, run_async, qtbot, tmp_path, elsewhere):
    window = _start(window_on, run_async, tmp_path)
    window.models_controller.open_model_file(str(elsewhere))
    # The load is over once the old engine has stopped, after model_path names the new one.
    qtbot.waitUntil(lambda: window.host.model_path == str(elsewhere)
                    and not window.host.is_loading, timeout=WAIT_MS)
    _load(window, qtbot, None)  # back to the bundled model

    qtbot.waitUntil(lambda: _in_picker(window, elsewhere), timeout=WAIT_MS)
    window.close()
    window.db.close()  # as the app does at exit: the next start takes the database's lock
    again = _start(window_on, run_async, tmp_path)

    qtbot.waitUntil(lambda: _in_picker(again, elsewhere), timeout=WAIT_MS)
    assert (Path(tmp_path / "config" / OPENED_FILE)).is_file()  # the app's settings, not the db
    assert again.db.store.get_setting("opened_models") is None


def test_on_this_computer_lists_the_bundled_model_and_files_opened_from_elsewhere(
        window_on, run_async, qtbot, tmp_path, elsewhere):
    window = _start(window_on, run_async, tmp_path)
    _load(window, qtbot, str(elsewhere))
    _load(window, qtbot, None)
    panel = window.models_controller.open_model_library().local_panel

    def kinds():
        return {e.path: e.kind for e in panel.library.listing.entries}

    qtbot.waitUntil(lambda: kinds().get(elsewhere) == OUTSIDE, timeout=WAIT_MS)
    assert BUNDLED in kinds().values()
    panel.select(elsewhere)
    panel.forget_selected()

    qtbot.waitUntil(lambda: elsewhere not in kinds(), timeout=WAIT_MS)
    qtbot.waitUntil(lambda: not _in_picker(window, elsewhere), timeout=WAIT_MS)
    assert elsewhere.exists()
