"""A model file Pagoda does not run, picked in the window, is refused with the reason from its
header alone: the engine is never asked to build it, so no tokenizer or weight is read and the
first load does not wait for the engine's import (seconds) to say so."""

import pytest
from PySide6.QtWidgets import QMessageBox
from tiny_gguf import QType, write_tiny_gguf

from pagoda.app.qt.models.models_controller import GET_MODELS_ITEM


@pytest.fixture(scope="module")
def unrunnable(tmp_path_factory):
    folder = tmp_path_factory.mktemp("unrunnable")
    return {"mixture-of-experts: not yet":
            write_tiny_gguf(folder / "moe.gguf", architecture="deepseek2").path,
            "stored as TQ2_0, which Pagoda cannot read":
            write_tiny_gguf(folder / "tq.gguf", matrix_type=QType.TQ2_0).path}


def _error_box(window) -> QMessageBox | None:
    return next((box for box in window.findChildren(QMessageBox, "modelErrorDialog")
                 if box.isVisible()), None)


@pytest.mark.parametrize("reason", ["mixture-of-experts: not yet",
                                    "stored as TQ2_0, which Pagoda cannot read"])
def test_a_picked_file_pagoda_does_not_run_is_refused_with_the_reason_and_never_built(
        window_on, tmp_path, qtbot, unrunnable, reason):
    window = window_on(tmp_path / "chats.db")
    running = window.host.backend

    window.models_controller.open_model_file(str(unrunnable[reason]))

    qtbot.waitUntil(lambda: _error_box(window) is not None, timeout=10_000)
    assert reason in _error_box(window).text()
    assert str(unrunnable[reason]) not in window.host._factory.built  # the engine never saw it
    assert window.host.backend is running and window.host.is_ready


def test_a_refusal_for_a_model_loaded_from_the_models_dialog_shows_over_that_dialog(
        window_on, tmp_path, qtbot, unrunnable):
    window = window_on(tmp_path / "chats.db")
    window.models_controller.picked(window.model_picker.findData(GET_MODELS_ITEM))
    dialog = window.models_controller.open_model_library()

    dialog._on_load(unrunnable["mixture-of-experts: not yet"])

    qtbot.waitUntil(lambda: _error_box(window) is not None, timeout=10_000)
    assert _error_box(window).parent() is dialog
